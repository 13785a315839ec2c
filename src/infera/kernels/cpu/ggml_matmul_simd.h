// The AVX2 / AVX-512 path of the ggml block-format matmul (ggml_matmul_impl.h): the same
// values as the generic loops there, bit for bit, computed faster.
//
// Threads take tiles of kTile = 4 weight rows. A tile is decoded once (a SIMD decoder per
// type) into int8 weights, int16 sub-block scales and mins, and f32 block
// scales interleaved by row; then each activation row (int8, quantized once per call) is
// applied to the four rows together, so every activation load serves four rows:
//   - integer products with maddubs (u8 x s8 -> int16 pairs): weights that can be negative
//     go in as |w| against sign(q, w), which is exact (|w| <= 128, |q| <= 127: a pair sum
//     stays below 2^15); unsigned weights (Q4_K, Q5_K, Q2_K, Q4_1, Q5_1) go in directly, and so do
//     Q6_K's, decoded as w + 32 (the kernel subtracts 32 * sum of scale x block sum of the
//     activations, in integers); on AVX-512 VNNI the 32-weight blocks use vpdpbusd;
//   - sub-block scales applied with madd on int16, the block's int32 sums of the four rows
//     reduced together (one hadd tree per block and tile);
//   - the f32 steps per block in one __m128 whose lane t is row t, in the generic path's
//     order and operations (d_w * d_a, then the product with the converted sum, then the
//     add to the running sum), so each lane rounds exactly as the scalar loop does.
//     Q4_1 / Q5_1 (Q8_1 activations) then add min x the activation block's d x sum.
// Integer sums are exact in any order, so the outputs equal the generic path's.
// Prefill: activation rows are taken 64 at a time (they stay in L2 while the thread's tiles
// pass over them; a tile is decoded again per block of 64 rows), and a tile is applied to
// two activation rows at once (each weight load and scale vector serves both). On AVX-512
// VNNI, from vnni::kMinTokens activation rows on, the 16-row tiles of ggml_matmul_vnni.h
// take over (no horizontal sums, 4 activation rows per weight load). A decode step (one
// activation row) of Q8_0, Q4_0, IQ4_NL, Q4_K, Q6_K or IQ4_XS on AVX-512 reads the blocks in
// place (gemv_blocks32, gemv_k, gemv_iq4xs): no tile copy, the weights streamed once.
// Where a panel type comes with its load-time panels (pack_panels), both ISAs compute from
// them instead (ggml_matmul_panels.h: 16 rows per vector, no horizontal sums).
// Included by ggml_matmul_impl.h inside its namespace (after <immintrin.h>), only when
// __AVX2__ is defined.

namespace simd {

constexpr int kTile = 4;
constexpr int64_t kRowBlock = 64;

// Four decoded weight rows.
struct Tile {
  std::vector<int8_t> w;  // [kTile][k]
  std::vector<int16_t> sc, mn;  // [kTile][k / 16] (K types): scale and min per 16 weights
  std::vector<float> d, dmin;  // [blocks][kTile]: row t's block scale at [b * kTile + t]
  std::vector<float> m;  // [blocks][kTile] (Q4_1 / Q5_1): row t's block min
  void resize(int64_t k, int64_t nb, bool k_type) {
    w.resize(static_cast<size_t>(kTile * k));
    d.resize(static_cast<size_t>(kTile * nb));
    dmin.assign(static_cast<size_t>(kTile * nb), 0.0f);
    m.resize(static_cast<size_t>(kTile * nb));
    if (k_type) {
      sc.resize(static_cast<size_t>(kTile * k / 16));
      mn.assign(static_cast<size_t>(kTile * k / 16), 0);
    }
  }
};

// Where the decoders write row t of a tile: w [k], sc / mn [k / 16], d / dmin / m with stride ds
// (the rows of a tile interleaved). pf: the bytes from a block to the same block of the
// next tile's row (0: none); the decoders prefetch it, so the next tile streams in while
// this one is computed.
struct RowOut {
  int8_t* w;
  int16_t* sc;
  int16_t* mn;
  float* d;
  float* dmin;
  float* m;
  int64_t pf;
  int64_t ds = kTile;
};

// Prefetches the cache lines of the `bytes`-byte block at p.
inline void prefetch_block(const uint8_t* p, int bytes) {
  for (int x = 0; x < bytes; x += 64) _mm_prefetch(reinterpret_cast<const char*>(p + x), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + bytes - 1), _MM_HINT_T0);
}

inline __m256i nibbles_lo(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline __m256i nibbles_hi(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
inline __m128i nibbles_lo(__m128i v) { return _mm_and_si128(v, _mm_set1_epi8(0x0F)); }
inline __m128i nibbles_hi(__m128i v) { return _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F)); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
// 32 bits as 32 bytes, 0xFF where the bit is set (byte i: bit i).
inline __m256i bit_bytes(uint32_t m) {
  // Byte i takes byte i / 8 of m and tests bit i % 8 of it.
  const __m256i spread =
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bits = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)), spread);
  return _mm256_cmpeq_epi8(_mm256_and_si256(h, bits), bits);
}
inline void store256(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
inline void store128(void* p, __m128i v) { _mm_storeu_si128(static_cast<__m128i*>(p), v); }
// The sum of 32 int8 quants (exact).
inline int32_t sum32(const int8_t* q) {
  return ymm::hsum(_mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), load256(q)), _mm256_set1_epi16(1)));
}

// f16 -> f32 with F16C (exact, as f16_to_f32).
inline float half_f16c(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return _cvtsh_ss(v);
}

inline void dec_q8_0(const uint8_t* b, int64_t nb, const RowOut& o) {
  for (int64_t i = 0; i < nb; ++i, b += 34) {
    if (o.pf != 0) prefetch_block(b + o.pf, 34);
    o.d[i * o.ds] = half_f16c(b);
    store256(o.w + 32 * i, load256(b + 2));
  }
}

// IQ4_NL: the nibbles looked up in kIq4nlValues.
inline void dec_iq4_nl(const uint8_t* b, int64_t nb, const RowOut& o) {
  const __m128i lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
  for (int64_t i = 0; i < nb; ++i, b += 18) {
    if (o.pf != 0) prefetch_block(b + o.pf, 18);
    o.d[i * o.ds] = half_f16c(b);
    const __m128i v = load128(b + 2);
    store128(o.w + 32 * i, _mm_shuffle_epi8(lut, nibbles_lo(v)));
    store128(o.w + 32 * i + 16, _mm_shuffle_epi8(lut, nibbles_hi(v)));
  }
}

// The 6-bit scales and mins of a Q4_K / Q5_K block (12 packed bytes at p) as int16, one per
// 32-weight sub-block: s16 [sc0..sc7], m16 [mn0..mn7].
inline void k4_scales8(const uint8_t* p, __m128i& s16, __m128i& m16) {
  uint32_t u[3];
  std::memcpy(u, p, 12);
  const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
  // Bytes 0-3: sub-blocks 0-3 (low 6 bits of p[0..3] / p[4..7]); bytes 4-7: sub-blocks 4-7
  // (a nibble of p[8..11] and the top two bits of p[0..3] / p[4..7]).
  const uint64_t scales =
      static_cast<uint64_t>(u[0] & m6) | static_cast<uint64_t>((u[2] & m4) | (((u[0] >> 6) & m2) << 4)) << 32;
  const uint64_t mins =
      static_cast<uint64_t>(u[1] & m6) | static_cast<uint64_t>(((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4)) << 32;
  s16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(scales)));
  m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(mins)));
}

// The same, each written twice (once per 16 weights).
inline void k4_scales(const uint8_t* p, int16_t* sc, int16_t* mn) {
  __m128i s16, m16;
  k4_scales8(p, s16, m16);
  store128(sc, _mm_unpacklo_epi16(s16, s16));
  store128(sc + 8, _mm_unpackhi_epi16(s16, s16));
  store128(mn, _mm_unpacklo_epi16(m16, m16));
  store128(mn + 8, _mm_unpackhi_epi16(m16, m16));
}

// Q4_K (kFive false) and Q5_K: 0..15 / 0..31, unsigned.
template <bool kFive>
inline void dec_q45_k(const uint8_t* b, int64_t nb, const RowOut& o) {
  const int64_t ts = kFive ? 176 : 144;
  for (int64_t i = 0; i < nb; ++i, b += ts) {
    if (o.pf != 0) prefetch_block(b + o.pf, static_cast<int>(ts));
    o.d[i * o.ds] = half_f16c(b);
    o.dmin[i * o.ds] = half_f16c(b + 2);
    k4_scales(b + 4, o.sc + 16 * i, o.mn + 16 * i);
    const uint8_t* qs = b + (kFive ? 48 : 16);
    int8_t* w = o.w + 256 * i;
    const __m256i qh = kFive ? load256(b + 16) : _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i v = load256(qs + 32 * c);
      __m256i lo = nibbles_lo(v), hi = nibbles_hi(v);
      if (kFive) {
        const __m256i m0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
        const __m256i m1 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1)));
        const __m256i bit = _mm256_set1_epi8(0x10);
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m0), m0), bit));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m1), m1), bit));
      }
      store256(w + 64 * c, lo);
      store256(w + 64 * c + 32, hi);
    }
  }
}

// Stores w + 32 (0..63, unsigned: see kOffset in dot_tile_k).
inline void dec_q6_k(const uint8_t* b, int64_t nb, const RowOut& o) {
  const __m256i three = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < nb; ++i, b += 210) {
    if (o.pf != 0) prefetch_block(b + o.pf, 210);
    o.d[i * o.ds] = half_f16c(b + 208);
    const __m256i sc = _mm256_cvtepi8_epi16(load128(b + 192));
    store256(o.sc + 16 * i, sc);
    int8_t* w = o.w + 256 * i;
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = load256(b + 64 * h), l1 = load256(b + 64 * h + 32), hb = load256(b + 128 + 32 * h);
      const __m256i q[4] = {nibbles_lo(l0), nibbles_lo(l1), nibbles_hi(l0), nibbles_hi(l1)};
      for (int g = 0; g < 4; ++g) {
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), three);
        const __m256i v = _mm256_or_si256(q[g], _mm256_slli_epi16(high, 4));
        store256(w + 128 * h + 32 * g, v);
      }
    }
  }
}

inline void dec_iq4_xs(const uint8_t* b, int64_t nb, const RowOut& o) {
  const __m128i lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
  for (int64_t i = 0; i < nb; ++i, b += 136) {
    if (o.pf != 0) prefetch_block(b + o.pf, 136);
    o.d[i * o.ds] = half_f16c(b);
    uint16_t sh;
    std::memcpy(&sh, b + 2, 2);
    int8_t* w = o.w + 256 * i;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
      o.sc[16 * i + 2 * ib] = o.sc[16 * i + 2 * ib + 1] = static_cast<int16_t>(ls - 32);
      const __m128i v = load128(b + 8 + 16 * ib);
      store128(w + 32 * ib, _mm_shuffle_epi8(lut, nibbles_lo(v)));
      store128(w + 32 * ib + 16, _mm_shuffle_epi8(lut, nibbles_hi(v)));
    }
  }
}

// Q4_1 / Q5_1 (kOne) and Q4_0 / Q5_0: the nibbles (weight j the low one of byte j, j + 16
// its high one), with Q5_*'s fifth bits from qh (bit j: weight j); Q4_0 / Q5_0 minus 8 / 16,
// Q4_1 / Q5_1 unsigned with their min.
template <bool kFive, bool kOne>
inline void dec_q45(const uint8_t* b, int64_t nb, const RowOut& o) {
  constexpr int kBytes = 2 + (kOne ? 2 : 0) + (kFive ? 4 : 0) + 16, kQs = kBytes - 16;
  for (int64_t i = 0; i < nb; ++i, b += kBytes) {
    if (o.pf != 0) prefetch_block(b + o.pf, kBytes);
    o.d[i * o.ds] = half_f16c(b);
    if (kOne) o.m[i * o.ds] = half_f16c(b + 2);
    const __m128i v = load128(b + kQs);
    __m256i w = _mm256_set_m128i(nibbles_hi(v), nibbles_lo(v));
    if (kFive) {
      uint32_t qh;
      std::memcpy(&qh, b + kQs - 4, 4);
      w = _mm256_or_si256(w, _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(0x10)));
    }
    if (!kOne) w = _mm256_sub_epi8(w, _mm256_set1_epi8(kFive ? 16 : 8));
    store256(o.w + 32 * i, w);
  }
}

// Q2_K: weight 128 h + 32 s + l is bits 2s, 2s + 1 of qs[32 h + l] (0..3, unsigned); sub-block
// g's scale is the low nibble of byte g, its min the high one.
inline void dec_q2_k(const uint8_t* b, int64_t nb, const RowOut& o) {
  const __m256i three = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < nb; ++i, b += 84) {
    if (o.pf != 0) prefetch_block(b + o.pf, 84);
    o.d[i * o.ds] = half_f16c(b + 80);
    o.dmin[i * o.ds] = half_f16c(b + 82);
    const __m128i sm = load128(b);
    store256(o.sc + 16 * i, _mm256_cvtepu8_epi16(nibbles_lo(sm)));
    store256(o.mn + 16 * i, _mm256_cvtepu8_epi16(nibbles_hi(sm)));
    int8_t* w = o.w + 256 * i;
    for (int h = 0; h < 2; ++h) {
      const __m256i v = load256(b + 16 + 32 * h);
      for (int s = 0; s < 4; ++s) store256(w + 128 * h + 32 * s, _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), three));
    }
  }
}

// Q3_K: weight 128 h + 32 s + l is bits 2s, 2s + 1 of qs[32 h + l], minus 4 where bit 4h + s
// of hmask[l] is clear; the sixteen 6-bit scales (minus 32) as Q3_K packs them: the low
// nibbles in bytes 0-7 (sub-blocks 0-7 low, 8-15 high), the top two bits in bytes 8-11.
inline void dec_q3_k(const uint8_t* b, int64_t nb, const RowOut& o) {
  const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
  for (int64_t i = 0; i < nb; ++i, b += 110) {
    if (o.pf != 0) prefetch_block(b + o.pf, 110);
    o.d[i * o.ds] = half_f16c(b + 108);
    uint32_t u[3];
    std::memcpy(u, b + 96, 12);
    const uint32_t lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
    // Word j holds the scales of sub-blocks 4j .. 4j + 3.
    const uint32_t sw[4] = {(u[0] & lo4) | ((u[2] & lo2) << 4), (u[1] & lo4) | (((u[2] >> 2) & lo2) << 4),
                            ((u[0] >> 4) & lo4) | (((u[2] >> 4) & lo2) << 4),
                            ((u[1] >> 4) & lo4) | (((u[2] >> 6) & lo2) << 4)};
    const __m128i s8 = _mm_sub_epi8(_mm_setr_epi32(static_cast<int>(sw[0]), static_cast<int>(sw[1]),
                                                   static_cast<int>(sw[2]), static_cast<int>(sw[3])),
                                    _mm_set1_epi8(32));
    store256(o.sc + 16 * i, _mm256_cvtepi8_epi16(s8));
    const __m256i hm = load256(b);
    int8_t* w = o.w + 256 * i;
    for (int h = 0; h < 2; ++h) {
      const __m256i v = load256(b + 32 + 32 * h);
      for (int s = 0; s < 4; ++s) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << (4 * h + s)));
        const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
        const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), three);
        store256(w + 128 * h + 32 * s, _mm256_sub_epi8(q2, _mm256_and_si256(clear, four)));
      }
    }
  }
}

inline void decode_into(uint32_t type, const uint8_t* b, int64_t k, const RowOut& o) {
  switch (type) {
    case kQ8_0: dec_q8_0(b, k / 32, o); return;
    case kQ4_0: dec_q45<false, false>(b, k / 32, o); return;
    case kIQ4_NL: dec_iq4_nl(b, k / 32, o); return;
    case kQ4_K: dec_q45_k<false>(b, k / 256, o); return;
    case kQ5_K: dec_q45_k<true>(b, k / 256, o); return;
    case kQ6_K: dec_q6_k(b, k / 256, o); return;
    case kIQ4_XS: dec_iq4_xs(b, k / 256, o); return;
    case kQ5_0: dec_q45<true, false>(b, k / 32, o); return;
    case kQ4_1: dec_q45<false, true>(b, k / 32, o); return;
    case kQ5_1: dec_q45<true, true>(b, k / 32, o); return;
    case kQ2_K: dec_q2_k(b, k / 256, o); return;
    case kQ3_K: dec_q3_k(b, k / 256, o); return;
    default: return;  // (none other: matmul_rows admits only the types has_matmul names)
  }
}

inline bool has_mins(uint32_t type) { return type == kQ4_K || type == kQ5_K || type == kQ2_K; }
// What the decoder added to every weight to make it unsigned (the kernel takes it back out).
inline int weight_offset(uint32_t type) { return type == kQ6_K ? 32 : 0; }

// 16 int16 pair sums of w x q (32 bytes each).
template <bool kUnsigned>
inline __m256i pair_products(__m256i w, __m256i q) {
  if (kUnsigned) return _mm256_maddubs_epi16(w, q);
  return _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(q, w));
}

// [sum(a0), sum(a1), sum(a2), sum(a3)] of four int32 x 8 vectors.
inline __m128i reduce4(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

inline void store_outputs(__m128 v, float* y, int rows) {
  if (rows == kTile) {
    _mm_storeu_ps(y, v);
    return;
  }
  alignas(16) float tmp[kTile];
  _mm_store_ps(tmp, v);
  for (int t = 0; t < rows; ++t) y[t] = tmp[t];
}

// One activation row's operands: its int8 quants, block scales and (Q8_K) int16 sums of 16.
struct ActRow {
  const int8_t* q;
  const float* d;
  const int16_t* bsums;
  const float* s;  // Q8_1: the blocks' d x sum of quants
};

// Q4_1 / Q5_1's second step of block b: sum + m_w x s_a (one lane per row).
inline __m128 min_step(const Tile& tl, int64_t b, const ActRow& a, __m128 sum) {
  return _mm_add_ps(sum, _mm_mul_ps(_mm_loadu_ps(tl.m.data() + kTile * b), _mm_set1_ps(a.s[b])));
}

#ifdef __AVX512BW__
// Four rows' int32 x 16 sums over two 32-weight blocks (lanes 0-7: block b, 8-15: b + 1) ->
// [row 0..3] of block b in i0, of block b + 1 in i1.
// kInterleaved: quarters 0 and 2 hold block b, 1 and 3 block b + 1 (else 0-1 and 2-3).
template <bool kInterleaved = false>
inline void reduce4x2(const __m512i* r, __m128i& i0, __m128i& i1) {
  // Per 128-bit quarter: [row 0, row 1, row 2, row 3] sums of its four lanes.
  const __m512i x01 = _mm512_add_epi32(_mm512_unpacklo_epi32(r[0], r[1]), _mm512_unpackhi_epi32(r[0], r[1]));
  const __m512i x23 = _mm512_add_epi32(_mm512_unpacklo_epi32(r[2], r[3]), _mm512_unpackhi_epi32(r[2], r[3]));
  const __m512i y = _mm512_add_epi32(_mm512_unpacklo_epi64(x01, x23), _mm512_unpackhi_epi64(x01, x23));
  if (kInterleaved) {
    const __m512i z = _mm512_add_epi32(y, _mm512_shuffle_i64x2(y, y, _MM_SHUFFLE(1, 0, 3, 2)));
    i0 = _mm512_castsi512_si128(z);
    i1 = _mm512_extracti32x4_epi32(z, 1);
    return;
  }
  const __m512i z = _mm512_add_epi32(y, _mm512_shuffle_i64x2(y, y, _MM_SHUFFLE(2, 3, 0, 1)));
  i0 = _mm512_castsi512_si128(z);
  i1 = _mm512_extracti32x4_epi32(z, 2);
}
#endif

// Q8_0-form types (32-weight blocks): tile x kNt activation rows (two in prefill: the
// weight loads serve both, and their two f32 accumulation chains run side by side).
// kMin (Q4_1 / Q5_1, Q8_1-form activations): each block then adds min x the activation
// block's d x sum, as the generic loop does.
template <int kNt, bool kUnsigned, bool kMin>
inline void dot_tile_32(const Tile& tl, int64_t k, const ActRow* a, __m128* out) {
  const int8_t* w = tl.w.data();
  __m128 sum[kNt];
  for (int n = 0; n < kNt; ++n) sum[n] = _mm_setzero_ps();
#ifndef __AVX512VNNI__
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  int64_t b = 0;
#ifdef __AVX512BW__
  // Two blocks per 512-bit vector; the four rows' sums of each block reduced together.
  for (; b + 2 <= k / 32; b += 2) {
    __m512i qv[kNt];
    for (int n = 0; n < kNt; ++n) qv[n] = _mm512_loadu_si512(a[n].q + 32 * b);
    __m512i acc[kNt][kTile];
    for (int t = 0; t < kTile; ++t) {
      const __m512i wv = _mm512_loadu_si512(w + t * k + 32 * b);
      const __m512i wu = kUnsigned ? wv : _mm512_abs_epi8(wv);
      const __mmask64 neg = _mm512_movepi8_mask(wv);
      for (int n = 0; n < kNt; ++n) {
        const __m512i qs = kUnsigned ? qv[n] : _mm512_mask_sub_epi8(qv[n], neg, _mm512_setzero_si512(), qv[n]);
#ifdef __AVX512VNNI__
        acc[n][t] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wu, qs);
#else
        acc[n][t] = _mm512_madd_epi16(_mm512_maddubs_epi16(wu, qs), _mm512_set1_epi16(1));
#endif
      }
    }
    for (int n = 0; n < kNt; ++n) {
      __m128i isum0, isum1;
      reduce4x2(acc[n], isum0, isum1);
      const __m128 d0 = _mm_mul_ps(_mm_loadu_ps(tl.d.data() + kTile * b), _mm_set1_ps(a[n].d[b]));
      sum[n] = _mm_add_ps(sum[n], _mm_mul_ps(_mm_cvtepi32_ps(isum0), d0));
      if (kMin) sum[n] = min_step(tl, b, a[n], sum[n]);
      const __m128 d1 = _mm_mul_ps(_mm_loadu_ps(tl.d.data() + kTile * (b + 1)), _mm_set1_ps(a[n].d[b + 1]));
      sum[n] = _mm_add_ps(sum[n], _mm_mul_ps(_mm_cvtepi32_ps(isum1), d1));
      if (kMin) sum[n] = min_step(tl, b + 1, a[n], sum[n]);
    }
  }
#endif
  for (; b < k / 32; ++b) {
    __m256i qv[kNt];
    for (int n = 0; n < kNt; ++n) qv[n] = load256(a[n].q + 32 * b);
    __m256i acc[kNt][kTile];
    for (int t = 0; t < kTile; ++t) {
      const __m256i wv = load256(w + t * k + 32 * b);
      for (int n = 0; n < kNt; ++n) {
#ifdef __AVX512VNNI__
        const __m256i wu = kUnsigned ? wv : _mm256_abs_epi8(wv);
        const __m256i qs = kUnsigned ? qv[n] : _mm256_sign_epi8(qv[n], wv);
        acc[n][t] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu, qs);
#else
        acc[n][t] = _mm256_madd_epi16(pair_products<kUnsigned>(wv, qv[n]), ones);
#endif
      }
    }
    for (int n = 0; n < kNt; ++n) {
      const __m128i isum = reduce4(acc[n][0], acc[n][1], acc[n][2], acc[n][3]);
      const __m128 d = _mm_mul_ps(_mm_loadu_ps(tl.d.data() + kTile * b), _mm_set1_ps(a[n].d[b]));
      sum[n] = _mm_add_ps(sum[n], _mm_mul_ps(_mm_cvtepi32_ps(isum), d));
      if (kMin) sum[n] = min_step(tl, b, a[n], sum[n]);
    }
  }
  for (int n = 0; n < kNt; ++n) out[n] = sum[n];
}

// The end of super-block b for one activation row, on the tile's four integer sums
// isum: the offset taken back out, the mins' sum, then the f32 steps (one lane per row):
// sum + (d_w d_a isum - dmin_w d_a msum), as the generic loop computes it.
template <bool kMins, int kOffset>
inline __m128 k_block_step(const Tile& tl, int64_t ng, int64_t b, const ActRow& a, __m128i isum, __m128 sum) {
  __m128i msum = _mm_setzero_si128();
  if (kMins || kOffset != 0) {
    const __m256i bs = load256(a.bsums + 16 * b);
    __m256i mm[kTile];
    if (kOffset != 0) {
      for (int t = 0; t < kTile; ++t) mm[t] = _mm256_madd_epi16(load256(tl.sc.data() + t * ng + 16 * b), bs);
      isum = _mm_sub_epi32(isum, _mm_mullo_epi32(reduce4(mm[0], mm[1], mm[2], mm[3]), _mm_set1_epi32(kOffset)));
    }
    if (kMins) {
      for (int t = 0; t < kTile; ++t) mm[t] = _mm256_madd_epi16(load256(tl.mn.data() + t * ng + 16 * b), bs);
      msum = reduce4(mm[0], mm[1], mm[2], mm[3]);
    }
  }
  const __m128 adb = _mm_set1_ps(a.d[b]);
  const __m128 d = _mm_mul_ps(_mm_loadu_ps(tl.d.data() + kTile * b), adb);
  const __m128 dmin = _mm_mul_ps(_mm_loadu_ps(tl.dmin.data() + kTile * b), adb);
  return _mm_add_ps(sum, _mm_sub_ps(_mm_mul_ps(d, _mm_cvtepi32_ps(isum)), _mm_mul_ps(dmin, _mm_cvtepi32_ps(msum))));
}

// Q8_K-form types (256-weight super-blocks with scales per 16 weights): tile x kNt
// activation rows (the weight loads and scale vectors serve all of them). kOffset: the
// decoder stored w + kOffset; the integer sum takes back kOffset * sum_g sc[g] * bsum[g]
// (exact, before any f32 step).
template <int kNt, bool kUnsigned, bool kPer32, bool kMins, int kOffset>
inline void dot_tile_k(const Tile& tl, int64_t k, const ActRow* a, __m128* out) {
  const int8_t* w = tl.w.data();
  const int64_t ng = k / 16;
  __m128 sum[kNt];
  for (int n = 0; n < kNt; ++n) sum[n] = _mm_setzero_ps();
  // Per-16 scales: lanes 0-7 take the chunk's first scale, lanes 8-15 its second.
  const __m256i pick =
      _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  for (int64_t b = 0; b < k / 256; ++b) {
    __m256i acc[kNt][kTile];
    for (int n = 0; n < kNt; ++n)
      for (int t = 0; t < kTile; ++t) acc[n][t] = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      __m256i qv[kNt];
      for (int n = 0; n < kNt; ++n) qv[n] = load256(a[n].q + 256 * b + 32 * c);
      for (int t = 0; t < kTile; ++t) {
        const __m256i wv = load256(w + t * k + 256 * b + 32 * c);
        const int16_t* sc = tl.sc.data() + t * ng + 16 * b;
        const __m256i scv =
            kPer32 ? _mm256_set1_epi16(sc[2 * c])
                   : _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(load256(sc), _mm256_set1_epi32(c)), pick);
        for (int n = 0; n < kNt; ++n)
          acc[n][t] = _mm256_add_epi32(acc[n][t], _mm256_madd_epi16(pair_products<kUnsigned>(wv, qv[n]), scv));
      }
    }
    for (int n = 0; n < kNt; ++n)
      sum[n] =
          k_block_step<kMins, kOffset>(tl, ng, b, a[n], reduce4(acc[n][0], acc[n][1], acc[n][2], acc[n][3]), sum[n]);
  }
  for (int n = 0; n < kNt; ++n) out[n] = sum[n];
}

#ifdef __AVX512BW__
// The same on 512-bit vectors (64 weights, two 32-weight chunks, per instruction); the
// integer sums are the same, so are the results.
template <bool kUnsigned>
inline __m512i pair_products512(__m512i w, __m512i q) {
  if (kUnsigned) return _mm512_maddubs_epi16(w, q);
  // sign(q, w): -q where w < 0 (where w == 0, |w| = 0 zeroes the product anyway).
  const __m512i qs = _mm512_mask_sub_epi8(q, _mm512_movepi8_mask(w), _mm512_setzero_si512(), q);
  return _mm512_maddubs_epi16(_mm512_abs_epi8(w), qs);
}

template <int kNt, bool kUnsigned, bool kMins, int kOffset>
inline void dot_tile_k512(const Tile& tl, int64_t k, const ActRow* a, __m128* out) {
  const int8_t* w = tl.w.data();
  const int64_t ng = k / 16;
  __m128 sum[kNt];
  for (int n = 0; n < kNt; ++n) sum[n] = _mm_setzero_ps();
  // Pair-sum lane L of 64-weight chunk cc has the scale of weights 64 cc + 2 L: sc[4 cc + L / 8].
  __m512i pick[4];
  for (int cc = 0; cc < 4; ++cc) {
    alignas(64) int16_t idx[32];
    for (int l = 0; l < 32; ++l) idx[l] = static_cast<int16_t>(4 * cc + l / 8);
    pick[cc] = _mm512_load_si512(idx);
  }
  for (int64_t b = 0; b < k / 256; ++b) {
    __m512i acc[kNt][kTile];
    __m512i scb[kTile];
    for (int t = 0; t < kTile; ++t) scb[t] = _mm512_castsi256_si512(load256(tl.sc.data() + t * ng + 16 * b));
    for (int n = 0; n < kNt; ++n)
      for (int t = 0; t < kTile; ++t) acc[n][t] = _mm512_setzero_si512();
    for (int cc = 0; cc < 4; ++cc) {
      __m512i qv[kNt];
      for (int n = 0; n < kNt; ++n) qv[n] = _mm512_loadu_si512(a[n].q + 256 * b + 64 * cc);
      for (int t = 0; t < kTile; ++t) {
        const __m512i wv = _mm512_loadu_si512(w + t * k + 256 * b + 64 * cc);
        const __m512i scv = _mm512_permutexvar_epi16(pick[cc], scb[t]);
        for (int n = 0; n < kNt; ++n)
          acc[n][t] = _mm512_add_epi32(acc[n][t], _mm512_madd_epi16(pair_products512<kUnsigned>(wv, qv[n]), scv));
      }
    }
    for (int n = 0; n < kNt; ++n) {
      __m256i half[kTile];
      for (int t = 0; t < kTile; ++t)
        half[t] = _mm256_add_epi32(_mm512_castsi512_si256(acc[n][t]), _mm512_extracti64x4_epi64(acc[n][t], 1));
      sum[n] = k_block_step<kMins, kOffset>(tl, ng, b, a[n], reduce4(half[0], half[1], half[2], half[3]), sum[n]);
    }
  }
  for (int n = 0; n < kNt; ++n) out[n] = sum[n];
}
#endif

// A tile against kNt activation rows (1, or 2 in prefill).
using DotFn = void (*)(const Tile&, int64_t, const ActRow*, __m128*);

template <int kNt, bool kUnsigned, bool kMin>
void dot32_fn(const Tile& tl, int64_t k, const ActRow* a, __m128* out) {
  dot_tile_32<kNt, kUnsigned, kMin>(tl, k, a, out);
}
template <int kNt, bool kUnsigned, bool kPer32, bool kMins, int kOffset>
void dotk_fn(const Tile& tl, int64_t k, const ActRow* a, __m128* out) {
#ifdef __AVX512BW__
  dot_tile_k512<kNt, kUnsigned, kMins, kOffset>(tl, k, a, out);
#else
  dot_tile_k<kNt, kUnsigned, kPer32, kMins, kOffset>(tl, k, a, out);
#endif
}

template <int kNt>
inline DotFn dotk_for(uint32_t type) {
  if (type == kQ4_K || type == kQ5_K) return dotk_fn<kNt, true, true, true, 0>;
  if (type == kQ2_K) return dotk_fn<kNt, true, false, true, 0>;
  if (type == kQ6_K) return dotk_fn<kNt, true, false, false, 32>;
  if (type == kIQ4_XS) return dotk_fn<kNt, false, true, false, 0>;
  return dotk_fn<kNt, false, false, false, 0>;  // Q3_K
}

template <int kNt>
inline DotFn dot32_for(uint32_t type) {
  if (type == kQ4_1 || type == kQ5_1) return dot32_fn<kNt, true, true>;
  return dot32_fn<kNt, false, false>;
}

#ifdef __AVX512BW__
// How far ahead a decode step prefetches: at least this many bytes of weights, in whole
// tiles. A tile of short rows is read in less time than a DRAM access takes (four rows of
// 2048 Q4_K weights are 4.6 KB, about 0.2 us at 25 GB/s), so the next tile alone came too
// late: 2048-wide Q4_K rows streamed at 16 GB/s per CPU second where 5632-wide ones (12.7
// KB tiles) reached 20.
constexpr int64_t kPrefetchBytes = 16384;

// The decode steps' loop: threads take tiles of kTile rows of [n0, n1); fn(r, j0, rows, pf)
// gets the tile's row pointers (past the last row: copies of it), its first row, how many
// of its rows are real, and the distance in bytes from a block of the tile to the same
// block of the tile to prefetch (0: none, past n1).
template <typename Fn>
inline void for_each_row_tile(const uint8_t* base, int64_t row_bytes, int64_t n0, int64_t n1, const Fn& fn) {
  const int64_t tiles = (n1 - n0 + kTile - 1) / kTile;
  const int64_t ahead = std::max<int64_t>(1, (kPrefetchBytes + kTile * row_bytes - 1) / (kTile * row_bytes));
  const int threads = omp_in_parallel() ? 1 : num_threads();
  parallel_region(static_cast<int>(std::min<int64_t>(threads, tiles)), [&] {
#pragma omp for schedule(static)
    for (int64_t tt = 0; tt < tiles; ++tt) {
      const int64_t j0 = n0 + tt * kTile;
      const uint8_t* r[kTile];
      for (int t = 0; t < kTile; ++t) r[t] = base + std::min(j0 + t, n1 - 1) * row_bytes;
      fn(r, j0, static_cast<int>(std::min<int64_t>(kTile, n1 - j0)),
         j0 + ahead * kTile < n1 ? ahead * kTile * row_bytes : 0);
    }
  });
}
#endif

#ifdef __AVX512VNNI__
#include "infera/kernels/cpu/ggml_matmul_vnni.h"
#endif
#include "infera/kernels/cpu/ggml_matmul_panels.h"

#ifdef __AVX512VNNI__

// One activation row against 32-weight-block rows read in place (a decode step): no tile
// copy; four rows at a time, two blocks per 512-bit vector, the weights made unsigned so
// that vpdpbusd takes them with the activation quants as they are, and offset x the
// activation's block sum taken back out of each block's integer sum. Q8_0: the byte xor
// 0x80 (w + 128); Q4_0: the nibbles themselves (w + 8; low nibbles weights 0-15, high
// 16-31); IQ4_NL: the nibbles looked up in kIq4nlValues (vpshufb), then xor 0x80. The f32
// steps per block as the generic loop's, one lane per row.
template <uint32_t kType>
inline void gemv_blocks32(const uint8_t* base, int64_t row_bytes, int64_t k, const Activations& a, int64_t n0,
                          int64_t n1, float* y) {
  static_assert(kType == kQ8_0 || kType == kQ4_0 || kType == kIQ4_NL);
  constexpr int kBytes = kType == kQ8_0 ? 34 : 18, kOffset = kType == kQ4_0 ? 8 : 128;
  const int64_t nb = k / 32;
  static thread_local std::vector<int32_t> corr;
  corr.resize(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) corr[b] = kOffset * sum32(a.q.data() + 32 * b);
  const int32_t* cp = corr.data();
  const int8_t* q = a.q.data();
  if constexpr (kType != kQ8_0) {
    // Pairs of blocks as the 4-bit types' pair vectors hold them (below): [b 0-15, b + 1
    // 0-15, b 16-31, b + 1 16-31]; a last odd block in order.
    static thread_local std::vector<int8_t> qperm;
    qperm.resize(static_cast<size_t>(k));
    for (int64_t b = 0; b + 2 <= nb; b += 2)
      for (int c = 0; c < 4; ++c)
        std::memcpy(qperm.data() + 32 * b + 16 * c, a.q.data() + 32 * (b + c % 2) + 16 * (c / 2), 16);
    if (nb % 2 != 0) std::memcpy(qperm.data() + 32 * (nb - 1), a.q.data() + 32 * (nb - 1), 32);
    q = qperm.data();
  }
  const float* ad = a.d.data();
  // A block's 32 weights, unsigned, in order (one 256-bit half).
  const auto weights = [](const uint8_t* p) {
    if constexpr (kType == kQ8_0) {
      return _mm256_xor_si256(load256(p + 2), _mm256_set1_epi8(static_cast<char>(0x80)));
    } else {
      const __m128i v = load128(p + 2), m4 = _mm_set1_epi8(0x0F);
      const __m256i n = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
      if constexpr (kType == kQ4_0) return n;
      const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
      return _mm256_xor_si256(_mm256_shuffle_epi8(lut, n), _mm256_set1_epi8(static_cast<char>(0x80)));
    }
  };
  // Blocks b and b + 1 (at p and p + kBytes) as one vector: Q8_0 in order; the 4-bit types'
  // nibbles of both split at once, [b 0-15, b + 1 0-15, b 16-31, b + 1 16-31].
  const auto pair = [&weights](const uint8_t* p) {
    if constexpr (kType == kQ8_0) {
      return _mm512_inserti64x4(_mm512_castsi256_si512(weights(p)), weights(p + kBytes), 1);
    } else {
      const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(p + 2)), load128(p + kBytes + 2), 1);
      const __m256i m4 = _mm256_set1_epi8(0x0F);
      const __m512i n = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m4)),
                                           _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), 1);
      if constexpr (kType == kQ4_0) return n;
      const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
      return _mm512_xor_si512(_mm512_shuffle_epi8(lut, n), _mm512_set1_epi8(static_cast<char>(0x80)));
    }
  };
  const auto half = [](const uint8_t* p) { return static_cast<int16_t>(p[0] | p[1] << 8); };
  for_each_row_tile(base, row_bytes, n0, n1, [&](const uint8_t* const* r, int64_t j0, int rows, int64_t pf) {
    __m128 sum = _mm_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      const __m512i qv = _mm512_loadu_si512(q + 32 * b);
      __m512i acc[kTile];
      for (int t = 0; t < kTile; ++t) {
        const uint8_t* p = r[t] + kBytes * b;
        if (pf != 0) prefetch_block(p + pf, 2 * kBytes);
        acc[t] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pair(p), qv);
      }
      __m128i isum0, isum1;
      reduce4x2<kType != kQ8_0>(acc, isum0, isum1);
      isum0 = _mm_sub_epi32(isum0, _mm_set1_epi32(cp[b]));
      isum1 = _mm_sub_epi32(isum1, _mm_set1_epi32(cp[b + 1]));
      const int64_t o = kBytes * b;
      const __m128i h =
          _mm_setr_epi16(half(r[0] + o), half(r[1] + o), half(r[2] + o), half(r[3] + o), half(r[0] + o + kBytes),
                         half(r[1] + o + kBytes), half(r[2] + o + kBytes), half(r[3] + o + kBytes));
      const __m256 dw = _mm256_cvtph_ps(h);  // exact, as half_f16c
      const __m128 d0 = _mm_mul_ps(_mm256_castps256_ps128(dw), _mm_set1_ps(ad[b]));
      sum = _mm_add_ps(sum, _mm_mul_ps(_mm_cvtepi32_ps(isum0), d0));
      const __m128 d1 = _mm_mul_ps(_mm256_extractf128_ps(dw, 1), _mm_set1_ps(ad[b + 1]));
      sum = _mm_add_ps(sum, _mm_mul_ps(_mm_cvtepi32_ps(isum1), d1));
    }
    for (; b < nb; ++b) {
      const __m256i qv = load256(q + 32 * b);
      __m256i acc[kTile];
      alignas(16) float dws[kTile];
      for (int t = 0; t < kTile; ++t) {
        const uint8_t* p = r[t] + kBytes * b;
        acc[t] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), weights(p), qv);
        dws[t] = half_f16c(p);
      }
      const __m128i isum = _mm_sub_epi32(reduce4(acc[0], acc[1], acc[2], acc[3]), _mm_set1_epi32(cp[b]));
      const __m128 d = _mm_mul_ps(_mm_load_ps(dws), _mm_set1_ps(ad[b]));
      sum = _mm_add_ps(sum, _mm_mul_ps(_mm_cvtepi32_ps(isum), d));
    }
    store_outputs(sum, y + (j0 - n0), rows);
  });
}
#endif

#ifdef __AVX512BW__
// One activation row against Q4_K (kSix false) or Q6_K rows read in place (a decode step):
// no tile copy, four rows at a time, 64 weights per 512-bit vector straight from the
// block's bytes, so the weights stream from memory once with a few operations per vector.
// The activation's quants are put once per call in the order the weights come out of a
// vector (Q6_K's order is the natural one; Q4_K's below), so a weight vector is two to four
// bitwise operations away from maddubs; madd against the sub-scales picked into its pair
// lanes sums each row's block in one vector, and the four rows' sums are reduced together.
// Q6_K is decoded as w + 32 (0..63, unsigned): 32 x the sum of scale x block sum of 16
// quants is taken back out in integers. The integer sums equal the generic path's; the f32
// steps per block are its own, one lane per row (as k_block_step).
template <bool kSix>
inline void gemv_k(const uint8_t* base, int64_t row_bytes, int64_t k, const Activations& a, const int16_t* bs16,
                   int64_t n0, int64_t n1, float* y) {
  constexpr int kBytes = kSix ? 210 : 144;
  const int64_t nb = k / 256;
  // Q4_K: byte l < 32 of 32-byte chunk c holds weights 64c + l (low nibble) and 64c + 32 + l
  // (high). Vector v of a block (0: low nibbles of bytes 0-63, 1: their high nibbles, 2 and
  // 3: the same of bytes 64-127) so covers the 32-weight sub-blocks s0 and s0 + 2, with
  // s0 = 4 (v / 2) + v % 2. The quants are permuted to that order; bsum32 holds the sums of
  // 32 quants (for the mins) as int16.
  static thread_local std::vector<int8_t> qperm;
  static thread_local std::vector<int16_t> bsum32;
  const int8_t* q = a.q.data();
  if (!kSix) {
    qperm.resize(static_cast<size_t>(k));
    bsum32.resize(static_cast<size_t>(k / 32));
    for (int64_t b = 0; b < nb; ++b) {
      for (int v = 0; v < 4; ++v) {
        const int s0 = 4 * (v / 2) + v % 2;
        std::memcpy(qperm.data() + 256 * b + 64 * v, q + 256 * b + 32 * s0, 32);
        std::memcpy(qperm.data() + 256 * b + 64 * v + 32, q + 256 * b + 32 * (s0 + 2), 32);
      }
      for (int s = 0; s < 8; ++s)
        bsum32[8 * b + s] = static_cast<int16_t>(bs16[16 * b + 2 * s] + bs16[16 * b + 2 * s + 1]);
    }
    q = qperm.data();
  }
  const int16_t* bs32 = bsum32.data();
  // Pair lane L of vector v takes the sub-scale of its weights: Q4_K, from the eight of the
  // block (s16); Q6_K, from the sixteen (one per 16 weights, natural order).
  __m512i pick[4];
  for (int v = 0; v < 4; ++v) {
    alignas(64) int16_t idx[32];
    for (int l = 0; l < 32; ++l) {
      const int s0 = 4 * (v / 2) + v % 2;
      idx[l] = static_cast<int16_t>(kSix ? 4 * v + l / 8 : (l < 16 ? s0 : s0 + 2));
    }
    pick[v] = _mm512_load_si512(idx);
  }
  const float* ad = a.d.data();
  for_each_row_tile(base, row_bytes, n0, n1, [&](const uint8_t* const* r, int64_t j0, int rows, int64_t pf) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m128 sum = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m512i qv[4];
      for (int v = 0; v < 4; ++v) qv[v] = _mm512_loadu_si512(q + 256 * b + 64 * v);
      __m256i isum[kTile];
      __m128i msum[kTile];
      for (int t = 0; t < kTile; ++t) {
        const uint8_t* p = r[t] + kBytes * b;
        if (pf != 0) prefetch_block(p + pf, kBytes);
        __m512i w[4], scb;
        if (kSix) {
          const __m512i z0 = _mm512_loadu_si512(p), z1 = _mm512_loadu_si512(p + 64);
          const __m512i h = _mm512_loadu_si512(p + 128);
          // High bits of weight 128 hh + 32 g + l: bits 2g, 2g + 1 of qh[32 hh + l].
          const __m512i h0 = _mm512_shuffle_i64x2(h, h, 0x44), h1 = _mm512_shuffle_i64x2(h, h, 0xEE);
          const __m512i s01 = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
          const __m512i s23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
          const __m512i m30 = _mm512_set1_epi8(0x30);
          const auto high = [&](__m512i hv, __m512i sh) {
            return _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(hv, sh), 4), m30);
          };
          w[0] = _mm512_or_si512(_mm512_and_si512(z0, m4), high(h0, s01));
          w[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(z0, 4), m4), high(h0, s23));
          w[2] = _mm512_or_si512(_mm512_and_si512(z1, m4), high(h1, s01));
          w[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(z1, 4), m4), high(h1, s23));
          scb = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(load128(p + 192)));
        } else {
          const __m512i v0 = _mm512_loadu_si512(p + 16), v1 = _mm512_loadu_si512(p + 80);
          w[0] = _mm512_and_si512(v0, m4);
          w[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
          w[2] = _mm512_and_si512(v1, m4);
          w[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
          __m128i s8, m8;
          k4_scales8(p + 4, s8, m8);
          scb = _mm512_castsi128_si512(s8);
          msum[t] = _mm_madd_epi16(m8, load128(bs32 + 8 * b));
        }
        __m512i acc = _mm512_setzero_si512();
        for (int v = 0; v < 4; ++v)
          acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w[v], qv[v]),
                                                        _mm512_permutexvar_epi16(pick[v], scb)));
        isum[t] = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
        if (kSix)  // the offset: 32 x sum of scale x block sum
          isum[t] = _mm256_sub_epi32(
              isum[t], _mm256_slli_epi32(_mm256_madd_epi16(_mm512_castsi512_si256(scb), load256(bs16 + 16 * b)), 5));
      }
      const __m128i is = reduce4(isum[0], isum[1], isum[2], isum[3]);
      const __m128 adb = _mm_set1_ps(ad[b]);
      if (kSix) {
        const __m128i hd =
            _mm_setr_epi16(static_cast<int16_t>(r[0][210 * b + 208] | r[0][210 * b + 209] << 8),
                           static_cast<int16_t>(r[1][210 * b + 208] | r[1][210 * b + 209] << 8),
                           static_cast<int16_t>(r[2][210 * b + 208] | r[2][210 * b + 209] << 8),
                           static_cast<int16_t>(r[3][210 * b + 208] | r[3][210 * b + 209] << 8), 0, 0, 0, 0);
        const __m128 d = _mm_mul_ps(_mm_cvtph_ps(hd), adb);
        // The generic path subtracts dmin * msum = 0 * 0: x - 0 is x, bit for bit.
        sum = _mm_add_ps(sum, _mm_mul_ps(d, _mm_cvtepi32_ps(is)));
      } else {
        const __m128i ms = _mm_hadd_epi32(_mm_hadd_epi32(msum[0], msum[1]), _mm_hadd_epi32(msum[2], msum[3]));
        __m128i hd;  // d of the four rows, then dmin
        {
          uint32_t u[kTile];
          for (int t = 0; t < kTile; ++t) std::memcpy(&u[t], r[t] + 144 * b, 4);
          const __m128i dd = _mm_setr_epi32(static_cast<int>(u[0]), static_cast<int>(u[1]), static_cast<int>(u[2]),
                                            static_cast<int>(u[3]));
          // [d0 dmin0 d1 dmin1 ...] -> [d0 d1 d2 d3 dmin0 dmin1 dmin2 dmin3]
          hd = _mm_shuffle_epi8(dd, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
        }
        const __m256 dw = _mm256_cvtph_ps(hd);  // exact, as half_f16c
        const __m128 d = _mm_mul_ps(_mm256_castps256_ps128(dw), adb);
        const __m128 dmin = _mm_mul_ps(_mm256_extractf128_ps(dw, 1), adb);
        sum = _mm_add_ps(sum, _mm_sub_ps(_mm_mul_ps(d, _mm_cvtepi32_ps(is)), _mm_mul_ps(dmin, _mm_cvtepi32_ps(ms))));
      }
    }
    store_outputs(sum, y + (j0 - n0), rows);
  });
}
// One activation row against IQ4_XS rows read in place (a decode step), four rows at a
// time as gemv_k. Byte l of sub-block s's 16 quant bytes holds weights 32 s + l (low nibble)
// and 32 s + 16 + l (high); vector v of a block (0: low nibbles of bytes 0-63, 1: their high
// nibbles, 2 and 3: the same of bytes 64-127) so holds sub-blocks 4 (v / 2) .. + 3, 16
// weights of each, and the quants are permuted to that order once. Each nibble is looked up
// in kIq4nlValues (vpshufb); signed x signed by |w| x (q with w's sign) (vpmaddubsw), the
// pairs times their sub-scale (vpmaddwd). The integer sums are the generic path's and the
// f32 steps per block its order, one lane per row.
inline void gemv_iq4xs(const uint8_t* base, int64_t row_bytes, int64_t k, const Activations& a, int64_t n0, int64_t n1,
                       float* y) {
  const int64_t nb = k / 256;
  static thread_local std::vector<int8_t> qperm;
  qperm.resize(static_cast<size_t>(k));
  for (int64_t b = 0; b < nb; ++b)
    for (int v = 0; v < 4; ++v)
      for (int c = 0; c < 4; ++c)
        std::memcpy(qperm.data() + 256 * b + 64 * v + 16 * c,
                    a.q.data() + 256 * b + 32 * (4 * (v / 2) + c) + 16 * (v % 2), 16);
  const int8_t* q = qperm.data();
  __m512i pick[4];  // pair lane p of vector v: sub-block 4 (v / 2) + p / 8
  for (int v = 0; v < 4; ++v) {
    alignas(64) int16_t idx[32];
    for (int p = 0; p < 32; ++p) idx[p] = static_cast<int16_t>(4 * (v / 2) + p / 8);
    pick[v] = _mm512_load_si512(idx);
  }
  const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  const __m256i lo_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
                hi_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const float* ad = a.d.data();
  for_each_row_tile(base, row_bytes, n0, n1, [&](const uint8_t* const* r, int64_t j0, int rows, int64_t pf) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
    __m128 sum = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m512i qv[4];
      for (int v = 0; v < 4; ++v) qv[v] = _mm512_loadu_si512(q + 256 * b + 64 * v);
      __m256i isum[kTile];
      for (int t = 0; t < kTile; ++t) {
        const uint8_t* p = r[t] + 136 * b;
        if (pf != 0) prefetch_block(p + pf, 136);
        const __m512i v0 = _mm512_loadu_si512(p + 8), v1 = _mm512_loadu_si512(p + 72);
        const __m512i nib[4] = {_mm512_and_si512(v0, m4), _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4),
                                _mm512_and_si512(v1, m4), _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4)};
        // The eight sub-scales: ((scales_l >> 4 s) & 15) | (((scales_h >> 2 s) & 3) << 4), minus 32.
        uint16_t sh;
        uint32_t sl;
        std::memcpy(&sh, p + 2, 2);
        std::memcpy(&sl, p + 4, 4);
        const __m256i ls =
            _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(sl)), lo_shift),
                                             _mm256_set1_epi32(15)),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), hi_shift),
                                                               _mm256_set1_epi32(3)),
                                              4));
        const __m512i scb = _mm512_castsi128_si512(_mm256_cvtepi32_epi16(_mm256_sub_epi32(ls, _mm256_set1_epi32(32))));
        __m512i acc = _mm512_setzero_si512();
        for (int v = 0; v < 4; ++v) {
          const __m512i w = _mm512_shuffle_epi8(lut, nib[v]);
          const __m512i qs = _mm512_mask_sub_epi8(qv[v], _mm512_movepi8_mask(w), zero, qv[v]);  // q with w's sign
          acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w), qs),
                                                        _mm512_permutexvar_epi16(pick[v], scb)));
        }
        isum[t] = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
      }
      const __m128i is = reduce4(isum[0], isum[1], isum[2], isum[3]);
      uint16_t h[kTile];
      for (int t = 0; t < kTile; ++t) std::memcpy(&h[t], r[t] + 136 * b, 2);
      const __m128i hd = _mm_setr_epi16(static_cast<int16_t>(h[0]), static_cast<int16_t>(h[1]),
                                        static_cast<int16_t>(h[2]), static_cast<int16_t>(h[3]), 0, 0, 0, 0);
      const __m128 d = _mm_mul_ps(_mm_cvtph_ps(hd), _mm_set1_ps(ad[b]));
      sum = _mm_add_ps(sum, _mm_mul_ps(d, _mm_cvtepi32_ps(is)));
    }
    store_outputs(sum, y + (j0 - n0), rows);
  });
}
#endif

inline void matmul_rows(uint32_t type, const uint8_t* base, int64_t row_bytes, int64_t k, const Activations& a,
                        int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy, PanelRef panels, PanelPrefetch pf) {
  const bool k_type = block_size(type) == 256;
  // Q8_K block sums as int16 (|sum of 16 quants| <= 2032), for madd against the mins.
  static thread_local std::vector<int16_t> bsums16;
  const bool sums = k_type && (has_mins(type) || weight_offset(type) != 0);
  if (sums) {
    bsums16.resize(a.bsums.size());
    for (size_t i = 0; i < a.bsums.size(); ++i) bsums16[i] = static_cast<int16_t>(a.bsums[i]);
  }
  const int16_t* bs16 = sums ? bsums16.data() : nullptr;
  if (panels && panel::with_panel_type(type, [&]<uint32_t kType>() {
        panel::matmul<kType>(panels, k, a, m, n0, n1, y, ldy, pf);
      }))
    return;
#ifdef __AVX512VNNI__
  if (m == 1 && type == kQ8_0) {
    gemv_blocks32<kQ8_0>(base, row_bytes, k, a, n0, n1, y);
    return;
  }
  if (m == 1 && type == kQ4_0) {
    gemv_blocks32<kQ4_0>(base, row_bytes, k, a, n0, n1, y);
    return;
  }
  if (m == 1 && type == kIQ4_NL) {
    gemv_blocks32<kIQ4_NL>(base, row_bytes, k, a, n0, n1, y);
    return;
  }
  if (m == 1 && type == kQ4_K) {
    gemv_k<false>(base, row_bytes, k, a, bs16, n0, n1, y);
    return;
  }
  if (m == 1 && type == kQ6_K) {
    gemv_k<true>(base, row_bytes, k, a, bs16, n0, n1, y);
    return;
  }
  if (m == 1 && type == kIQ4_XS) {
    gemv_iq4xs(base, row_bytes, k, a, n0, n1, y);
    return;
  }
  if (m >= vnni::kMinTokens && act_form(type) != ActForm::kQ8_1) {  // prefill: 16-row VNNI tiles
    vnni::matmul_rows(type, base, row_bytes, k, a, bs16, m, n0, n1, y, ldy);
    return;
  }
#endif
  const DotFn dot1 = k_type ? dotk_for<1>(type) : dot32_for<1>(type);
  const DotFn dot2 = k_type ? dotk_for<2>(type) : dot32_for<2>(type);
  const bool q8_1 = act_form(type) == ActForm::kQ8_1;
  const int64_t nb = k / block_size(type);
  const int64_t tiles = (n1 - n0 + kTile - 1) / kTile;
  const int threads = omp_in_parallel() ? 1 : num_threads();
  parallel_region(static_cast<int>(std::min<int64_t>(threads, tiles)), [&] {
    static thread_local Tile tl;
    tl.resize(k, nb, k_type);
    for (int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
      const int64_t i1 = std::min(m, i0 + kRowBlock);
#pragma omp for schedule(static) nowait
      for (int64_t tt = 0; tt < tiles; ++tt) {
        const int64_t j0 = n0 + tt * kTile;
        const int rows = static_cast<int>(std::min<int64_t>(kTile, n1 - j0));
        for (int t = 0; t < kTile; ++t) {
          const RowOut o{tl.w.data() + t * k,
                         k_type ? tl.sc.data() + t * (k / 16) : nullptr,
                         k_type ? tl.mn.data() + t * (k / 16) : nullptr,
                         tl.d.data() + t,
                         tl.dmin.data() + t,
                         tl.m.data() + t,
                         j0 + kTile + t < n1 ? kTile * row_bytes : 0};
          if (t < rows) {
            decode_into(type, base + (j0 + t) * row_bytes, k, o);
          } else {  // past the last row: zero weights and scales
            std::memset(o.w, 0, static_cast<size_t>(k));
            for (int64_t b = 0; b < nb; ++b) o.d[b * kTile] = o.dmin[b * kTile] = o.m[b * kTile] = 0.0f;
            if (k_type) {
              std::memset(o.sc, 0, static_cast<size_t>(k / 16) * sizeof(int16_t));
              std::memset(o.mn, 0, static_cast<size_t>(k / 16) * sizeof(int16_t));
            }
          }
        }
        const auto act = [&](int64_t i) {
          return ActRow{a.q.data() + i * k, a.d.data() + i * (k_type ? k / 256 : k / 32),
                        bs16 != nullptr ? bs16 + i * (k / 16) : nullptr, q8_1 ? a.s.data() + i * (k / 32) : nullptr};
        };
        int64_t i = i0;
        if (dot2 != nullptr) {
          for (; i + 2 <= i1; i += 2) {
            const ActRow two[2] = {act(i), act(i + 1)};
            __m128 v[2];
            dot2(tl, k, two, v);
            store_outputs(v[0], y + i * ldy + (j0 - n0), rows);
            store_outputs(v[1], y + (i + 1) * ldy + (j0 - n0), rows);
          }
        }
        for (; i < i1; ++i) {
          const ActRow one = act(i);
          __m128 v;
          dot1(tl, k, &one, &v);
          store_outputs(v, y + i * ldy + (j0 - n0), rows);
        }
      }
    }
  });
}

}  // namespace simd
