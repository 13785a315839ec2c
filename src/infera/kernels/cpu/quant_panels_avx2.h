// The panel kernels of quant_impl.h on AVX2 (included by it, inside its namespace, when
// INFERA_QUANT_AVX512 is 0): the same repacked panels, the same integer sums and the same
// calls as the AVX-512 kernels. A panel's 16 rows are two halves of 8: bytes [32h, 32h + 32)
// of every 64-byte chunk hold rows 8h .. 8h + 7, one 4-byte lane a row, and every
// accumulator is one 256-bit register of a half.
//
// AVX2 has no vpdpbusd: vpmaddubsw multiplies u8 by s8 and adds pairs into int16, vpmaddwd
// widens. W4A8's nibbles (<= 15) against activation quants (|q| <= 127) give pair sums of at
// most 3810, so a chain adds 32 columns (8 steps: at most 30480) in int16 before one widening,
// about one multiply per 32 products. W8A8's bytes are w + 128 in the panel, whose pairs
// would saturate int16: the kernel takes w itself (the byte with its top bit flipped) as |w|
// against q with w's sign and widens every step, which is the same integer sum as the
// AVX-512 kernel's after its -128 * sum(q). Integer sums and the float epilogues are the
// AVX-512 kernels' lane for lane (W4A8, W8A8 and the W4A16 prefill give the same bits on
// both paths; the W4A16 decode adds its column products in two chains instead of four).
//
// On a CPU with AVX-VNNI (quant_avxvnni.cpp, INFERA_QUANT_AVXVNNI 1) W8A8's step is the
// 256-bit VEX vpdpbusd, as on AVX-512: its w + 128 bytes as they are, 128 * sum(q) subtracted
// at the end, one instruction where AVX2 takes four (two of them multiplies): the same
// integers. W4A8 keeps its int16 chains there (a vpmaddubsw and an add a step, where vpdpbusd
// would be one instruction but its accumulator a chain of its latency): on the one AVX-VNNI
// CPU at hand, a Zen 4 capped to the avx2 path (kernels_bench 2048 x 5632, one thread,
// alternating rounds), one vpdpbusd chain a token measured 0.73-1.0x at one token and
// 0.89-1.01x at 64, and two a token (the low and the high nibbles, tokens in fours) 0.75x at
// 64; not measured on an Intel CPU.

constexpr bool kAvxVnni = INFERA_QUANT_AVXVNNI != 0;

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// The value as it stands, in its register: GCC may not take a chain's int16 adds apart (they
// reassociate, and it summed several tokens' chains as trees of products, which need more
// than the 16 YMM registers and spill; see ggml_panel_vec.h's in_registers).
inline __m256i kept(__m256i v) {
  __asm__("" : "+x"(v));
  return v;
}

// acc + u8 x s8 dot products of 4 bytes per lane: AVX-VNNI's vpdpbusd (VEX-encoded). Written
// as asm, as the AVX-512 kernels' dpbusd is: with the intrinsic GCC 12 copied the accumulators
// through spare registers around each instruction. (Only the AVX-VNNI build calls it.)
inline __m256i dpbusd_vex(__m256i acc, __m256i u, __m256i s) {
  __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
  return acc;
}

// A W4A8 chain's step: acc + the products of the nibbles u (u8) and the activation bytes q
// (s8), as int16 pair sums (chain_sum widens them).
inline __m256i chain_step(__m256i acc, __m256i u, __m256i q) {
  return kept(_mm256_add_epi16(acc, _mm256_maddubs_epi16(u, q)));
}
inline __m256i chain_sum(__m256i chain, __m256i ones16) { return _mm256_madd_epi16(chain, ones16); }

// The first `rows` (<= 8) of a half's 8 results to y.
inline void store_half(float* y, __m256 v, int rows) {
  if (rows >= 8) {
    _mm256_storeu_ps(y, v);
  } else if (rows > 0) {
    alignas(32) float t[8];
    _mm256_store_ps(t, v);
    std::memcpy(y, t, sizeof(float) * static_cast<size_t>(rows));
  }
}

// Lanes [0, rows) of the 16 floats at v to y.
inline void store_panel_rows(float* y, const float* v, int rows) {
  std::memcpy(y, v, sizeof(float) * static_cast<size_t>(rows));
}

// The rows of half h among a panel's `rows` valid ones.
inline int half_rows(int rows, int h) { return std::clamp(rows - 8 * h, 0, 8); }

// pick[j]: byte_picker_lane(j) in both 128-bit lanes.
inline void byte_pickers(__m256i pick[4]) {
  for (int j = 0; j < 4; ++j) pick[j] = _mm256_broadcastsi128_si256(byte_picker_lane(j));
}

// W4A8 over P adjacent panels (as the AVX-512 kernel: y[i, r] = dx[i] * sum_g scale[r, g] *
// (sum_{t in g} nib[r, t] * xq[i, t] - gcorr[i, g])). Per 32 columns one int16 chain per
// token and half, widened once; a group of more than 32 columns keeps its int32 sum in memory
// between them, and the f32 sums live in memory (touched once per group). A decode step (M =
// 1) runs every panel's two halves together (2P chains, the activations broadcast once per
// chunk); a prefill tile runs one half at a time over its M tokens (M chains, the unpacked
// chunk reused M times).
template <int M, int P>
void w4a8_panels(const uint8_t* panel, int64_t panel_bytes, int64_t chunks, int64_t groups, int64_t gs,
                 const int8_t* xq, int64_t ld, const int32_t* gcorr, const float* dx, float* y, int64_t ldy,
                 int rows_last, L2Prefetch pf = {}, NextPanels next = {}) {
  const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  const int64_t chunks_per_group = gs / 8;
  alignas(32) int32_t isum[P][M][2][8] = {};  // (each written before it is read)
  alignas(32) float facc[P][M][2][8] = {};
  // The chain of token i, half h of panel q over the 32 columns from chunk c0 is done: into
  // the group's int32 sum (from -gcorr), and at the group's end times its scales into facc.
  // (sum: the 32 columns' int32 sums)
  const auto widen = [&](int q, int i, int h, int64_t c0, int64_t g, __m256i sum) {
    auto* at = reinterpret_cast<__m256i*>(isum[q][i][h]);
    sum = c0 == g * chunks_per_group ? _mm256_sub_epi32(sum, _mm256_set1_epi32(gcorr[i * groups + g]))
                                     : _mm256_add_epi32(sum, _mm256_load_si256(at));
    if (c0 + 4 < (g + 1) * chunks_per_group) {
      _mm256_store_si256(at, sum);
      return;
    }
    const uint8_t* scales = panel + q * panel_bytes + chunks * 64 + g * kPanelRows * 2;
    const __m256 sc = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(scales + 16 * h)));
    _mm256_store_ps(facc[q][i][h], _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), sc, _mm256_load_ps(facc[q][i][h])));
  };
  for (int64_t g = 0; g < groups; ++g) {
    for (int q = 0; q < P; ++q) pf.step();
    if constexpr (M == 1) prefetch_group_scales<P>(panel, panel_bytes, chunks, groups, g);
    for (int64_t c0 = g * chunks_per_group; c0 < (g + 1) * chunks_per_group; c0 += 4) {  // 32 columns
      if constexpr (M == 1) {
        __m256i acc[P][2];
        for (int q = 0; q < P; ++q) acc[q][0] = acc[q][1] = _mm256_setzero_si256();
        for (int64_t c = c0; c < c0 + 4; ++c) {
          const __m256i xl = bcast4(xq + c * 8), xh = bcast4(xq + c * 8 + 4);
          for (int q = 0; q < P; ++q) {
            decode_prefetch(panel, q, panel_bytes, chunks * 64, c * 64, next, chunks * 64, kScaleLead);
            for (int h = 0; h < 2; ++h) {
              const __m256i v =
                  _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + q * panel_bytes + c * 64 + 32 * h));
              const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
              acc[q][h] = chain_step(acc[q][h], lo, xl);
              acc[q][h] = chain_step(acc[q][h], hi, xh);
            }
          }
        }
        for (int q = 0; q < P; ++q)
          for (int h = 0; h < 2; ++h) widen(q, 0, h, c0, g, chain_sum(acc[q][h], ones));
      } else {
        for (int q = 0; q < P; ++q) {
          for (int h = 0; h < 2; ++h) {
            __m256i acc[M];
            for (int i = 0; i < M; ++i) acc[i] = _mm256_setzero_si256();
            for (int64_t c = c0; c < c0 + 4; ++c) {
              const __m256i v =
                  _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + q * panel_bytes + c * 64 + 32 * h));
              const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
              for (int i = 0; i < M; ++i) {
                const int8_t* xc = xq + i * ld + c * 8;
                acc[i] = chain_step(acc[i], lo, bcast4(xc));
                acc[i] = chain_step(acc[i], hi, bcast4(xc + 4));
              }
            }
            for (int i = 0; i < M; ++i) widen(q, i, h, c0, g, chain_sum(acc[i], ones));
          }
        }
      }
    }
  }
  pf.finish();
  for (int q = 0; q < P; ++q) {
    const int rows = q == P - 1 ? rows_last : static_cast<int>(kPanelRows);
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h)
        store_half(y + i * ldy + q * kPanelRows + 8 * h,
                   _mm256_mul_ps(_mm256_load_ps(facc[q][i][h]), _mm256_set1_ps(dx[i])), half_rows(rows, h));
  }
}

// W8A8 over P adjacent panels: y[i, r] = dx[i] * scale[r] * sum_t w[r, t] * xq[i, t]. AVX2
// takes w itself (xsum128, the AVX-512 kernel's correction for its w + 128, is not needed:
// the products are signed); AVX-VNNI takes w + 128 against q as AVX-512 does and subtracts
// xsum128 at the end. A decode step runs every panel's halves together (2P int32 chains); a
// prefill tile runs one half at a time over its M tokens.
template <int M, int P>
void w8a8_panels(const uint8_t* panel, int64_t panel_bytes, int64_t chunks, const int8_t* xq, int64_t ld,
                 const int32_t* xsum128, const float* dx, float* y, int64_t ldy, int rows_last, L2Prefetch pf = {},
                 NextPanels next = {}) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  // acc + w x q, four pairs a lane. AVX2: |w| x (q with w's sign) in int16 pairs (|w| <= 128,
  // |q| <= 127: at most 32512), widened; AVX-VNNI: (w + 128) x q into int32.
  const auto step = [&](__m256i acc, __m256i w, __m256i aw, __m256i q) {
    if constexpr (kAvxVnni) {
      return dpbusd_vex(acc, w, q);
    } else {
      return kept(_mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(q, w)), ones)));
    }
  };
  // The weight bytes: w + 128 as the panel holds them (AVX-VNNI), or w (the top bit flipped).
  const auto weights = [&](int q, int64_t c, int h) {
    const __m256i u = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + q * panel_bytes + c * 64 + 32 * h));
    return kAvxVnni ? u : _mm256_xor_si256(u, flip);
  };
  // |w| (AVX2's operand; unused with AVX-VNNI).
  const auto magnitudes = [](__m256i w) { return kAvxVnni ? w : _mm256_abs_epi8(w); };
  const auto finish = [&](int q, int h, int i, __m256i acc) {
    if constexpr (kAvxVnni) acc = _mm256_sub_epi32(acc, _mm256_set1_epi32(xsum128[i]));
    const __m256 sc = _mm256_load_ps(reinterpret_cast<const float*>(panel + q * panel_bytes + chunks * 64) + 8 * h);
    const __m256 r = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), sc), _mm256_set1_ps(dx[i]));
    store_half(y + i * ldy + q * kPanelRows + 8 * h, r,
               half_rows(q == P - 1 ? rows_last : static_cast<int>(kPanelRows), h));
  };
  if constexpr (M == 1) {
    __m256i acc[P][2];
    for (int q = 0; q < P; ++q) acc[q][0] = acc[q][1] = _mm256_setzero_si256();
    for (int64_t c = 0; c < chunks; ++c) {
      pf.step();
      const __m256i xb = bcast4(xq + c * 4);
      for (int q = 0; q < P; ++q) {
        decode_prefetch(panel, q, panel_bytes, panel_bytes, c * 64, next, 0, 0);
        for (int h = 0; h < 2; ++h) {
          const __m256i w = weights(q, c, h);
          acc[q][h] = step(acc[q][h], w, magnitudes(w), xb);
        }
      }
    }
    pf.finish();
    for (int q = 0; q < P; ++q)
      for (int h = 0; h < 2; ++h) finish(q, h, 0, acc[q][h]);
  } else {
    for (int q = 0; q < P; ++q) {
      for (int h = 0; h < 2; ++h) {
        __m256i acc[M];
        for (int i = 0; i < M; ++i) acc[i] = _mm256_setzero_si256();
        for (int64_t c = 0; c < chunks; ++c) {
          if (q == 0 && h == 0) pf.step();
          const __m256i w = weights(q, c, h), aw = magnitudes(w);
          for (int i = 0; i < M; ++i) acc[i] = step(acc[i], w, aw, bcast4(xq + i * ld + c * 4));
        }
        for (int i = 0; i < M; ++i) finish(q, h, i, acc[i]);
      }
    }
    pf.finish();
  }
}

// W4A16 decode over one panel (as the AVX-512 kernel: column j of a chunk moved into the low
// byte of every lane by one vpshufb, converted, multiplied by the broadcast x in f32), the
// column products of a half in two chains.
template <int M>
void w4a16_panel(const uint8_t* panel, int64_t chunks, int64_t groups, int64_t gs, const float* x, int64_t k,
                 const float* xsum8, float* y, int64_t ldy, int rows_valid) {
  constexpr int A = M == 1 ? 2 : 1;
  const __m256i low = _mm256_set1_epi8(0x0f);
  __m256i pick[4];
  byte_pickers(pick);
  const uint8_t* scales = panel + chunks * 64;
  const int64_t chunks_per_group = gs / 8;
  __m256 facc[M][2];
  for (int i = 0; i < M; ++i) facc[i][0] = facc[i][1] = _mm256_setzero_ps();
  const uint8_t* p = panel;
  for (int64_t g = 0; g < groups; ++g) {
    __m256 gacc[M][2][A];
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h)
        for (int a = 0; a < A; ++a) gacc[i][h][a] = _mm256_setzero_ps();
    for (int64_t c = 0; c < chunks_per_group; ++c, p += 64) {
      if constexpr (M == 1) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchAhead), _MM_HINT_T0);
      __m256i nib[2][2];
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
        nib[h][0] = _mm256_and_si256(v, low);
        nib[h][1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
      const int64_t col0 = g * gs + c * 8;
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j)
        for (int h = 0; h < 2; ++h) {
          const __m256 wv = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(nib[h][j / 4], pick[j % 4]));
          for (int i = 0; i < M; ++i)
            gacc[i][h][j % A] = _mm256_fmadd_ps(wv, _mm256_set1_ps(x[i * k + col0 + j]), gacc[i][h][j % A]);
        }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 sc =
          _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(scales + g * kPanelRows * 2 + 16 * h)));
      for (int i = 0; i < M; ++i) {
        __m256 s = gacc[i][h][0];
        for (int a = 1; a < A; ++a) s = _mm256_add_ps(s, gacc[i][h][a]);
        s = _mm256_sub_ps(s, _mm256_set1_ps(xsum8[i * groups + g]));
        facc[i][h] = _mm256_fmadd_ps(s, sc, facc[i][h]);
      }
    }
  }
  for (int i = 0; i < M; ++i)
    for (int h = 0; h < 2; ++h) store_half(y + i * ldy + 8 * h, facc[i][h], half_rows(rows_valid, h));
}

// W4A16 prefill: wbuf[c, q * 16 + r] = weight of row r of panel q at column c0 + c (as the
// AVX-512 kernel writes it, a half at a time).
template <int P>
void w4a16_unpack_block(const uint8_t* panel, int64_t panel_bytes, int64_t chunks, int64_t gs, int64_t c0, int64_t cols,
                        float* wbuf) {
  const __m256i low = _mm256_set1_epi8(0x0f);
  __m256i pick[4];
  byte_pickers(pick);
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int q = 0; q < P; ++q) {
    const uint8_t* pq = panel + q * panel_bytes;
    const uint8_t* scales = pq + chunks * 64;
    for (int64_t c = 0; c < cols; c += 8) {
      const int64_t col = c0 + c;
      for (int h = 0; h < 2; ++h) {
        const __m256 sc = _mm256_cvtph_ps(
            _mm_load_si128(reinterpret_cast<const __m128i*>(scales + (col / gs * kPanelRows + 8 * h) * 2)));
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pq + col / 8 * 64 + 32 * h));
        const __m256i nib[2] = {_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low)};
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          const __m256 wq = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(nib[j / 4], pick[j % 4])), eight);
          _mm256_store_ps(wbuf + (c + j) * (P * kPanelRows) + q * kPanelRows + 8 * h, _mm256_mul_ps(wq, sc));
        }
      }
    }
  }
}

// acc[i, 16 q + r] += sum_c wbuf[c, 16 q + r] * x[i, c0 + c] for T <= 4 tokens and one panel q
// (T x 2 halves = 8 accumulators, two weight vectors, a broadcast).
template <int T, int P>
void w4a16_block_tile4(const float* wbuf, int64_t cols, const float* x, int64_t k, int64_t c0, float* acc, int q) {
  constexpr int64_t kRows = P * kPanelRows;
  __m256 a[T][2];
  for (int i = 0; i < T; ++i)
    for (int h = 0; h < 2; ++h) a[i][h] = _mm256_loadu_ps(acc + i * kRows + q * kPanelRows + 8 * h);
  const float* xb = x + c0;
  for (int64_t c = 0; c < cols; ++c) {
    const float* wc = wbuf + c * kRows + q * kPanelRows;
    const __m256 w0 = _mm256_load_ps(wc), w1 = _mm256_load_ps(wc + 8);
    for (int i = 0; i < T; ++i) {
      const __m256 xv = _mm256_set1_ps(xb[i * k + c]);
      a[i][0] = _mm256_fmadd_ps(w0, xv, a[i][0]);
      a[i][1] = _mm256_fmadd_ps(w1, xv, a[i][1]);
    }
  }
  for (int i = 0; i < T; ++i)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(acc + i * kRows + q * kPanelRows + 8 * h, a[i][h]);
}

// acc[i, :] += sum_c wbuf[c, :] * x[i, c0 + c] for M tokens, P * 16 rows: a panel at a time,
// the tokens in fours.
template <int M, int P>
void w4a16_block_tile(const float* wbuf, int64_t cols, const float* x, int64_t k, int64_t c0, float* acc) {
  constexpr int64_t kRows = P * kPanelRows;
  for (int q = 0; q < P; ++q) {
    w4a16_block_tile4<std::min(M, 4), P>(wbuf, cols, x, k, c0, acc, q);
    if constexpr (M > 4) w4a16_block_tile4<M - 4, P>(wbuf, cols, x + 4 * k, k, c0, acc + 4 * kRows, q);
  }
}
