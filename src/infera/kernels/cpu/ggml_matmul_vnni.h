// Prefill (several activation rows) of the ggml block-format matmul on AVX-512 VNNI: the
// same values as the generic loops of ggml_matmul_impl.h, bit for bit, with register tiles
// of 32 weight rows (two tiles of 16) x up to 4 activation rows.
//
// A pair of tiles of 16 weight rows is decoded once per block of activation rows, kChunk
// weights at a time, and each chunk multiplied by every activation row of the block while
// it is in L1 (the f32 sums carried from chunk to chunk in the generic path's order). Whole
// Q4_K / Q5_K / Q6_K / IQ4_XS tiles are unpacked straight from the file's blocks (16 x 16 dword
// transposes, the scales by gathers); other types and partial tiles go through the decoders
// of ggml_matmul_simd.h, one row at a time. A tile is laid out as VNNI wants it: dword g of the tile
// holds weights 4g..4g+3 of each of the 16 rows, one row per 32-bit lane, made unsigned by
// an offset (signed types: the byte xor 0x80, i.e. w + 128; Q6_K is decoded as w + 32; the
// K types with mins are unsigned already). Then one vpdpbusd (unsigned weights x the
// activation's four int8 quants broadcast to every lane) adds four products to each row's
// int32 sum: the 16 rows' sums of a block come out in one vector, with no horizontal
// reduction; each weight vector loaded serves every activation row of the register tile,
// and each activation broadcast both tiles of a pair (a thread takes tiles two at a time:
// the broadcasts, not the vpdpbusd, bounded the one-tile loop). The offset is taken back out in integers per block (or
// per sub-scale group of a K type): sum (w + o) q = sum w q + o sum q, with the activation's block sums computed once
// per call. K types then apply their integer sub-scales (vpmulld) and mins (vpdpwssd
// against the int16 sums of 16 quants), all exact, so every integer sum equals the generic
// path's; the f32 steps run per block in its order and operations, one lane per row.
// Included by ggml_matmul_simd.h inside namespace simd, only when __AVX512VNNI__ is defined.

namespace vnni {

constexpr int kRows = 16;
// Fewer activation rows than this take the 4-row tiles above (a decode step is bound by
// reading the weights; the VNNI layout costs a transposition per tile).
constexpr int64_t kMinTokens = 4;
// Weights per chunk of a pair of tiles (a multiple of 256: whole K super-blocks).
constexpr int64_t kChunk = 512;

// How a type's tile is computed: the offset that makes its decoded weights unsigned, the
// weights per integer sub-scale (K types: 16 or 32; 0: 32-weight blocks with one f32 scale),
// and whether it has mins.
struct Shape {
  int offset;
  int sub;
  bool mins;
};

inline Shape shape_of(uint32_t type) {
  switch (type) {
    case kQ4_K:
    case kQ5_K: return {0, 32, true};
    case kQ2_K: return {0, 16, true};
    case kQ6_K: return {32, 16, false};
    case kIQ4_XS: return {128, 32, false};
    case kQ3_K: return {128, 16, false};
    default: return {128, 0, false};  // Q8_0, Q4_0, Q5_0, IQ4_NL
  }
}

struct VTile {
  std::vector<int8_t> rows;  // [kRows][k]: decoded row-major (scratch)
  std::vector<int16_t> sc, mn;  // [kRows][k / 16] (K types, scratch)
  std::vector<int32_t> wq;  // [k / 4][kRows]: four unsigned weights of each row
  std::vector<float> d, dmin;  // [blocks][kRows]
  std::vector<int32_t> sc32;  // [k / sub][kRows]: the sub-scales as int32
  std::vector<int32_t> mnp;  // [k / 32][kRows]: int16 pairs (mins of 16-weight groups 2p, 2p + 1)
  void resize(int64_t k, int64_t nb, const Shape& s) {
    rows.resize(static_cast<size_t>(kRows * k));
    wq.resize(static_cast<size_t>(kRows * k / 4));
    d.resize(static_cast<size_t>(kRows * nb));
    dmin.resize(static_cast<size_t>(kRows * nb));
    if (s.sub != 0) {  // (+ 2: a gather reads the last row's last scale as a dword)
      sc.resize(static_cast<size_t>(kRows * k / 16 + 2));
      mn.resize(static_cast<size_t>(kRows * k / 16 + 2));
      sc32.resize(static_cast<size_t>(kRows * k / s.sub));
    }
    if (s.mins) mnp.resize(static_cast<size_t>(kRows * k / 32));
  }
};

// out[c] lane r = dword c of the 64 bytes at p + r * stride (r < 16): a 16 x 16 dword
// transpose (unpack / shuffle).
inline void transpose16(const uint8_t* p, int64_t stride, __m512i* out) {
  __m512i r[16], u[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(p + i * stride);
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: rows i, i+1 of dwords (0, 1) and (2, 3)
    u[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    u[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // per lane L: rows i..i+3 of dword 4L + j in r[i + j]
    r[i] = _mm512_unpacklo_epi64(u[i], u[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(u[i], u[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(u[i + 1], u[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(u[i + 1], u[i + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // dword 4L + j: lane L of r[j], r[4 + j], r[8 + j], r[12 + j]
    const __m512i ab_lo = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44),
                  ab_hi = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xEE);
    const __m512i cd_lo = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44),
                  cd_hi = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xEE);
    out[j] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0x88);
    out[4 + j] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0xDD);
    out[8 + j] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0x88);
    out[12 + j] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0xDD);
  }
}

// Lane r = r x stride: the byte offsets of 16 rows (gathers) or 16 columns.
inline __m512i lane_offsets(int64_t stride) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(static_cast<int>(stride)));
}

// Prefetches the `bytes`-byte block at b0 + pf of each of the 16 rows (row_bytes apart);
// pf 0: none.
inline void prefetch_rows(const uint8_t* b0, int64_t row_bytes, int64_t pf, int bytes) {
  if (pf == 0) return;
  for (int r = 0; r < kRows; ++r) prefetch_block(b0 + r * row_bytes + pf, bytes);
}

// A whole tile of Q4_K (kFive false) or Q5_K rows straight from the file's blocks (rows0:
// the tile's first row at the chunk's first block; k: the chunk's weights): the packed
// nibbles (and Q5_K's high bits) transposed as they are, then unpacked in the VNNI layout
// (byte l of 32-byte chunk c holds weights 64c + l (low nibble) and 64c + 32 + l). The
// scales go straight into lanes: four dword gathers per super-block (d and dmin, the 12
// scale bytes) and get_scale_min_k4's 6-bit fields taken apart on all 16 rows at once.
template <bool kFive>
inline void build_q45k(const uint8_t* rows0, int64_t row_bytes, int64_t k, int64_t pf, VTile& t) {
  const int64_t ts = kFive ? 176 : 144;
  const __m512i m4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  const __m512i idx = lane_offsets(row_bytes);
  const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3);
  for (int64_t i = 0; i < k / 256; ++i) {
    const uint8_t* b0 = rows0 + i * ts;
    prefetch_rows(b0, row_bytes, pf, static_cast<int>(ts));
    const __m512i h = _mm512_i32gather_epi32(idx, b0, 1);  // d | dmin << 16
    const __m512i qa = _mm512_i32gather_epi32(idx, b0 + 4, 1), qb = _mm512_i32gather_epi32(idx, b0 + 8, 1),
                  qc = _mm512_i32gather_epi32(idx, b0 + 12, 1);
    _mm512_storeu_ps(t.d.data() + i * kRows, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
    _mm512_storeu_ps(t.dmin.data() + i * kRows, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16))));
    for (int j = 0; j < 4; ++j) {  // sub-blocks j and 4 + j
      const __m512i a = _mm512_srli_epi32(qa, 8 * j), b = _mm512_srli_epi32(qb, 8 * j),
                    c = _mm512_srli_epi32(qc, 8 * j);
      const __m512i sc = _mm512_and_si512(a, m63), mn = _mm512_and_si512(b, m63);
      const __m512i sc4 = _mm512_or_si512(_mm512_and_si512(c, m15),
                                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a, 6), m3), 4));
      const __m512i mn4 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), m15),
                                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b, 6), m3), 4));
      _mm512_storeu_si512(t.sc32.data() + (8 * i + j) * kRows, sc);
      _mm512_storeu_si512(t.sc32.data() + (8 * i + 4 + j) * kRows, sc4);
      // (a 32-weight sub-block's min for both of its 16-weight groups)
      _mm512_storeu_si512(t.mnp.data() + (8 * i + j) * kRows, _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16)));
      _mm512_storeu_si512(t.mnp.data() + (8 * i + 4 + j) * kRows, _mm512_or_si512(mn4, _mm512_slli_epi32(mn4, 16)));
    }
    __m512i qh[16];  // Q5_K: [0, 8) the high-bit dwords (bytes 16..47 of the block)
    if (kFive) transpose16(b0 + 16, row_bytes, qh);
    for (int hh = 0; hh < 2; ++hh) {
      __m512i v[16];
      transpose16(b0 + (kFive ? 48 : 16) + 64 * hh, row_bytes, v);
      for (int j = 0; j < 16; ++j) {
        const int jj = 16 * hh + j, c = jj / 8, j8 = jj % 8;
        __m512i lo = _mm512_and_si512(v[j], m4), hi = _mm512_and_si512(_mm512_srli_epi16(v[j], 4), m4);
        if (kFive) {
          lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(_mm512_srli_epi16(qh[j8], 2 * c), 4), bit4));
          hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_slli_epi16(_mm512_srli_epi16(qh[j8], 2 * c + 1), 4), bit4));
        }
        _mm512_storeu_si512(t.wq.data() + (64 * i + 16 * c + j8) * kRows, lo);
        _mm512_storeu_si512(t.wq.data() + (64 * i + 16 * c + 8 + j8) * kRows, hi);
      }
    }
  }
}

// A whole tile of Q6_K rows straight from the file's blocks, as build_q45k: the 4-bit and
// 2-bit halves transposed as they are and joined in the VNNI layout (q + 32, unsigned: byte
// l of ql's bytes 0-31 of a 128-weight half holds weights l (low nibble) and 64 + l, of
// bytes 32-63 weights 32 + l and 96 + l, with qh's bit pairs 0, 2, 4, 6 of byte l); the 16
// signed sub-scales and d by dword gathers.
inline void build_q6k(const uint8_t* rows0, int64_t row_bytes, int64_t k, int64_t pf, VTile& t) {
  const __m512i idx = lane_offsets(row_bytes);
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  for (int64_t i = 0; i < k / 256; ++i) {
    const uint8_t* b0 = rows0 + i * 210;
    prefetch_rows(b0, row_bytes, pf, 210);
    // (d read as the upper half of the dword at 206: a dword at 208 would pass the block)
    const __m512i dw = _mm512_i32gather_epi32(idx, b0 + 206, 1);
    _mm512_storeu_ps(t.d.data() + i * kRows, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dw, 16))));
    for (int c = 0; c < 4; ++c) {  // sub-scales 4c..4c+3, sign-extended
      const __m512i v = _mm512_i32gather_epi32(idx, b0 + 192 + 4 * c, 1);
      for (int j = 0; j < 4; ++j)
        _mm512_storeu_si512(t.sc32.data() + (16 * i + 4 * c + j) * kRows,
                            _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * j), 24));
    }
    __m512i qh[16];  // [8h, 8h + 8): half h's 32 high-bit bytes, 4 per dword
    transpose16(b0 + 128, row_bytes, qh);
    for (int h = 0; h < 2; ++h) {
      __m512i ql[16];  // [0, 8): ql bytes 0-31 of the half; [8, 16): bytes 32-63
      transpose16(b0 + 64 * h, row_bytes, ql);
      int32_t* w = t.wq.data() + (64 * i + 32 * h) * kRows;
      for (int j = 0; j < 8; ++j) {
        const __m512i a = ql[j], b = ql[8 + j], hb = qh[8 * h + j];
        const __m512i q1 = _mm512_or_si512(_mm512_and_si512(a, m4), _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30));
        const __m512i q2 = _mm512_or_si512(_mm512_and_si512(b, m4), _mm512_and_si512(_mm512_slli_epi16(hb, 2), m30));
        const __m512i q3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m4), _mm512_and_si512(hb, m30));
        const __m512i q4 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b, 4), m4),
                                           _mm512_and_si512(_mm512_srli_epi16(hb, 2), m30));
        _mm512_storeu_si512(w + j * kRows, q1);
        _mm512_storeu_si512(w + (8 + j) * kRows, q2);
        _mm512_storeu_si512(w + (16 + j) * kRows, q3);
        _mm512_storeu_si512(w + (24 + j) * kRows, q4);
      }
    }
  }
}

// A whole tile of IQ4_XS rows straight from the file's blocks, as build_q45k: the quants
// transposed as they are, each nibble looked up in kIq4nlValues (vpshufb) and made unsigned
// (xor 0x80: the offset 128); byte l of the 16 bytes of sub-block s holds weights 32s + l
// (low nibble) and 32s + 16 + l. The 6-bit sub-scales (minus 32) and d by dword gathers.
inline void build_iq4xs(const uint8_t* rows0, int64_t row_bytes, int64_t k, int64_t pf, VTile& t) {
  const __m512i idx = lane_offsets(row_bytes);
  const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  const __m512i m4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i m15 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3), k32 = _mm512_set1_epi32(32);
  for (int64_t i = 0; i < k / 256; ++i) {
    const uint8_t* b0 = rows0 + i * 136;
    prefetch_rows(b0, row_bytes, pf, 136);
    const __m512i h = _mm512_i32gather_epi32(idx, b0, 1);  // d | scales_h << 16
    const __m512i lo4 = _mm512_i32gather_epi32(idx, b0 + 4, 1), hi2 = _mm512_srli_epi32(h, 16);
    _mm512_storeu_ps(t.d.data() + i * kRows, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
    for (int s = 0; s < 8; ++s) {
      const __m512i ls = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(lo4, 4 * s), m15),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi2, 2 * s), m3), 4));
      _mm512_storeu_si512(t.sc32.data() + (8 * i + s) * kRows, _mm512_sub_epi32(ls, k32));
    }
    for (int hh = 0; hh < 2; ++hh) {
      __m512i v[16];
      transpose16(b0 + 8 + 64 * hh, row_bytes, v);
      for (int j = 0; j < 16; ++j) {
        const int s = 4 * hh + j / 4, l4 = j % 4;
        const __m512i lo = _mm512_xor_si512(_mm512_shuffle_epi8(lut, _mm512_and_si512(v[j], m4)), flip);
        const __m512i hi =
            _mm512_xor_si512(_mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v[j], 4), m4)), flip);
        _mm512_storeu_si512(t.wq.data() + (64 * i + 8 * s + l4) * kRows, lo);
        _mm512_storeu_si512(t.wq.data() + (64 * i + 8 * s + 4 + l4) * kRows, hi);
      }
    }
  }
}

// Decodes the weights [c0, c0 + k) of rows [j0, j0 + rows) (rows <= kRows; the others zero)
// into the tile; src: row j0's block holding weight c0. pf: what each block read prefetches,
// as an offset from it (the weights decoded next; 0: none).
inline void build_tile(uint32_t type, const Shape& sh, const uint8_t* src, int64_t row_bytes, int64_t k, int rows,
                       int64_t pf, VTile& t) {
  const int64_t nb = k / block_size(type), ng = k / 16;
  const bool kt = sh.sub != 0;
  if (rows == kRows && (type == kQ4_K || type == kQ5_K || type == kQ6_K || type == kIQ4_XS)) {
    switch (type) {
      case kQ4_K: build_q45k<false>(src, row_bytes, k, pf, t); return;
      case kQ5_K: build_q45k<true>(src, row_bytes, k, pf, t); return;
      case kQ6_K: build_q6k(src, row_bytes, k, pf, t); return;
      default: build_iq4xs(src, row_bytes, k, pf, t); return;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const RowOut o{t.rows.data() + r * k,
                   kt ? t.sc.data() + r * ng : nullptr,
                   kt ? t.mn.data() + r * ng : nullptr,
                   t.d.data() + r,
                   t.dmin.data() + r,
                   nullptr,  // (no Q4_1 / Q5_1 here)
                   pf,
                   kRows};
    if (r < rows) {
      decode_into(type, src + r * row_bytes, k, o);  // (dmin untouched where no mins: unread)
      continue;
    }
    std::memset(o.w, 0, static_cast<size_t>(k));
    for (int64_t b = 0; b < nb; ++b) o.d[b * kRows] = o.dmin[b * kRows] = 0.0f;
    if (kt) {
      std::memset(o.sc, 0, static_cast<size_t>(ng) * sizeof(int16_t));
      std::memset(o.mn, 0, static_cast<size_t>(ng) * sizeof(int16_t));
    }
  }
  // Dword g of each row into lane r of vector g: 16 x 16 dword transposes (the tail, when
  // a row's dwords are not a multiple of 16, by gathers).
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(sh.offset == 128 ? 0x80 : 0));
  const int64_t dwords = k / 4;
  int64_t g0 = 0;
  for (; g0 + 16 <= dwords; g0 += 16) {
    __m512i v[16];
    transpose16(reinterpret_cast<const uint8_t*>(t.rows.data()) + 4 * g0, k, v);
    for (int c = 0; c < 16; ++c) _mm512_storeu_si512(t.wq.data() + kRows * (g0 + c), _mm512_xor_si512(v[c], flip));
  }
  const __m512i idx = lane_offsets(k);
  for (int64_t g = g0; g < dwords; ++g) {
    const __m512i v = _mm512_i32gather_epi32(idx, t.rows.data() + 4 * g, 1);
    _mm512_storeu_si512(t.wq.data() + kRows * g, _mm512_xor_si512(v, flip));
  }
  // Sub-scales and mins of each row into lanes, by gathers of the rows' int16 (pairs).
  const __m512i idx16 = lane_offsets(2 * ng);
  if (kt) {
    const int per = sh.sub / 16;
    for (int64_t s = 0; s < k / sh.sub; ++s) {
      const __m512i v = _mm512_i32gather_epi32(idx16, t.sc.data() + s * per, 1);
      _mm512_storeu_si512(t.sc32.data() + s * kRows, _mm512_srai_epi32(_mm512_slli_epi32(v, 16), 16));
    }
  }
  if (sh.mins) {
    for (int64_t p = 0; p < k / 32; ++p)
      _mm512_storeu_si512(t.mnp.data() + p * kRows, _mm512_i32gather_epi32(idx16, t.mn.data() + 2 * p, 1));
  }
}

// 16 lanes of f32 sums, kept across the chunks of k.
struct alignas(64) Sums16 {
  float v[16];
};

// One activation row: int8 quants, block scales, offset x block sums (per 32 weights, or
// per sub-scale group of a K type), int16 sums of 16 quants (K types with mins).
struct VAct {
  const int8_t* q;
  const float* d;
  const int32_t* corr;
  const int16_t* bs16;
};

inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The dot kernels take kT tiles (1 or 2: 16 or 32 weight rows) against kNt activation rows:
// each activation broadcast serves every tile, each weight vector every activation row.
// out[u * kNt + n] lane r += row r of tile u · activation row n (a chunk of k at a time: the
// f32 steps continue in the generic path's order).

// 32-weight-block types (offset 128).
template <int kNt, int kT>
inline void dot32(const VTile* const* t, int64_t k, const VAct* a, __m512* out) {
  __m512 sum[kT][kNt];
  for (int u = 0; u < kT; ++u)
    for (int n = 0; n < kNt; ++n) sum[u][n] = out[u * kNt + n];
  for (int64_t b = 0; b < k / 32; ++b) {
    __m512i acc[kT][kNt];  // starts at -128 x the activations' block sum: the offset taken out
    for (int u = 0; u < kT; ++u)
      for (int n = 0; n < kNt; ++n) acc[u][n] = _mm512_set1_epi32(-a[n].corr[b]);
    for (int g = 0; g < 8; ++g) {
      __m512i wv[kT];
      for (int u = 0; u < kT; ++u) wv[u] = _mm512_loadu_si512(t[u]->wq.data() + (8 * b + g) * kRows);
      for (int n = 0; n < kNt; ++n) {
        const __m512i av = bcast4(a[n].q + 32 * b + 4 * g);
        for (int u = 0; u < kT; ++u) acc[u][n] = _mm512_dpbusd_epi32(acc[u][n], wv[u], av);
      }
    }
    for (int u = 0; u < kT; ++u) {
      const __m512 dv = _mm512_loadu_ps(t[u]->d.data() + kRows * b);
      for (int n = 0; n < kNt; ++n) {
        sum[u][n] = _mm512_add_ps(sum[u][n], _mm512_mul_ps(_mm512_cvtepi32_ps(acc[u][n]),
                                                           _mm512_mul_ps(dv, _mm512_set1_ps(a[n].d[b]))));
      }
    }
  }
  for (int u = 0; u < kT; ++u)
    for (int n = 0; n < kNt; ++n) out[u * kNt + n] = sum[u][n];
}

// K types (256-weight super-blocks): integer sub-scales per kSub weights, optional mins.
template <int kNt, int kT, int kSub, bool kMins, int kOffset>
inline void dotk(const VTile* const* t, int64_t k, const VAct* a, __m512* out) {
  constexpr int kGroups = 256 / kSub;
  __m512 sum[kT][kNt];
  for (int u = 0; u < kT; ++u)
    for (int n = 0; n < kNt; ++n) sum[u][n] = out[u * kNt + n];
  for (int64_t b = 0; b < k / 256; ++b) {
    __m512i isum[kT][kNt];
    for (int u = 0; u < kT; ++u)
      for (int n = 0; n < kNt; ++n) isum[u][n] = _mm512_setzero_si512();
    for (int s = 0; s < kGroups; ++s) {
      __m512i acc[kT][kNt];  // starts at -offset x the group's activation sum: the offset taken out
      for (int u = 0; u < kT; ++u)
        for (int n = 0; n < kNt; ++n)
          acc[u][n] = kOffset != 0 ? _mm512_set1_epi32(-a[n].corr[kGroups * b + s]) : _mm512_setzero_si512();
      const int64_t w0 = 256 * b + kSub * s;
      for (int g = 0; g < kSub / 4; ++g) {
        __m512i wv[kT];
        for (int u = 0; u < kT; ++u) wv[u] = _mm512_loadu_si512(t[u]->wq.data() + (w0 / 4 + g) * kRows);
        for (int n = 0; n < kNt; ++n) {
          const __m512i av = bcast4(a[n].q + w0 + 4 * g);
          for (int u = 0; u < kT; ++u) acc[u][n] = _mm512_dpbusd_epi32(acc[u][n], wv[u], av);
        }
      }
      for (int u = 0; u < kT; ++u) {
        const __m512i scv = _mm512_loadu_si512(t[u]->sc32.data() + (kGroups * b + s) * kRows);
        for (int n = 0; n < kNt; ++n) isum[u][n] = _mm512_add_epi32(isum[u][n], _mm512_mullo_epi32(acc[u][n], scv));
      }
    }
    for (int u = 0; u < kT; ++u) {
      const __m512 dv = _mm512_loadu_ps(t[u]->d.data() + kRows * b);
      if (kMins) {
        __m512i msum[kNt];
        for (int n = 0; n < kNt; ++n) msum[n] = _mm512_setzero_si512();
        for (int p = 0; p < 8; ++p) {
          const __m512i mv = _mm512_loadu_si512(t[u]->mnp.data() + (8 * b + p) * kRows);
          for (int n = 0; n < kNt; ++n) {
            int32_t pair;
            std::memcpy(&pair, a[n].bs16 + 16 * b + 2 * p, 4);
            msum[n] = _mm512_dpwssd_epi32(msum[n], mv, _mm512_set1_epi32(pair));
          }
        }
        const __m512 dmv = _mm512_loadu_ps(t[u]->dmin.data() + kRows * b);
        for (int n = 0; n < kNt; ++n) {
          const __m512 da = _mm512_set1_ps(a[n].d[b]);
          const __m512 d = _mm512_mul_ps(dv, da), dmin = _mm512_mul_ps(dmv, da);
          sum[u][n] = _mm512_add_ps(sum[u][n], _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[u][n])),
                                                             _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum[n]))));
        }
      } else {
        // The generic path subtracts dmin * msum = 0 * 0: x - 0 is x, bit for bit.
        for (int n = 0; n < kNt; ++n) {
          const __m512 d = _mm512_mul_ps(dv, _mm512_set1_ps(a[n].d[b]));
          sum[u][n] = _mm512_add_ps(sum[u][n], _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[u][n])));
        }
      }
    }
  }
  for (int u = 0; u < kT; ++u)
    for (int n = 0; n < kNt; ++n) out[u * kNt + n] = sum[u][n];
}

using VDotFn = void (*)(const VTile* const*, int64_t, const VAct*, __m512*);

template <int kNt, int kT>
inline VDotFn dot_for(uint32_t type) {
  switch (type) {
    case kQ4_K:
    case kQ5_K: return dotk<kNt, kT, 32, true, 0>;
    case kQ2_K: return dotk<kNt, kT, 16, true, 0>;
    case kQ6_K: return dotk<kNt, kT, 16, false, 32>;
    case kIQ4_XS: return dotk<kNt, kT, 32, false, 128>;
    case kQ3_K: return dotk<kNt, kT, 16, false, 128>;
    default: return dot32<kNt, kT>;
  }
}

// ---- AMX-INT8 (Sapphire Rapids and later): Q8_0 and Q4_K / Q5_K / Q6_K prefill on tiles -----
//
// The roles of the VNNI tiles swap: 16 weight rows are the A tile and 16 activation rows,
// laid out once per call as B tiles (dword-row j of a group of weights holds quants
// 4j..4j+3 of each token), are the B tile; tdpbssd (signed x signed) gives 16 x 16 integer
// dot products, c[row][token], lane t of a vector = token t. The integer sums are the VNNI
// kernels' and the f32 steps run in their order and operations, so y is the same bit for
// bit.
//   Q8_0: a product per 32-weight block (its scales differ), read in place: a block's 32
//   quants follow its f16 scale, so a tile load with the row stride reads 16 rows' blocks
//   straight from the file. Four C tiles pipeline the products (each taken three products
//   after it started). The vector steps on each product's 256 sums bound the speed.
//   Q4_K: sub-scale planes. Its integer sub-scale sc (0..63) is two 3-bit digits, sc =
//   8 h + l, and h x w, l x w (w 0..15: at most 105) are int8 "planes" of the weight rows,
//   so sum_s sc_s (sum over sub-block s of w q) = 8 (sum over k of plane_h q) + (sum of
//   plane_l q): the products need no per-sub-block scale, a tile product covers 64 weights,
//   the C tiles sum a 256-weight super-block and the vector steps run once per super-block
//   (8 times fewer). The planes are built per pass from the file's nibbles (a table lookup
//   per 64 weights), laid out an A tile (16 rows x 64, contiguous) per 64 weights. Q5_K is
//   the same with 5-bit weights (planes up to 217: unsigned, tdpbusd); Q6_K's signed 8-bit
//   sub-scales take four 2-bit digits, so four planes (a step's four C tiles pipelined in
//   halves).
// Measured on a Xeon with AMX against the VNNI tiles (kernels_bench, one thread), 64 / 256
// tokens: Q8_0 1.4-1.65x / 1.25x, Q4_K 1.35-1.65x / 1.55x, Q5_K 1.5x, Q6_K 1.05x / 1.15x
// (building four planes per pass costs about as much as their products at 64 tokens).
// Those ratios are against the VNNI tiles before their chunked build; against the chunked
// ones the K types' planes measured 0.72-1.16x at 16-64 tokens (inside this VM's noise)
// and 1.8-2.0x at 256, so the thresholds stay.
// Other types (Q4_0, Q5_0, IQ4_NL, IQ4_XS, Q2_K, Q3_K) keep the VNNI tiles.
namespace amx {

constexpr int64_t kTokens = 16;  // activation rows per B tile

// Whether the tiles take a call of m activation rows of `type` (a last token block is padded
// to 16 rows). Q8_0, read in place, from 8 rows (2.5x the VNNI tiles at 8: those decode and
// transpose the weights per call); the planes of the K types are built per pass, which
// Q4_K / Q5_K repay from 16 rows (0.84x at 8) and Q6_K's four from 64 (0.9x at 32).
inline bool handles(uint32_t type, int64_t m) {
  if (type == kQ8_0) return m >= 8;
  return (m >= kTokens && (type == kQ4_K || type == kQ5_K)) || (type == kQ6_K && m >= 64);
}

inline bool usable() { return ggml_amx_enabled() && amx_unavailable_reason() == nullptr; }

// Tiles 0-3: C (16 weight rows x 16 tokens, int32); 4-5: A (16 weight rows x step weights);
// 6-7: B (step / 4 dword-rows of 16 tokens). step: 32 (Q8_0) or 64 (Q4_K, Q5_K, Q6_K).
__attribute__((target("amx-tile,amx-int8"))) inline void configure(int step) {
  amx_tiles::TileConfig cfg;
  for (int t = 0; t < 4; ++t) cfg.set(t, 16, 64);
  for (int t = 0; t < 2; ++t) {
    cfg.set(4 + t, 16, step);
    cfg.set(6 + t, step / 4, 64);
  }
  amx_tiles::load_tiles(cfg);
}

__attribute__((target("amx-tile,amx-int8"))) inline void release() { _tile_release(); }

// Bytes whose data() is 64-byte aligned: a tile row is then one cache line, not two (tile
// loads of unaligned rows ran at half speed and less).
class Aligned64 {
 public:
  void resize(size_t n) {
    raw_.resize(n + 64);
    p_ = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(raw_.data()) + 63) & ~uintptr_t{63});
  }
  int8_t* data() { return p_; }
  const int8_t* data() const { return p_; }

 private:
  std::vector<int8_t> raw_;
  int8_t* p_ = nullptr;
};

// 16 weight rows as the kernels read them.
struct WTile {
  Aligned64 rows;  // Q8_0 of a last tile of fewer rows: [16][k] decoded (the rest zero)
  Aligned64 planes;  // Q4_K / Q5_K: [2][k / 64][16][64], plane l then plane h (Q6_K: [4]...)
  std::vector<int16_t> sc, mn;  // Q4_K / Q5_K: [16][k / 16]
  std::vector<float> d, dmin;  // [blocks][16]
  void resize(uint32_t type, int64_t k) {
    const int64_t nb = k / block_size(type);
    d.resize(static_cast<size_t>(16 * nb));
    dmin.resize(static_cast<size_t>(16 * nb));
    if (type == kQ8_0) {
      rows.resize(static_cast<size_t>(16 * k));
      return;
    }
    planes.resize(static_cast<size_t>((type == kQ6_K ? 4 : 2) * 16 * k));
    if (type != kQ6_K) {  // (Q6_K's scales go straight into its planes)
      sc.resize(static_cast<size_t>(k));
      mn.resize(static_cast<size_t>(k));
    }
  }
};

// One block of 16 tokens of the call's activations: B tiles, and per token the block
// scales and (Q4_K) the sums for the mins (lane t = token t; zero past the last token).
struct TokenBlock {
  const int8_t* b;  // [k / 4][16][4]: any 4 j consecutive dword-rows are a B tile of 4 j weights
  const float* d;  // [scale block][16]
  const int32_t* bs;  // [k / 32][16]: int16 pairs, the sums of 16 quants 2p and 2p + 1
};

// sum[r] lane t -> y[t * ldy + r] for tokens t < valid, rows r < rows (a transpose in memory).
inline void store_out(const __m512* sum, float* y, int64_t ldy, int valid, int rows) {
  alignas(64) float out[16][16];
  for (int r = 0; r < 16; ++r) _mm512_store_ps(out[r], sum[r]);
  const __m512i col = lane_offsets(16);
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
  for (int t = 0; t < valid; ++t)
    _mm512_mask_storeu_ps(y + t * ldy, mask,
                          _mm512_i32gather_ps(_mm512_add_epi32(col, _mm512_set1_epi32(t)), &out[0][0], 4));
}

// ---- Q8_0 ----

// Where the Q8_0 products read: block g's quants at a + ags * g (16 rows, lda apart), its
// activations at b + 512 * g (a B tile). pf: the next tile's first row (rows lda apart)
// when these products should stream it in, else null.
struct Src {
  const int8_t* a;
  int64_t lda, ags;
  const int8_t* b;
  const int8_t* pf;
};

// issue<C> starts the products of block g in C tile C; take<C> stores them to c:
// c[16 * row + token]. (The tile intrinsics take their register numbers as literals, hence
// the macro; A and B alternate between two registers each.)
template <int C>
inline void issue(const Src& s, int64_t g);
template <int C>
inline void take(int32_t* c);

#define INFERA_AMX_STAGE(C, A, B)                                                              \
  template <>                                                                                  \
  __attribute__((target("amx-tile,amx-int8"))) inline void issue<C>(const Src& s, int64_t g) { \
    _tile_loadd(A, s.a + s.ags * g, s.lda);                                                    \
    _tile_loadd(B, s.b + 512 * g, 64);                                                         \
    _tile_zero(C);                                                                             \
    _tile_dpbssd(C, A, B);                                                                     \
  }                                                                                            \
  template <>                                                                                  \
  __attribute__((target("amx-tile,amx-int8"))) inline void take<C>(int32_t * c) {              \
    _tile_stored(C, c, 64);                                                                    \
  }
INFERA_AMX_STAGE(0, 4, 6)
INFERA_AMX_STAGE(1, 5, 7)
INFERA_AMX_STAGE(2, 4, 6)
INFERA_AMX_STAGE(3, 5, 7)
#undef INFERA_AMX_STAGE

// y[t * ldy + r] for tokens t < valid and rows r < rows: the 16 tokens of tb against a
// Q8_0 tile, dot32's f32 steps per block. (The pipeline and the steps written out here as
// macros, not through a lambda: the 16 sums then stay in registers; captured by a lambda
// they lived in memory.)
__attribute__((target("amx-tile,amx-int8"))) inline void tile_q8_0(const WTile& w, const Src& src, int64_t k,
                                                                   const TokenBlock& tb, float* y, int64_t ldy,
                                                                   int valid, int rows) {
  __m512 sum[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) sum[r] = _mm512_setzero_ps();
  alignas(64) int32_t c[2][256];
  const int64_t groups = k / 32;
  const float* wd = w.d.data();
#define INFERA_Q8_USE(B, CB)                                                                      \
  {                                                                                               \
    const __m512 da = _mm512_loadu_ps(tb.d + 16 * (B));                                           \
    const float* dw = wd + 16 * (B);                                                              \
    _Pragma("GCC unroll 16") for (int r = 0; r < 16; ++r) sum[r] =                                \
        _mm512_add_ps(sum[r], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((CB) + 16 * r)), \
                                            _mm512_mul_ps(_mm512_set1_ps(dw[r]), da)));           \
  }
  issue<0>(src, 0);
  if (groups > 1) issue<1>(src, 1);
  if (groups > 2) issue<2>(src, 2);
#define INFERA_Q8_STAGE(I)                                                                               \
  {                                                                                                      \
    const int64_t gi = g + (I);                                                                          \
    if (gi < groups) {                                                                                   \
      if (gi + 3 < groups) issue<((I) + 3) % 4>(src, gi + 3);                                            \
      if (src.pf != nullptr)                                                                             \
        for (int r = 0; r < 16; ++r)                                                                     \
          _mm_prefetch(reinterpret_cast<const char*>(src.pf + r * src.lda + src.ags * gi), _MM_HINT_T1); \
      take<I>(c[(I) % 2]);                                                                               \
      if (gi > 0) INFERA_Q8_USE(gi - 1, c[((I) + 1) % 2])                                                \
    }                                                                                                    \
  }
  for (int64_t g = 0; g < groups; g += 4) {
    INFERA_Q8_STAGE(0)
    INFERA_Q8_STAGE(1)
    INFERA_Q8_STAGE(2)
    INFERA_Q8_STAGE(3)
  }
#undef INFERA_Q8_STAGE
  INFERA_Q8_USE(groups - 1, c[(groups - 1) % 2])
#undef INFERA_Q8_USE
  __m512 out[16];  // (a copy: passing sum's address would keep sum in memory throughout)
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) out[r] = sum[r];
  store_out(out, y, ldy, valid, rows);
}

// Rows [j0, j0 + rows) of a Q8_0 matrix into w: the block scales, and where the products
// read the quants (a whole tile in place; a last tile of fewer rows decoded, zero rows after).
inline Src prepare_q8_0(const uint8_t* base, int64_t row_bytes, int64_t k, int64_t j0, int rows, bool next, WTile& w) {
  const int64_t nb = k / 32;
  const uint8_t* b0 = base + j0 * row_bytes;
  if (rows == 16) {
    const __m512i offs = lane_offsets(row_bytes);
    for (int64_t b = 0; b < nb; ++b) {
      // (A block's f16 scale is its first 2 bytes; the gather reads 4, inside the block.)
      const __m512i h = _mm512_i32gather_epi32(offs, b0 + 34 * b, 1);
      _mm512_storeu_ps(w.d.data() + 16 * b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
    }
    return Src{reinterpret_cast<const int8_t*>(b0 + 2), row_bytes, 34, nullptr,
               next ? reinterpret_cast<const int8_t*>(b0 + 16 * row_bytes) : nullptr};
  }
  for (int r = 0; r < 16; ++r) {
    int8_t* q = w.rows.data() + r * k;
    for (int64_t b = 0; b < nb; ++b) {
      if (r < rows) {
        const uint8_t* blk = b0 + r * row_bytes + 34 * b;
        w.d[16 * b + r] = half_f16c(blk);
        std::memcpy(q + 32 * b, blk + 2, 32);
      } else {
        w.d[16 * b + r] = 0.0f;
        std::memset(q + 32 * b, 0, 32);
      }
    }
  }
  return Src{w.rows.data(), k, 32, nullptr, nullptr};
}

// ---- Q4_K ----

// Rows [j0, j0 + rows) of a Q4_K (kFive false) or Q5_K matrix into w (the planes, scales
// and mins; rows past `rows` zero) straight from the file's blocks: a block's 32 bytes of
// nibbles are 64 weights (low nibbles sub-block 2c, high 2c + 1; Q5_K adds bit 2c / 2c + 1
// of each of its 32 high-bit bytes as bit 4), and digit x weight is a table lookup: Q4_K's
// 16 values by vpshufb, Q5_K's 32 by vpermb (AVX512-VBMI, which every CPU with AMX has),
// the tables for the digits 0..7 built once.
template <bool kFive>
__attribute__((target("avx512vbmi"))) inline void prepare_q45_k(const uint8_t* base, int64_t row_bytes, int64_t k,
                                                                int64_t j0, int rows, bool next, WTile& w) {
  alignas(64) static const struct Luts {
    __m512i t[8];  // t[d] byte i: (i % (kFive ? 32 : 16)) * d
    Luts() {
      for (int d = 0; d < 8; ++d) {
        alignas(64) uint8_t v[64];
        for (int i = 0; i < 64; ++i) v[i] = static_cast<uint8_t>((i % (kFive ? 32 : 16)) * d);
        t[d] = _mm512_load_si512(v);
      }
    }
  } luts;
  constexpr int64_t kBytes = kFive ? 176 : 144, kQs = kFive ? 48 : 16;
  const int64_t ng = k / 16, nb = k / 256;
  const __m256i m4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  constexpr __mmask64 kHigh = 0xFFFFFFFF00000000ull;
  for (int r = 0; r < 16; ++r) {
    int16_t* sc = w.sc.data() + r * ng;
    int16_t* mn = w.mn.data() + r * ng;
    if (r >= rows) {  // past the last row: zero planes and scales
      for (int64_t c = 0; c < k / 64; ++c) {
        _mm512_store_si512(w.planes.data() + (c * 16 + r) * 64, _mm512_setzero_si512());
        _mm512_store_si512(w.planes.data() + 16 * k + (c * 16 + r) * 64, _mm512_setzero_si512());
      }
      for (int64_t i = 0; i < nb; ++i) w.d[i * 16 + r] = w.dmin[i * 16 + r] = 0.0f;
      std::memset(sc, 0, static_cast<size_t>(ng) * sizeof(int16_t));
      std::memset(mn, 0, static_cast<size_t>(ng) * sizeof(int16_t));
      continue;
    }
    const uint8_t* b = base + (j0 + r) * row_bytes;
    for (int64_t i = 0; i < nb; ++i, b += kBytes) {
      if (next) prefetch_block(b + 16 * row_bytes, static_cast<int>(kBytes));
      w.d[i * 16 + r] = half_f16c(b);
      w.dmin[i * 16 + r] = half_f16c(b + 2);
      k4_scales(b + 4, sc + 16 * i, mn + 16 * i);
      const __m256i qh = kFive ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)) : _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kQs + 32 * c));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (kFive) {
          lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c), 4), bit4));
          hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c + 1), 4), bit4));
        }
        const __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        const int s0 = sc[16 * i + 4 * c], s1 = sc[16 * i + 4 * c + 2];  // sub-blocks 2c, 2c + 1
        int8_t* dst = w.planes.data() + ((4 * i + c) * 16 + r) * 64;
        __m512i pl, ph;
        if constexpr (kFive) {
          pl = _mm512_mask_permutexvar_epi8(_mm512_permutexvar_epi8(u, luts.t[s0 & 7]), kHigh, u, luts.t[s1 & 7]);
          ph = _mm512_mask_permutexvar_epi8(_mm512_permutexvar_epi8(u, luts.t[s0 >> 3]), kHigh, u, luts.t[s1 >> 3]);
        } else {
          pl = _mm512_shuffle_epi8(_mm512_mask_blend_epi64(0xF0, luts.t[s0 & 7], luts.t[s1 & 7]), u);
          ph = _mm512_shuffle_epi8(_mm512_mask_blend_epi64(0xF0, luts.t[s0 >> 3], luts.t[s1 >> 3]), u);
        }
        _mm512_store_si512(dst, pl);
        _mm512_store_si512(dst + 16 * k, ph);
      }
    }
  }
}

// Rows [j0, j0 + rows) of a Q6_K matrix into w as four planes (rows past `rows` zero). Its
// sub-scales are signed bytes (-128..127) and its weights w = u - 32 (-32..31): four 2-bit
// digits, sc = 64 d3 + 16 d2 + 4 d1 + d0 (d3 signed: b6 - 2 b7), keep every digit x w
// within a byte (|.| <= 96). The 6-bit u put together from ql / qh as dec_q6_k does; per 64
// weights the four sub-scales (one per 16 weights) are spread over the vector's 16-byte
// lanes and each of their bits becomes a byte mask (vptestmb), so digit x w is w and 2 w
// added under masks: no table per scale, no scalar work per weight.
inline void prepare_q6_k(const uint8_t* base, int64_t row_bytes, int64_t k, int64_t j0, int rows, bool next, WTile& w) {
  const int64_t nb = k / 256;
  const __m256i m4 = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
  const __m512i c32 = _mm512_set1_epi8(32);
  for (int r = 0; r < 16; ++r) {
    if (r >= rows) {  // past the last row: zero planes and scales
      for (int p = 0; p < 4; ++p)
        for (int64_t c = 0; c < k / 64; ++c)
          _mm512_store_si512(w.planes.data() + p * 16 * k + (c * 16 + r) * 64, _mm512_setzero_si512());
      for (int64_t i = 0; i < nb; ++i) w.d[i * 16 + r] = 0.0f;
      continue;
    }
    const uint8_t* b = base + (j0 + r) * row_bytes;
    for (int64_t i = 0; i < nb; ++i, b += 210) {
      if (next) prefetch_block(b + 16 * row_bytes, 210);
      w.d[i * 16 + r] = half_f16c(b + 208);
      const __m512i scales = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
      for (int h = 0; h < 2; ++h) {
        const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
        const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
        const __m256i lo4[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
        __m256i u[4];
        for (int g = 0; g < 4; ++g)
          u[g] = _mm256_or_si256(lo4[g], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), three), 4));
        for (int c = 0; c < 2; ++c) {  // 64-weight chunk 2h + c of the block: sub-blocks 8h + 4c + j
          const __m512i wv =
              _mm512_sub_epi8(_mm512_inserti64x4(_mm512_castsi256_si512(u[2 * c]), u[2 * c + 1], 1), c32);
          const __m512i w2 = _mm512_add_epi8(wv, wv);
          const int s0 = 8 * h + 4 * c;
          const __m512i sv =
              _mm512_shuffle_epi8(scales,
                                  _mm512_set_epi64(0x0101010101010101ll * (s0 + 3), 0x0101010101010101ll * (s0 + 3),
                                                   0x0101010101010101ll * (s0 + 2), 0x0101010101010101ll * (s0 + 2),
                                                   0x0101010101010101ll * (s0 + 1), 0x0101010101010101ll * (s0 + 1),
                                                   0x0101010101010101ll * s0, 0x0101010101010101ll * s0));
          int8_t* dst = w.planes.data() + ((4 * i + 2 * h + c) * 16 + r) * 64;
          for (int p = 0; p < 4; ++p) {
            const __mmask64 lo = _mm512_test_epi8_mask(sv, _mm512_set1_epi8(static_cast<char>(1 << (2 * p))));
            const __mmask64 hi = _mm512_test_epi8_mask(sv, _mm512_set1_epi8(static_cast<char>(1 << (2 * p + 1))));
            const __m512i base_w = _mm512_maskz_mov_epi8(lo, wv);
            const __m512i v = p == 3 ? _mm512_mask_sub_epi8(base_w, hi, base_w, w2)  // (b6 - 2 b7) w
                                     : _mm512_mask_add_epi8(base_w, hi, base_w, w2);  // (b0 + 2 b1) w
            _mm512_store_si512(dst + p * 16 * k, v);
          }
        }
      }
    }
  }
}

// Half a step of the Q6_K pipeline (super-block b x a token block): planes 2H, 2H + 1 in C
// tiles 2H, 2H + 1, B tile B (6 or 7 by the step's parity); take_halfH stores them to
// c[2H], c[2H + 1]. Half-steps alternate between the two pairs of C tiles, so step s + 1's
// first half is issued before step s's second half is taken, and its second half before
// step s's f32 steps run.
#define INFERA_AMX_HALF(H, C0, C1, B, NAME)                                                                    \
  __attribute__((target("amx-tile,amx-int8"))) inline void NAME(const int8_t* pl, int64_t k, const int8_t* bq, \
                                                                int64_t b) {                                   \
    const int64_t w0 = 256 * b;                                                                                \
    _tile_zero(C0);                                                                                            \
    _tile_zero(C1);                                                                                            \
    for (int ch = 0; ch < 4; ++ch) {                                                                           \
      const int8_t* a = pl + 2 * (H)*16 * k + (w0 + 64 * ch) * 16;                                             \
      _tile_loadd(B, bq + (w0 + 64 * ch) * 16, 64);                                                            \
      _tile_loadd(4, a, 64);                                                                                   \
      _tile_dpbssd(C0, 4, B);                                                                                  \
      _tile_loadd(5, a + 16 * k, 64);                                                                          \
      _tile_dpbssd(C1, 5, B);                                                                                  \
    }                                                                                                          \
  }
INFERA_AMX_HALF(0, 0, 1, 6, issue_half0_b6)
INFERA_AMX_HALF(0, 0, 1, 7, issue_half0_b7)
INFERA_AMX_HALF(1, 2, 3, 6, issue_half1_b6)
INFERA_AMX_HALF(1, 2, 3, 7, issue_half1_b7)
#undef INFERA_AMX_HALF

__attribute__((target("amx-tile,amx-int8"))) inline void take_half0(int32_t (*c)[256]) {
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
}
__attribute__((target("amx-tile,amx-int8"))) inline void take_half1(int32_t (*c)[256]) {
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
}

// A step of the Q4_K / Q5_K pipeline: one super-block (b) x one token block (B tiles bq),
// the plane-l sums in C tile C0 and plane-h's in C1, with B tile B (Q5_K's planes, up to
// 217, are unsigned: tdpbusd); take_stepS stores them to
// c[0], c[1]. Two sets of tiles (S = 0, 1) alternate, so step s + 1's products are issued
// before step s's sums are taken: the tile unit works while the vector units run step s's
// f32 steps.
#define INFERA_AMX_DP(C, A, B) \
  if constexpr (kUnsigned) {   \
    _tile_dpbusd(C, A, B);     \
  } else {                     \
    _tile_dpbssd(C, A, B);     \
  }
#define INFERA_AMX_STEP(S, C0, C1, B)                                                                   \
  template <bool kUnsigned>                                                                             \
  __attribute__((target("amx-tile,amx-int8"))) inline void issue_step##S(const int8_t* pl, int64_t k,   \
                                                                         const int8_t* bq, int64_t b) { \
    const int64_t w0 = 256 * b;                                                                         \
    _tile_zero(C0);                                                                                     \
    _tile_zero(C1);                                                                                     \
    for (int ch = 0; ch < 4; ++ch) {                                                                    \
      const int8_t* a = pl + (w0 + 64 * ch) * 16;                                                       \
      _tile_loadd(B, bq + (w0 + 64 * ch) * 16, 64);                                                     \
      _tile_loadd(4, a, 64);                                                                            \
      INFERA_AMX_DP(C0, 4, B)                                                                           \
      _tile_loadd(5, a + 16 * k, 64);                                                                   \
      INFERA_AMX_DP(C1, 5, B)                                                                           \
    }                                                                                                   \
  }                                                                                                     \
  __attribute__((target("amx-tile,amx-int8"))) inline void take_step##S(int32_t(*c)[256]) {             \
    _tile_stored(C0, c[0], 64);                                                                         \
    _tile_stored(C1, c[1], 64);                                                                         \
  }
INFERA_AMX_STEP(0, 0, 1, 6)
INFERA_AMX_STEP(1, 2, 3, 7)
#undef INFERA_AMX_STEP
#undef INFERA_AMX_DP

// Token blocks per pass over a tile (the Q4_K sums of a pass: 32 KB).
constexpr int64_t kMaxPass = 32;

// The B tiles of step s (super-block s / ntb, token block s % ntb: 4 KB) from L2 into L1.
inline void prefetch_step(const TokenBlock* tbs, int64_t ntb, int64_t s) {
  const int8_t* nb = tbs[s % ntb].b + 256 * (s / ntb) * 16;
  for (int l = 0; l < 64; ++l) _mm_prefetch(reinterpret_cast<const char*>(nb + 64 * l), _MM_HINT_T0);
}

// The plane kernels' sums of a pass, sums[tb][r] lane t, to y[(16 tb + t) * ldy + r].
inline void store_sums(const float (*sums)[16][16], int64_t ntb, float* y, int64_t ldy, int64_t m, int rows) {
  for (int64_t tb = 0; tb < ntb; ++tb) {
    __m512 sum[16];
    for (int r = 0; r < 16; ++r) sum[r] = _mm512_load_ps(sums[tb][r]);
    store_out(sum, y + tb * 16 * ldy, ldy, static_cast<int>(std::min<int64_t>(16, m - 16 * tb)), rows);
  }
}

// y[(16 * tb + t) * ldy + r] (tokens < m, rows r < rows) for the ntb token blocks of a pass
// against a Q4_K / Q5_K tile: dotk's f32 steps per super-block on isum = c_l + (c_h << 3).
// Steps (super-block b, token block tb) in order, super-blocks outer: a super-block's
// planes (8 KB) stay in L1 while the token blocks' B tiles pass.
template <bool kUnsigned>
__attribute__((target("amx-tile,amx-int8"))) inline void tile_q45_k(const WTile& w, int64_t k, const TokenBlock* tbs,
                                                                    int64_t ntb, float* y, int64_t ldy, int64_t m,
                                                                    int rows) {
  alignas(64) int32_t c[2][2][256];
  alignas(64) float sums[kMaxPass][16][16];
  std::memset(sums, 0, static_cast<size_t>(ntb) * sizeof(sums[0]));
  const int64_t steps = k / 256 * ntb;
  const int8_t* pl = w.planes.data();
  const auto issue_step = [&](int64_t s) {
    if (s % 2 == 0)
      issue_step0<kUnsigned>(pl, k, tbs[s % ntb].b, s / ntb);
    else
      issue_step1<kUnsigned>(pl, k, tbs[s % ntb].b, s / ntb);
  };
  issue_step(0);
  for (int64_t s = 0; s < steps; ++s) {
    if (s + 1 < steps) issue_step(s + 1);
    if (s + 2 < steps) prefetch_step(tbs, ntb, s + 2);  // the B tiles after next, meanwhile
    int32_t(*ct)[256] = c[s % 2];
    if (s % 2 == 0)
      take_step0(ct);
    else
      take_step1(ct);
    const int64_t b = s / ntb, tb = s % ntb;
    const TokenBlock& blk = tbs[tb];
    const float* dw = w.d.data() + 16 * b;
    const float* dmw = w.dmin.data() + 16 * b;
    const __m512 da = _mm512_loadu_ps(blk.d + 16 * b);
    for (int r = 0; r < 16; ++r) {
      const __m512i isum =
          _mm512_add_epi32(_mm512_load_si512(ct[0] + 16 * r), _mm512_slli_epi32(_mm512_load_si512(ct[1] + 16 * r), 3));
      __m512i msum = _mm512_setzero_si512();
      for (int p = 0; p < 8; ++p) {
        int32_t pair;
        std::memcpy(&pair, w.mn.data() + r * (k / 16) + 16 * b + 2 * p, 4);
        msum = _mm512_dpwssd_epi32(msum, _mm512_set1_epi32(pair), _mm512_loadu_si512(blk.bs + (8 * b + p) * 16));
      }
      const __m512 d = _mm512_mul_ps(_mm512_set1_ps(dw[r]), da);
      const __m512 dmin = _mm512_mul_ps(_mm512_set1_ps(dmw[r]), da);
      const __m512 add =
          _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum)), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum)));
      _mm512_store_ps(sums[tb][r], _mm512_add_ps(_mm512_load_ps(sums[tb][r]), add));
    }
  }
  store_sums(sums, ntb, y, ldy, m, rows);
}

// y as tile_q45_k computes it, for a Q6_K tile: dotk's f32 steps per super-block (no mins)
// on isum = c0 + (c1 << 2) + (c2 << 4) + (c3 << 6).
__attribute__((target("amx-tile,amx-int8"))) inline void tile_q6_k(const WTile& w, int64_t k, const TokenBlock* tbs,
                                                                   int64_t ntb, float* y, int64_t ldy, int64_t m,
                                                                   int rows) {
  alignas(64) int32_t c[4][256];
  alignas(64) float sums[kMaxPass][16][16];
  std::memset(sums, 0, static_cast<size_t>(ntb) * sizeof(sums[0]));
  const int64_t steps = k / 256 * ntb;
  const int8_t* pl = w.planes.data();
  const auto half = [&](int h, int64_t s) {
    const int8_t* bq = tbs[s % ntb].b;
    const int64_t b = s / ntb;
    if (h == 0)
      (s % 2 == 0 ? issue_half0_b6 : issue_half0_b7)(pl, k, bq, b);
    else
      (s % 2 == 0 ? issue_half1_b6 : issue_half1_b7)(pl, k, bq, b);
  };
  half(0, 0);
  half(1, 0);
  for (int64_t s = 0; s < steps; ++s) {
    take_half0(c);
    if (s + 1 < steps) half(0, s + 1);
    take_half1(c);
    if (s + 1 < steps) half(1, s + 1);
    if (s + 2 < steps) prefetch_step(tbs, ntb, s + 2);  // the B tiles after next, meanwhile
    const int64_t b = s / ntb, tb = s % ntb;
    const float* dw = w.d.data() + 16 * b;
    const __m512 da = _mm512_loadu_ps(tbs[tb].d + 16 * b);
    for (int r = 0; r < 16; ++r) {
      __m512i isum = _mm512_load_si512(c[0] + 16 * r);
      isum = _mm512_add_epi32(isum, _mm512_slli_epi32(_mm512_load_si512(c[1] + 16 * r), 2));
      isum = _mm512_add_epi32(isum, _mm512_slli_epi32(_mm512_load_si512(c[2] + 16 * r), 4));
      isum = _mm512_add_epi32(isum, _mm512_slli_epi32(_mm512_load_si512(c[3] + 16 * r), 6));
      const __m512 d = _mm512_mul_ps(_mm512_set1_ps(dw[r]), da);
      _mm512_store_ps(sums[tb][r],
                      _mm512_add_ps(_mm512_load_ps(sums[tb][r]), _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum))));
    }
  }
  store_sums(sums, ntb, y, ldy, m, rows);
}

// y[i * ldy + (j - n0)] for rows j in [n0, n1), activation rows [0, m), when handles(type, m).
inline void matmul_rows(uint32_t type, const uint8_t* base, int64_t row_bytes, int64_t k, const Activations& a,
                        const int16_t* bs16, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const bool q4k = type == kQ4_K || type == kQ5_K;  // (Q5_K as Q4_K, its planes unsigned)
  const bool planes = q4k || type == kQ6_K;
  const int64_t dstride = planes ? k / 256 : k / 32;
  const int64_t tbs = (m + kTokens - 1) / kTokens;
  // The activations per block of 16 tokens, once per call (packed by the threads below).
  static thread_local Aligned64 bq;
  static thread_local std::vector<float> bd;
  static thread_local std::vector<int32_t> bbs;
  bq.resize(static_cast<size_t>(tbs * 16 * k));
  bd.assign(static_cast<size_t>(tbs * 16 * dstride), 0.0f);
  if (q4k) bbs.assign(static_cast<size_t>(tbs * 16 * (k / 32)), 0);
  int8_t* bq_p = bq.data();  // (thread_local: the pointers taken here, for every thread)
  float* bd_p = bd.data();
  int32_t* bbs_p = bbs.data();
  const int8_t* aq = a.q.data();
  const float* ad = a.d.data();
  // Token block tb of the activations as B tiles, its scales and sums lane per token.
  const auto pack = [&](int64_t tb) {
    int32_t* q4 = reinterpret_cast<int32_t*>(bq_p + tb * 16 * k);  // [k / 4][16]
    // A whole block's quants by 16 x 16 dword transposes; a last partial one (and the
    // dwords past the last whole 16) one dword at a time.
    const bool whole = tb * 16 + 16 <= m;
    int64_t j0 = 0;
    if (whole) {
      for (; j0 + 16 <= k / 4; j0 += 16) {
        __m512i v[16];
        transpose16(reinterpret_cast<const uint8_t*>(aq + tb * 16 * k + 4 * j0), k, v);
        for (int c = 0; c < 16; ++c) _mm512_store_si512(q4 + (j0 + c) * 16, v[c]);
      }
    }
    for (int t = 0; t < 16; ++t) {
      const int64_t i = tb * 16 + t;
      if (i >= m) {
        for (int64_t j = 0; j < k / 4; ++j) q4[j * 16 + t] = 0;
        continue;
      }
      const int8_t* q = aq + i * k;
      for (int64_t j = j0; j < k / 4; ++j) std::memcpy(q4 + j * 16 + t, q + 4 * j, 4);
      for (int64_t b = 0; b < dstride; ++b) bd_p[(tb * dstride + b) * 16 + t] = ad[i * dstride + b];
      if (q4k)
        for (int64_t p = 0; p < k / 32; ++p)
          std::memcpy(bbs_p + (tb * (k / 32) + p) * 16 + t, bs16 + i * (k / 16) + 2 * p, 4);
    }
  };
  const int64_t tiles = (n1 - n0 + 15) / 16;
  const int threads = omp_in_parallel() ? 1 : num_threads();
  // Token blocks per pass over the tiles: about 1 MiB of B tiles (they stay in L2 while the
  // thread's tiles pass over them; each tile is prepared once per pass).
  const int64_t pass = std::min(kMaxPass, std::max<int64_t>(4, (int64_t{1} << 20) / (16 * k)));
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(threads, tiles)))
  {
#pragma omp for schedule(static)
    for (int64_t tb = 0; tb < tbs; ++tb) pack(tb);
    configure(planes ? 64 : 32);
    static thread_local WTile w;
    w.resize(type, k);
    for (int64_t t0 = 0; t0 < tbs; t0 += pass) {
      const int64_t t1 = std::min(tbs, t0 + pass);
      // (dynamic: the two threads of a VM's cores often run at different speeds)
#pragma omp for schedule(dynamic, 2) nowait
      for (int64_t tt = 0; tt < tiles; ++tt) {
        const int64_t j0 = n0 + tt * 16;
        const int rows = static_cast<int>(std::min<int64_t>(16, n1 - j0));
        const bool next = j0 + 32 <= n1;  // a whole tile follows: its rows are prefetched
        float* yt = y + t0 * 16 * ldy + (j0 - n0);
        if (planes) {
          switch (type) {
            case kQ4_K: prepare_q45_k<false>(base, row_bytes, k, j0, rows, next, w); break;
            case kQ5_K: prepare_q45_k<true>(base, row_bytes, k, j0, rows, next, w); break;
            default: prepare_q6_k(base, row_bytes, k, j0, rows, next, w); break;
          }
          TokenBlock blks[kMaxPass];
          for (int64_t tb = t0; tb < t1; ++tb)
            blks[tb - t0] =
                TokenBlock{bq_p + tb * 16 * k, bd_p + tb * 16 * dstride, q4k ? bbs_p + tb * 16 * (k / 32) : nullptr};
          switch (type) {
            case kQ4_K: tile_q45_k<false>(w, k, blks, t1 - t0, yt, ldy, m - t0 * 16, rows); break;
            case kQ5_K: tile_q45_k<true>(w, k, blks, t1 - t0, yt, ldy, m - t0 * 16, rows); break;
            default: tile_q6_k(w, k, blks, t1 - t0, yt, ldy, m - t0 * 16, rows); break;
          }
          continue;
        }
        Src src = prepare_q8_0(base, row_bytes, k, j0, rows, next, w);
        const int8_t* pf = src.pf;  // the next tile streamed in during the first token block
        for (int64_t tb = t0; tb < t1; ++tb) {
          src.b = bq_p + tb * 16 * k;
          src.pf = tb == t0 ? pf : nullptr;
          const TokenBlock blk{src.b, bd_p + tb * 16 * dstride, nullptr};
          tile_q8_0(w, src, k, blk, yt + (tb - t0) * 16 * ldy, ldy,
                    static_cast<int>(std::min<int64_t>(16, m - tb * 16)), rows);
        }
      }
    }
    release();
  }
}

}  // namespace amx

// y[i * ldy + (j - n0)] for rows j in [n0, n1), activation rows [0, m). bs16: the int16
// sums of 16 quants (K types with mins or an offset), else null.
inline void matmul_rows(uint32_t type, const uint8_t* base, int64_t row_bytes, int64_t k, const Activations& a,
                        const int16_t* bs16, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (amx::handles(type, m) && amx::usable()) {
    amx::matmul_rows(type, base, row_bytes, k, a, bs16, m, n0, n1, y, ldy);
    return;
  }
  const Shape sh = shape_of(type);
  const int64_t nb = k / block_size(type);
  // offset x the activations' sums per 32 weights or per sub-scale group, once per call.
  static thread_local std::vector<int32_t> corr;
  const int64_t per_row = sh.sub != 0 ? k / sh.sub : k / 32;
  if (sh.offset != 0) {
    corr.resize(static_cast<size_t>(m * per_row));
    for (int64_t i = 0; i < m; ++i) {
      int32_t* c = corr.data() + i * per_row;
      if (sh.sub == 0) {
        const int8_t* q = a.q.data() + i * k;
        for (int64_t b = 0; b < per_row; ++b) {
          int32_t s = 0;
          for (int j = 0; j < 32; ++j) s += q[32 * b + j];
          c[b] = sh.offset * s;
        }
      } else {
        const int32_t* bs = a.bsums.data() + i * (k / 16);
        const int per = sh.sub / 16;
        for (int64_t g = 0; g < per_row; ++g) {
          int32_t s = 0;
          for (int j = 0; j < per; ++j) s += bs[per * g + j];
          c[g] = sh.offset * s;
        }
      }
    }
  }
  const int32_t* corr_p = corr.data();  // (thread_local: the pointer taken here, for every thread)
  // [tiles per call: 0 for one, 1 for two][activation rows 4, 2, 1]
  const VDotFn dots[2][3] = {{dot_for<4, 1>(type), dot_for<2, 1>(type), dot_for<1, 1>(type)},
                             {dot_for<4, 2>(type), dot_for<2, 2>(type), dot_for<1, 2>(type)}};
  const int64_t tiles = (n1 - n0 + kRows - 1) / kRows;
  // Threads take pairs of tiles (32 weight rows; a last odd tile alone).
  const int64_t pairs = (tiles + 1) / 2;
  const int threads = omp_in_parallel() ? 1 : num_threads();
  const int64_t dstride = sh.sub != 0 ? k / 256 : k / 32;
  // Activation rows per pass over the tiles: about 1 MiB of int8 quants (they stay in L2
  // while the thread's tiles pass over them; each tile is decoded once per pass).
  const int64_t row_block = std::max<int64_t>(kRowBlock, (int64_t{1} << 20) / k);
  // Weights per chunk: a pair of tiles is decoded and multiplied kChunk weights at a time,
  // so its decoded chunk (16 KiB) stays in L1 between the build and the dot products.
  const int64_t bsize = block_size(type), chunk = std::min(k, kChunk), block_bytes = row_bytes / nb;
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(threads, pairs)))
  {
    static thread_local VTile tl[2];
    static thread_local std::vector<Sums16> acc;  // [token group][tile][token]: the f32 sums
    tl[0].resize(chunk, chunk / bsize, sh);
    tl[1].resize(chunk, chunk / bsize, sh);
    acc.resize(static_cast<size_t>(2 * std::min(m, row_block)));
    const VTile* const tp[2] = {&tl[0], &tl[1]};
    const auto act = [&](int64_t i, int64_t c0) {
      return VAct{a.q.data() + i * k + c0, a.d.data() + i * dstride + c0 / bsize,
                  corr_p + i * per_row + c0 / (sh.sub != 0 ? sh.sub : 32),
                  bs16 != nullptr ? bs16 + i * (k / 16) + c0 / 16 : nullptr};
    };
    for (int64_t i0 = 0; i0 < m; i0 += row_block) {
      const int64_t i1 = std::min(m, i0 + row_block);
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t pp = 0; pp < pairs; ++pp) {
        const int64_t j0 = n0 + 2 * pp * kRows;
        const int two = j0 + kRows < n1 ? 2 : 1;
        int rows[2] = {0, 0};
        for (int u = 0; u < two; ++u) rows[u] = static_cast<int>(std::min<int64_t>(kRows, n1 - j0 - u * kRows));
        const VDotFn* dot = dots[two - 1];
        // Token groups of 4, then 2, then 1 (dot[0], dot[1], dot[2]): group i's sums at
        // sums + 2 (i - i0), [tile][token].
        const auto groups = [&](const auto& fn) {
          int64_t i = i0;
          for (; i + 4 <= i1; i += 4) fn(i, 4, 0);
          for (; i + 2 <= i1; i += 2) fn(i, 2, 1);
          for (; i < i1; ++i) fn(i, 1, 2);
        };
        std::fill(acc.begin(), acc.begin() + 2 * (i1 - i0), Sums16{});
        __m512* const sums = reinterpret_cast<__m512*>(acc.data());
        for (int64_t c0 = 0; c0 < k; c0 += chunk) {
          const int64_t kc = std::min(chunk, k - c0);
          // Each block read prefetches the same rows' next chunk, or the next pair's first
          // (a chunk's work ahead: the weights come from memory).
          const int64_t c0_bytes = c0 / bsize * block_bytes;
          const int64_t pf = c0 + chunk < k         ? chunk / bsize * block_bytes
                             : j0 + 4 * kRows <= n1 ? 2 * kRows * row_bytes - c0_bytes
                                                    : 0;
          for (int u = 0; u < two; ++u)
            build_tile(type, sh, base + (j0 + u * kRows) * row_bytes + c0_bytes, row_bytes, kc, rows[u], pf, tl[u]);
          groups([&](int64_t i, int nt, int g) {
            VAct group[4];
            for (int n = 0; n < nt; ++n) group[n] = act(i + n, c0);
            dot[g](tp, kc, group, sums + 2 * (i - i0));
          });
        }
        groups([&](int64_t i, int nt, int) {
          const __m512* v = sums + 2 * (i - i0);
          for (int u = 0; u < two; ++u) {
            const __mmask16 mask = static_cast<__mmask16>((1u << rows[u]) - 1);
            for (int n = 0; n < nt; ++n)
              _mm512_mask_storeu_ps(y + (i + n) * ldy + (j0 + u * kRows - n0), mask, v[u * nt + n]);
          }
        });
      }
    }
  }
}

}  // namespace vnni
