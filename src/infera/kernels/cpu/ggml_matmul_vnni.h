// Prefill (several activation rows) of the ggml block-format matmul on AVX-512 VNNI: the
// same values as the generic loops of ggml_matmul_impl.h, bit for bit, with register tiles
// of 32 weight rows (two tiles of 16) x up to 4 activation rows.
//
// A tile of 16 weight rows is decoded once per block of activation rows (the decoders of
// ggml_matmul_simd.h, one row at a time) and laid out as VNNI wants it: dword g of the tile
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

// A whole tile of Q4_K (kFive false) or Q5_K rows straight from the file's blocks: the
// packed nibbles (and Q5_K's high bits) transposed as they are, then unpacked in the VNNI
// layout (byte l of 32-byte chunk c holds weights 64c + l (low nibble) and 64c + 32 + l).
// The scales go to the row-major scratch as decode_into leaves them.
template <bool kFive>
inline void build_q45k(const uint8_t* rows0, int64_t row_bytes, int64_t k, bool next, VTile& t) {
  const int64_t ts = kFive ? 176 : 144, ng = k / 16;
  const __m512i m4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  for (int64_t i = 0; i < k / 256; ++i) {
    const uint8_t* b0 = rows0 + i * ts;
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* b = b0 + r * row_bytes;
      if (next) prefetch_block(b + kRows * row_bytes, static_cast<int>(ts));
      t.d[i * kRows + r] = half_f16c(b);
      t.dmin[i * kRows + r] = half_f16c(b + 2);
      k4_scales(b + 4, t.sc.data() + r * ng + 16 * i, t.mn.data() + r * ng + 16 * i);
    }
    __m512i qh[16];  // Q5_K: [0, 8) the high-bit dwords (bytes 16..47 of the block)
    if (kFive) transpose16(b0 + 16, row_bytes, qh);
    for (int h = 0; h < 2; ++h) {
      __m512i v[16];
      transpose16(b0 + (kFive ? 48 : 16) + 64 * h, row_bytes, v);
      for (int j = 0; j < 16; ++j) {
        const int jj = 16 * h + j, c = jj / 8, j8 = jj % 8;
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

// Decodes weight rows [j0, j0 + rows) (rows <= kRows; the others zero) into the tile.
// next: whether a tile follows at j0 + kRows (its rows are prefetched while decoding).
inline void build_tile(uint32_t type, const Shape& sh, const uint8_t* base, int64_t row_bytes, int64_t k, int64_t j0,
                       int rows, bool next, VTile& t) {
  const int64_t nb = k / block_size(type), ng = k / 16;
  const bool kt = sh.sub != 0;
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  if (rows == kRows && (type == kQ4_K || type == kQ5_K)) {
    if (type == kQ4_K)
      build_q45k<false>(base + j0 * row_bytes, row_bytes, k, next, t);
    else
      build_q45k<true>(base + j0 * row_bytes, row_bytes, k, next, t);
  } else {
    for (int r = 0; r < kRows; ++r) {
      const RowOut o{t.rows.data() + r * k,
                     kt ? t.sc.data() + r * ng : nullptr,
                     kt ? t.mn.data() + r * ng : nullptr,
                     t.d.data() + r,
                     t.dmin.data() + r,
                     next ? kRows * row_bytes : 0,
                     kRows};
      if (r < rows) {
        decode_into(type, base + (j0 + r) * row_bytes, k, o);  // (dmin untouched where no mins: unread)
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
    const __m512i idx = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(static_cast<int>(k)));
    for (int64_t g = g0; g < dwords; ++g) {
      const __m512i v = _mm512_i32gather_epi32(idx, t.rows.data() + 4 * g, 1);
      _mm512_storeu_si512(t.wq.data() + kRows * g, _mm512_xor_si512(v, flip));
    }
  }
  // Sub-scales and mins of each row into lanes, by gathers of the rows' int16 (pairs).
  const __m512i idx16 = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(static_cast<int>(2 * ng)));
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
// out[u * kNt + n] lane r = row r of tile u · activation row n.

// 32-weight-block types (offset 128).
template <int kNt, int kT>
inline void dot32(const VTile* const* t, int64_t k, const VAct* a, __m512* out) {
  __m512 sum[kT][kNt];
  for (int u = 0; u < kT; ++u)
    for (int n = 0; n < kNt; ++n) sum[u][n] = _mm512_setzero_ps();
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
    for (int n = 0; n < kNt; ++n) sum[u][n] = _mm512_setzero_ps();
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

// y[i * ldy + (j - n0)] for rows j in [n0, n1), activation rows [0, m). bs16: the int16
// sums of 16 quants (K types with mins or an offset), else null.
inline void matmul_rows(uint32_t type, const uint8_t* base, int64_t row_bytes, int64_t k, const Activations& a,
                        const int16_t* bs16, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy) {
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
#pragma omp parallel num_threads(static_cast <int>(std::min <int64_t>(threads, pairs)))
  {
    static thread_local VTile tl[2];
    tl[0].resize(k, nb, sh);
    tl[1].resize(k, nb, sh);
    const VTile* const tp[2] = {&tl[0], &tl[1]};
    const auto act = [&](int64_t i) {
      return VAct{a.q.data() + i * k, a.d.data() + i * dstride, corr_p + i * per_row,
                  bs16 != nullptr ? bs16 + i * (k / 16) : nullptr};
    };
    for (int64_t i0 = 0; i0 < m; i0 += row_block) {
      const int64_t i1 = std::min(m, i0 + row_block);
#pragma omp for schedule(static) nowait
      for (int64_t pp = 0; pp < pairs; ++pp) {
        const int64_t j0 = n0 + 2 * pp * kRows;
        const int two = j0 + kRows < n1 ? 2 : 1;
        int rows[2] = {0, 0};
        for (int u = 0; u < two; ++u) {
          const int64_t ju = j0 + u * kRows;
          rows[u] = static_cast<int>(std::min<int64_t>(kRows, n1 - ju));
          build_tile(type, sh, base, row_bytes, k, ju, rows[u], ju + kRows < n1, tl[u]);
        }
        const VDotFn* dot = dots[two - 1];
        __m512 v[8];
        const auto store = [&](int64_t i, int nt) {
          for (int u = 0; u < two; ++u) {
            const __mmask16 mask = static_cast<__mmask16>((1u << rows[u]) - 1);
            for (int n = 0; n < nt; ++n)
              _mm512_mask_storeu_ps(y + (i + n) * ldy + (j0 + u * kRows - n0), mask, v[u * nt + n]);
          }
        };
        int64_t i = i0;
        for (; i + 4 <= i1; i += 4) {
          const VAct four[4] = {act(i), act(i + 1), act(i + 2), act(i + 3)};
          dot[0](tp, k, four, v);
          store(i, 4);
        }
        for (; i + 2 <= i1; i += 2) {
          const VAct two_rows[2] = {act(i), act(i + 1)};
          dot[1](tp, k, two_rows, v);
          store(i, 2);
        }
        for (; i < i1; ++i) {
          const VAct one = act(i);
          dot[2](tp, k, &one, v);
          store(i, 1);
        }
      }
    }
  }
}

}  // namespace vnni
