// The 16-lane vectors the panel kernels (ggml_matmul_panels.h) are written in: one row of a
// panel per 32-bit lane. On AVX-512 VNNI a vector is one 512-bit register and each operation
// its one instruction; on AVX2 it is two 256-bit halves (rows 0-7, rows 8-15), each
// operation done on both. The lanes' values are the same on both, so are the results.
//
// The products (u8 weights x s8 activation quants, four per lane): on VNNI vpdpbusd adds them
// to int32 sums. AVX2 has no such instruction: vpmaddubsw gives int16 sums of pairs, and an
// unsigned chain keeps adding those in int16 (the panel kernels bound every chain: at most
// 32767, see kChainBound) until vpmaddwd widens them once per chain; the types whose VNNI
// operands are w + 128 (Q8_0, IQ4_NL, IQ4_XS) take w itself on AVX2, as |w| against q with
// w's sign (vpsignb), widened per step (a pair reaches 2 x 128 x 127).
// Included by ggml_matmul_panels.h inside namespace panel (within ggml_matmul_simd.h's simd).

namespace vec {

#ifdef __AVX512VNNI__
constexpr bool kVnni = true;
using I = __m512i;
using F = __m512;

inline I load(const void* p) { return _mm512_load_si512(p); }
inline void store(void* p, I v) { _mm512_store_si512(p, v); }
inline I zero() { return _mm512_setzero_si512(); }
inline I set8(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
inline I set32(int32_t v) { return _mm512_set1_epi32(v); }
inline I and_(I a, I b) { return _mm512_and_si512(a, b); }
inline I or_(I a, I b) { return _mm512_or_si512(a, b); }
inline I xor_(I a, I b) { return _mm512_xor_si512(a, b); }
inline I srl16(I v, int n) { return _mm512_srli_epi16(v, static_cast<unsigned>(n)); }
inline I sll16(I v, int n) { return _mm512_slli_epi16(v, static_cast<unsigned>(n)); }
inline I add32(I a, I b) { return _mm512_add_epi32(a, b); }
inline I sub32(I a, I b) { return _mm512_sub_epi32(a, b); }
inline I mul32(I a, I b) { return _mm512_mullo_epi32(a, b); }
// (A & B) | C.
inline I and_or(I a, I b, I c) { return _mm512_ternarylogic_epi32(a, b, c, 0xEA); }
// 16 bytes in every 128-bit quarter, and a lookup in them per byte (idx < 16).
inline I table16(const int8_t* p) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline I shuffle8(I table, I idx) { return _mm512_shuffle_epi8(table, idx); }
// v + add in the bytes whose bit is set in the 64-bit mask at `bits` (byte i: bit i).
inline I add8_where(I v, const uint8_t* bits, I add) {
  uint64_t m;
  std::memcpy(&m, bits, 8);
  return _mm512_mask_add_epi8(v, _cvtu64_mask64(m), v, add);
}
// lo, hi: add8_where with the 64-bit masks at bits and bits + 8.
inline void add8_where2(I& lo, I& hi, const uint8_t* bits, I add) {
  lo = add8_where(lo, bits, add);
  hi = add8_where(hi, bits + 8, add);
}
// The AVX2 build's or_plane_bit (below; bit `at` of v is clear, so the add is an or): a
// vptestmb and a masked add, as add8_where's mask load and add.
inline I or_plane_bit(I v, I planes, int m, int at) {
  return _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(planes, set8(1 << m)), v, set8(1 << at));
}
// Four bytes at p in every lane.
inline I bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
// 16 bytes at p, one per lane, zero- / sign-extended.
inline I u8_lanes(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline I i8_lanes(const uint8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// 32 bytes as int16: lo's 16 for lanes 0-7, hi's for lanes 8-15 (two per lane).
inline I u8_pairs(__m128i lo, __m128i hi) { return _mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo)); }
// acc + the int16 pairs of a times those of b, per lane (vpdpwssd).
inline I dot16(I acc, I a, I b) { return _mm512_dpwssd_epi32(acc, a, b); }
// AVX2's steps that take a sub-block's scale as an int16 pair (IQ4_XS's, Q6_K's and Q3_K's
// one-chain steps, Q2_K's): declared for the shared code's discarded branches (if constexpr
// on AVX2 alone); VNNI takes the unsigned chains and never calls them.
I i8_pairs(const uint8_t* p);
I u4_pairs(const uint8_t* p);
I signed_step_scaled(I acc, I w, I q, I scale);

inline F loadf(const float* p) { return _mm512_load_ps(p); }
inline void storef(float* p, F v) { _mm512_store_ps(p, v); }
// Lanes [0, rows) to y.
inline void store_rows(float* y, F v, int rows) {
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << rows) - 1), v);
}
// 16 f16 at p as f32.
inline F halves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline F setf(float v) { return _mm512_set1_ps(v); }
inline F cvt(I v) { return _mm512_cvtepi32_ps(v); }
inline F addf(F a, F b) { return _mm512_add_ps(a, b); }
inline F subf(F a, F b) { return _mm512_sub_ps(a, b); }
inline F mulf(F a, F b) { return _mm512_mul_ps(a, b); }

// A chain of products: starts at -corr (int32), vpdpbusd per step.
template <bool kSigned>
inline I chain_start(int32_t corr) {
  static_assert(!kSigned, "VNNI operands are unsigned");
  return corr != 0 ? _mm512_set1_epi32(-corr) : _mm512_setzero_si512();
}
template <bool kSigned>
inline I chain_step(I acc, I w, I a) {
  return _mm512_dpbusd_epi32(acc, w, a);
}
// Two chains' int32 sum (the start's -corr in it already; kMerge: one chain, lo).
template <bool kSigned, bool kMerge = false>
inline I chain_sum(I lo, I hi, int32_t corr) {
  static_assert(!kMerge, "VNNI keeps two chains");
  (void)corr;
  return _mm512_add_epi32(lo, hi);
}
#else
constexpr bool kVnni = false;
struct I {
  __m256i a, b;  // rows 0-7, 8-15
};
struct F {
  __m256 a, b;
};

inline __m256i h256(const void* p) { return _mm256_load_si256(static_cast<const __m256i*>(p)); }
inline I load(const void* p) { return {h256(p), h256(static_cast<const uint8_t*>(p) + 32)}; }
inline void store(void* p, I v) {
  _mm256_store_si256(static_cast<__m256i*>(p), v.a);
  _mm256_store_si256(reinterpret_cast<__m256i*>(static_cast<uint8_t*>(p) + 32), v.b);
}
inline I zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline I set8(int v) {
  const __m256i x = _mm256_set1_epi8(static_cast<char>(v));
  return {x, x};
}
inline I set32(int32_t v) {
  const __m256i x = _mm256_set1_epi32(v);
  return {x, x};
}
inline I and_(I x, I y) { return {_mm256_and_si256(x.a, y.a), _mm256_and_si256(x.b, y.b)}; }
inline I or_(I x, I y) { return {_mm256_or_si256(x.a, y.a), _mm256_or_si256(x.b, y.b)}; }
inline I xor_(I x, I y) { return {_mm256_xor_si256(x.a, y.a), _mm256_xor_si256(x.b, y.b)}; }
inline I srl16(I v, int n) { return {_mm256_srli_epi16(v.a, n), _mm256_srli_epi16(v.b, n)}; }
inline I sll16(I v, int n) { return {_mm256_slli_epi16(v.a, n), _mm256_slli_epi16(v.b, n)}; }
inline I add32(I x, I y) { return {_mm256_add_epi32(x.a, y.a), _mm256_add_epi32(x.b, y.b)}; }
inline I sub32(I x, I y) { return {_mm256_sub_epi32(x.a, y.a), _mm256_sub_epi32(x.b, y.b)}; }
inline I mul32(I x, I y) { return {_mm256_mullo_epi32(x.a, y.a), _mm256_mullo_epi32(x.b, y.b)}; }
inline I and_or(I x, I y, I z) { return or_(and_(x, y), z); }
inline I table16(const int8_t* p) {
  const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {t, t};
}
inline I shuffle8(I table, I idx) { return {_mm256_shuffle_epi8(table.a, idx.a), _mm256_shuffle_epi8(table.b, idx.b)}; }
// lo + add in the bytes whose bit is set in the 64-bit mask at bits, hi likewise with the mask
// at bits + 8 (byte i: bit i % 8 of mask byte i / 8), as the AVX-512 build's add8_where pair:
// the 16 bytes loaded once into both 128-bit lanes and each quarter spread by one vpshufb
// (ggml_matmul_simd.h's bit_bytes, which the rows' Q5_0 / Q5_1 decoder uses, takes a move
// from a general register and a broadcast besides, per 32 bytes).
inline void add8_where2(I& lo, I& hi, const uint8_t* bits, I add) {
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits)));
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  // Byte i of quarter q (lo.a, lo.b, hi.a, hi.b) tests bit i % 8 of byte 4q + i / 8.
  const auto quarter = [&](int q) {
    const __m256i spread = _mm256_add_epi8(_mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                            2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
                                           _mm256_set1_epi8(static_cast<char>(4 * q)));
    return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(b, spread), sel), sel);
  };
  lo = {_mm256_add_epi8(lo.a, _mm256_and_si256(quarter(0), add.a)),
        _mm256_add_epi8(lo.b, _mm256_and_si256(quarter(1), add.b))};
  hi = {_mm256_add_epi8(hi.a, _mm256_and_si256(quarter(2), add.a)),
        _mm256_add_epi8(hi.b, _mm256_and_si256(quarter(3), add.b))};
}
// v | bit m of each byte of planes, moved to bit `at` (the byte's other bits cleared; bit `at`
// of v clear): extra bits laid out as bit planes (Q3_K's third bits: bit m of byte j of a
// chunk's plane vector is that of byte j of the chunk's operand vector m). A shift, and, or:
// three instructions a 256-bit half, where a 64-bit mask per vector took five (a broadcast,
// vpshufb, and, compare, and) and the add. m and at are constants where it is inlined
// (immediate shifts, no branch).
inline __m256i plane_bit8(__m256i planes, int m, int at) {  // (8 rows: the half-panel kernels take it alone)
  const __m256i moved = m > at   ? _mm256_srli_epi16(planes, m - at)
                        : m < at ? _mm256_slli_epi16(planes, at - m)
                                 : planes;
  return _mm256_and_si256(moved, _mm256_set1_epi8(static_cast<char>(1 << at)));
}
inline I or_plane_bit(I v, I planes, int m, int at) {
  return {_mm256_or_si256(v.a, plane_bit8(planes.a, m, at)), _mm256_or_si256(v.b, plane_bit8(planes.b, m, at))};
}
inline I bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return set32(v);
}
inline I u8_lanes(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepu8_epi32(v), _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))};
}
inline I i8_lanes(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi8_epi32(v), _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))};
}
inline I u8_pairs(__m128i lo, __m128i hi) { return {_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi)}; }
inline I dot16(I acc, I x, I y) {
  return {_mm256_add_epi32(acc.a, _mm256_madd_epi16(x.a, y.a)), _mm256_add_epi32(acc.b, _mm256_madd_epi16(x.b, y.b))};
}
// A step's result as it stands, in its two registers: the compiler may not take the steps of
// a chain apart. Integer adds reassociate, and GCC 12 summed the int16 chains of several
// activation rows as trees (every row's products first, then their sums), which needs
// registers for all the products: 16 YMM registers spill, and the multi-row kernels ran from
// the stack (kernels_bench 2048 x 5632, one thread, INFERA_ISA=avx2, 64 tokens: Q4_K 127-152
// -> 193-217 GOP/s, Q5_K 116-138 -> 165-195; end to end, a TinyLlama-shaped Q4_K_M file's
// 64-token prompt 61-77 -> 103-105 tokens/s). The sums are exact either way.
inline I in_registers(I r) {
  __asm__("" : "+x"(r.a), "+x"(r.b));
  return r;
}
// 8 signed bytes at p as int16 pairs (s, s), one per lane: one half of i8_pairs (the
// half-panel kernels take them alone).
inline __m256i i8_pairs8(const uint8_t* p) {
  const __m128i v = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_set_m128i(_mm_unpackhi_epi16(v, v), _mm_unpacklo_epi16(v, v));
}
inline I i8_pairs(const uint8_t* p) { return {i8_pairs8(p), i8_pairs8(p + 8)}; }
// 8 unsigned bytes at p as int16 pairs (s, s), one per lane (Q4_K's sub-scales, 0..63).
inline __m256i u8_pairs8(const uint8_t* p) {
  const __m256i s32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_or_si256(s32, _mm256_slli_epi32(s32, 16));
}
// The low four bits of 8 bytes at p as int16 pairs (s, s), one per lane (Q2_K's scales; its
// mins are the high four): one half of u4_pairs.
inline __m256i u4_pairs8(const uint8_t* p) { return _mm256_and_si256(u8_pairs8(p), _mm256_set1_epi16(0xF)); }
inline I u4_pairs(const uint8_t* p) { return {u4_pairs8(p), u4_pairs8(p + 8)}; }
inline I signed_step_scaled(I acc, I w, I q, I scale) {
  I r{_mm256_add_epi32(acc.a, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w.a), _mm256_sign_epi8(q.a, w.a)),
                                                scale.a)),
      _mm256_add_epi32(acc.b, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w.b), _mm256_sign_epi8(q.b, w.b)),
                                                scale.b))};
  return in_registers(r);
}

inline F loadf(const float* p) { return {_mm256_load_ps(p), _mm256_load_ps(p + 8)}; }
inline void storef(float* p, F v) {
  _mm256_store_ps(p, v.a);
  _mm256_store_ps(p + 8, v.b);
}
inline void store_rows(float* y, F v, int rows) {
  if (rows == 16) {
    _mm256_storeu_ps(y, v.a);
    _mm256_storeu_ps(y + 8, v.b);
    return;
  }
  alignas(32) float tmp[16];
  storef(tmp, v);
  std::memcpy(y, tmp, sizeof(float) * static_cast<size_t>(rows));
}
// 8 f16 at p as f32: one half of halves (the half-panel kernels take them alone).
inline __m256 halves8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline F halves(const uint8_t* p) { return {halves8(p), halves8(p + 16)}; }
inline F setf(float v) {
  const __m256 x = _mm256_set1_ps(v);
  return {x, x};
}
inline F cvt(I v) { return {_mm256_cvtepi32_ps(v.a), _mm256_cvtepi32_ps(v.b)}; }
inline F addf(F x, F y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
inline F subf(F x, F y) { return {_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
inline F mulf(F x, F y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }

// A chain of products: unsigned operands as int16 pair sums (vpmaddubsw, added in int16:
// the caller keeps a chain's sum within kChainBound), signed ones (w as it is) as int32
// (|w| x sign(q, w), widened per step). corr is taken out at the end.
template <bool kSigned>
inline I chain_start(int32_t) {
  return zero();
}
template <bool kSigned>
inline I chain_step(I acc, I w, I q) {
  if constexpr (kSigned) {
    const __m256i one = _mm256_set1_epi16(1);
    I r{_mm256_add_epi32(acc.a,
                         _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w.a), _mm256_sign_epi8(q.a, w.a)),
                                           one)),
        _mm256_add_epi32(acc.b,
                         _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w.b), _mm256_sign_epi8(q.b, w.b)),
                                           one))};
    return in_registers(r);
  } else {
    I r{_mm256_add_epi16(acc.a, _mm256_maddubs_epi16(w.a, q.a)),
        _mm256_add_epi16(acc.b, _mm256_maddubs_epi16(w.b, q.b))};
    return in_registers(r);
  }
}
// (kMerge: one chain, lo, that took both halves' steps.)
template <bool kSigned, bool kMerge = false>
inline I chain_sum(I lo, I hi, int32_t corr) {
  I s;
  if constexpr (kSigned) {
    s = kMerge ? lo : add32(lo, hi);
  } else if constexpr (kMerge) {
    const __m256i one = _mm256_set1_epi16(1);
    s = {_mm256_madd_epi16(lo.a, one), _mm256_madd_epi16(lo.b, one)};
  } else {
    const __m256i one = _mm256_set1_epi16(1);
    s = {_mm256_add_epi32(_mm256_madd_epi16(lo.a, one), _mm256_madd_epi16(hi.a, one)),
         _mm256_add_epi32(_mm256_madd_epi16(lo.b, one), _mm256_madd_epi16(hi.b, one))};
  }
  return corr != 0 ? sub32(s, set32(corr)) : s;
}
#endif

// The most an unsigned chain may add up to on AVX2 (int16): steps x 2 x the largest operand x
// 127 (the activation quants are within +-127).
constexpr int kChainBound = 32767;
constexpr bool chain_fits(int steps, int max_operand) { return steps * 2 * max_operand * 127 <= kChainBound; }

}  // namespace vec
