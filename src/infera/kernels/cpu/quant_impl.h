// The SIMD quantized kernels, written once and compiled three times: quant_avx2.cpp
// (INFERA_QUANT_AVX512 0: maddubs/madd), quant_avxvnni.cpp (0, with INFERA_QUANT_AVXVNNI 1:
// AVX2 with the 256-bit vpdpbusd of AVX-VNNI) and quant_avx512.cpp (1: vpdpbusd, AVX-512 VNNI).
// Include it from nowhere else. See kernels/quant.h for the formats and the u8 x s8 tricks.
//
// Two families:
// - over the on-disk layout (both ISAs; qmatmul): GEMV and GEMM run the same register tile,
//   M tokens x R weight rows (M * R <= 4 accumulator sets). Weight rows are split into blocks
//   of ~32 KiB handed to threads dynamically; inside a block every group of 4 tokens sweeps
//   the block while it sits in L1/L2, so each weight is unpacked once per 4 tokens.
// - over the repacked 16-row panels (qmatmul_packed, used when the matrix has a packed copy):
//   see "panel kernels" below (AVX2's in quant_panels_avx2.h); W8A8 prefill runs on AMX tiles
//   where the CPU and OS allow it (same integers, bit-identical results).
#pragma once

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "infera/base/options.h"
#include "infera/base/threads.h"
#include "infera/kernels/cpu/amx_tiles.h"
#include "infera/kernels/cpu/quant_dispatch.h"

#ifndef INFERA_QUANT_AVXVNNI
#define INFERA_QUANT_AVXVNNI 0
#endif

namespace infera::kernels::INFERA_QUANT_NS {
namespace {

// ---- primitives ------------------------------------------------------------------------

// acc (8 x i32) += dot products of 4 adjacent u8 x s8 pairs.
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if INFERA_QUANT_AVX512
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  // u <= 15 here (int4 nibbles): 2 * 15 * 127 fits int16, maddubs cannot saturate.
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
#endif
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

inline float f16_scale(const uint16_t* p) { return _cvtsh_ss(*p); }

// The 32 nibbles of one 32-column run, as u8 in column order.
inline __m256i unpack_nibbles(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(b, m);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  return _mm256_set_m128i(hi, lo);
}

// Splits [0, n) into pieces of `grain` handed out dynamically (the machine is shared: a
// thread that loses its core must not hold the others back).
template <class F>
void parallel_chunks(int64_t n, int64_t grain, F&& f) {
  const int threads = num_threads();
  if (threads <= 1 || n < 2 * grain || omp_in_parallel()) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t pieces = (n + grain - 1) / grain;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t p = 0; p < pieces; ++p) f(p * grain, std::min(n, (p + 1) * grain));
}

// ---- activation quantization (bit-identical to ref::quantize_activations) ---------------

void quantize_activations(const float* x, int64_t m, int64_t k, int8_t* q, int64_t ld, float* scale,
                          int32_t* block_sums) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * k;
    int8_t* qr = q + i * ld;
    __m256 vmax = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 8 <= k; t += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(xr + t), abs_mask));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float amax = _mm_cvtss_f32(m4);
    for (; t < k; ++t) amax = std::max(amax, std::fabs(xr[t]));
    t = 0;
    if (amax == 0.0f) {
      scale[i] = 0.0f;
    } else {
      scale[i] = amax / 127.0f;
      const float inv = 127.0f / amax;
      const __m256 vinv = _mm256_set1_ps(inv);
      const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
      auto cvt = [&](const float* p) {
        const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p), vinv));  // nearest even
        return _mm256_min_epi32(_mm256_max_epi32(v, lo), hi);
      };
      for (; t + 32 <= k; t += 32) {
        const __m256i a = cvt(xr + t), b = cvt(xr + t + 8), c = cvt(xr + t + 16), d = cvt(xr + t + 24);
        const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
        const __m256i abcd = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), perm);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qr + t), abcd);
      }
      for (; t < k; ++t) {
        const float v = std::nearbyint(xr[t] * inv);
        qr[t] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
      }
    }
    for (; t < ld; ++t) qr[t] = 0;
    if (block_sums) {
      int32_t* bs = block_sums + i * (ld / 32);
      for (int64_t b = 0; b < ld / 32; ++b) {
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += qr[b * 32 + j];
        bs[b] = s;
      }
    }
  }
}

// Per-thread buffers for quantized activations: grow once, never per call.
struct ActivationScratch {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> block_sums;
  std::vector<int32_t> corr;  // panel kernels: integer correction per token (and group)
  std::vector<float> xsum8;  // W4A16 panel kernel: 8 * sum of x per token and group
};
ActivationScratch& activation_scratch() {
  static thread_local ActivationScratch s;
  return s;
}

// ---- W8A8 ---------------------------------------------------------------------------------

// y[i * ldy + r] for i < M, r < R: rows w[r * k ...] against quantized tokens xq[i * ld ...].
template <int M, int R>
inline void w8a8_tile(const int8_t* xq, int64_t ld, const float* dx, const int8_t* w, int64_t k, const float* dw,
                      float* y, int64_t ldy) {
#if INFERA_QUANT_AVX512
  __m512i acc[M][R], wsum[R];
  for (int r = 0; r < R; ++r) {
    wsum[r] = _mm512_setzero_si512();
    for (int i = 0; i < M; ++i) acc[i][r] = _mm512_setzero_si512();
  }
  const __m512i ones = _mm512_set1_epi8(1), offset = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t t = 0; t < k; t += 64) {
    // x is zero-padded to ld (its u8 form reads 128 there, against masked-out zero weights).
    const __mmask64 mask = t + 64 <= k ? ~__mmask64{0} : ((__mmask64{1} << (k - t)) - 1);
    __m512i xu[M];
    for (int i = 0; i < M; ++i) xu[i] = _mm512_xor_si512(_mm512_loadu_si512(xq + i * ld + t), offset);
    for (int r = 0; r < R; ++r) {
      const __m512i wv = _mm512_maskz_loadu_epi8(mask, w + r * k + t);
      wsum[r] = _mm512_dpbusd_epi32(wsum[r], ones, wv);
      for (int i = 0; i < M; ++i) acc[i][r] = _mm512_dpbusd_epi32(acc[i][r], xu[i], wv);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int32_t ws = _mm512_reduce_add_epi32(wsum[r]);
    for (int i = 0; i < M; ++i) {
      const int32_t dot = _mm512_reduce_add_epi32(acc[i][r]) - 128 * ws;
      y[i * ldy + r] = static_cast<float>(dot) * (dx[i] * dw[r]);
    }
  }
#else
  __m256i acc[M][R];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) acc[i][r] = _mm256_setzero_si256();
  const __m256i ones16 = _mm256_set1_epi16(1);
  int64_t t = 0;
  for (; t + 32 <= k; t += 32) {
    __m256i xv[M];
    for (int i = 0; i < M; ++i) xv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * ld + t));
    for (int r = 0; r < R; ++r) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * k + t));
      const __m256i uw = _mm256_sign_epi8(wv, wv);  // |w| as u8
      for (int i = 0; i < M; ++i) {
        // |w| * (x * sign(w)) = w * x; |x|, |w| <= 127 so the int16 pair sums cannot saturate.
        const __m256i p16 = _mm256_maddubs_epi16(uw, _mm256_sign_epi8(xv[i], wv));
        acc[i][r] = _mm256_add_epi32(acc[i][r], _mm256_madd_epi16(p16, ones16));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) {
      int32_t dot = hsum_i32(acc[i][r]);
      for (int64_t u = t; u < k; ++u) dot += static_cast<int32_t>(w[r * k + u]) * xq[i * ld + u];
      y[i * ldy + r] = static_cast<float>(dot) * (dx[i] * dw[r]);
    }
  }
#endif
}

// ---- W4A8 ---------------------------------------------------------------------------------

template <int M, int R>
inline void w4a8_tile(const int8_t* xq, int64_t ld, const float* dx, const int32_t* bsums, const uint8_t* w, int64_t k,
                      int64_t gs, const uint16_t* scales, float* y, int64_t ldy) {
  const int64_t row_bytes = k / 2, groups = k / gs, blocks_per_group = gs / 32, bld = ld / 32;
  __m256 facc[M][R];
  float corr[M][R];
  for (int i = 0; i < M; ++i)
    for (int r = 0; r < R; ++r) {
      facc[i][r] = _mm256_setzero_ps();
      corr[i][r] = 0.0f;
    }
  for (int64_t g = 0; g < groups; ++g) {
    __m256i iacc[M][R];
    for (int i = 0; i < M; ++i)
      for (int r = 0; r < R; ++r) iacc[i][r] = _mm256_setzero_si256();
    for (int64_t b = 0; b < blocks_per_group; ++b) {
      const int64_t col = g * gs + b * 32;
      __m256i xv[M];
      for (int i = 0; i < M; ++i) xv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * ld + col));
      for (int r = 0; r < R; ++r) {
        const __m256i wv = unpack_nibbles(w + r * row_bytes + col / 2);
        for (int i = 0; i < M; ++i) iacc[i][r] = dot_u8s8(iacc[i][r], wv, xv[i]);
      }
    }
    int32_t xsum[M];
    for (int i = 0; i < M; ++i) {
      xsum[i] = 0;
      for (int64_t b = 0; b < blocks_per_group; ++b) xsum[i] += bsums[i * bld + g * blocks_per_group + b];
    }
    for (int r = 0; r < R; ++r) {
      const float d = f16_scale(scales + r * groups + g);
      const __m256 dv = _mm256_set1_ps(d);
      for (int i = 0; i < M; ++i) {
        facc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[i][r]), dv, facc[i][r]);
        corr[i][r] += d * static_cast<float>(xsum[i]);  // the nibbles carry +8
      }
    }
  }
  for (int i = 0; i < M; ++i)
    for (int r = 0; r < R; ++r) y[i * ldy + r] = dx[i] * (hsum(facc[i][r]) - 8.0f * corr[i][r]);
}

// ---- W4A16 --------------------------------------------------------------------------------

template <int M, int R>
inline void w4a16_tile(const float* x, int64_t k, const uint8_t* w, int64_t gs, const uint16_t* scales, float* y,
                       int64_t ldy) {
  const int64_t row_bytes = k / 2, groups = k / gs, blocks_per_group = gs / 32;
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m256 eight = _mm256_set1_ps(8.0f);
  __m256 acc[M][R];
  for (int i = 0; i < M; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256 gacc[M][R];
    for (int i = 0; i < M; ++i)
      for (int r = 0; r < R; ++r) gacc[i][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks_per_group; ++b) {
      const int64_t col = g * gs + b * 32;
      for (int r = 0; r < R; ++r) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * row_bytes + col / 2));
        const __m128i lo = _mm_and_si128(bytes, mask);
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
        __m256 wv[4];
        wv[0] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), eight);
        wv[1] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), eight);
        wv[2] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), eight);
        wv[3] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), eight);
        for (int i = 0; i < M; ++i) {
          const float* xr = x + i * k + col;
          for (int v = 0; v < 4; ++v) gacc[i][r] = _mm256_fmadd_ps(wv[v], _mm256_loadu_ps(xr + 8 * v), gacc[i][r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 dv = _mm256_set1_ps(f16_scale(scales + r * groups + g));
      for (int i = 0; i < M; ++i) acc[i][r] = _mm256_fmadd_ps(gacc[i][r], dv, acc[i][r]);
    }
  }
  for (int i = 0; i < M; ++i)
    for (int r = 0; r < R; ++r) y[i * ldy + r] = hsum(acc[i][r]);
}

// ---- driver ---------------------------------------------------------------------------------

struct Operands {
  const QuantMatRef* w;
  const float* x;  // W4A16: f32 activations [m, k]
  const int8_t* xq;  // A8: quantized activations [m, ld]
  int64_t ld;
  const float* dx;  // A8: per-token scales [m]
  const int32_t* bsums;  // W4A8: per-32-column sums of xq [m, ld / 32]
};

// Runs Tile<M, R>::run(ops, i0, j, y) over all m tokens and n rows. Tiles of up to 4 tokens; R = 4 / M
// weight rows per tile (a decode token streams 4 rows at once).
template <template <int, int> class Tile>
void sweep(const Operands& ops, int64_t m, int64_t n, int64_t row_bytes, float* y) {
  constexpr int64_t kRowsAlign = 4;
  const int64_t target = int64_t{32} << 10;  // ~32 KiB of weights per block: stays in L1/L2 for all tokens
  int64_t block_rows =
      std::max<int64_t>(kRowsAlign, target / std::max<int64_t>(row_bytes, 1) / kRowsAlign * kRowsAlign);
  const int64_t blocks = (n + block_rows - 1) / block_rows;
  parallel_chunks(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j0 = b * block_rows, j1 = std::min(n, j0 + block_rows);
      for (int64_t i0 = 0; i0 < m; i0 += 4) {
        const int64_t mt = std::min<int64_t>(4, m - i0);
        auto rows = [&]<int MT>() {
          constexpr int RT = 4 / MT;
          int64_t j = j0;
          for (; j + RT <= j1; j += RT) Tile<MT, RT>::run(ops, i0, j, y + i0 * n + j, n);
          for (; j < j1; ++j) Tile<MT, 1>::run(ops, i0, j, y + i0 * n + j, n);
        };
        switch (mt) {
          case 1: rows.template operator()<1>(); break;
          case 2: rows.template operator()<2>(); break;
          case 3: rows.template operator()<3>(); break;
          default: rows.template operator()<4>(); break;
        }
      }
    }
  });
}

// Tile adapters: one call's operands -> the tile kernels.
template <int M, int R>
struct W8A8Tile {
  static void run(const Operands& ops, int64_t i0, int64_t j, float* y, int64_t ldy) {
    const QuantMatRef& w = *ops.w;
    w8a8_tile<M, R>(ops.xq + i0 * ops.ld, ops.ld, ops.dx + i0, static_cast<const int8_t*>(w.qweight) + j * w.cols,
                    w.cols, static_cast<const float*>(w.scales) + j, y, ldy);
  }
};
template <int M, int R>
struct W4A8Tile {
  static void run(const Operands& ops, int64_t i0, int64_t j, float* y, int64_t ldy) {
    const QuantMatRef& w = *ops.w;
    w4a8_tile<M, R>(ops.xq + i0 * ops.ld, ops.ld, ops.dx + i0, ops.bsums + i0 * (ops.ld / 32),
                    static_cast<const uint8_t*>(w.qweight) + j * (w.cols / 2), w.cols, w.group_size,
                    static_cast<const uint16_t*>(w.scales) + j * w.groups_per_row(), y, ldy);
  }
};
template <int M, int R>
struct W4A16Tile {
  static void run(const Operands& ops, int64_t i0, int64_t j, float* y, int64_t ldy) {
    const QuantMatRef& w = *ops.w;
    w4a16_tile<M, R>(ops.x + i0 * w.cols, w.cols, static_cast<const uint8_t*>(w.qweight) + j * (w.cols / 2),
                     w.group_size, static_cast<const uint16_t*>(w.scales) + j * w.groups_per_row(), y, ldy);
  }
};

// ---- panel kernels over the repacked layout (kernels/quant.h, "Repacked layout") ----------
//
// One zmm holds 16 rows' accumulators (lane r = row r of the panel; AVX2: two ymm of 8): each
// 64-byte chunk is loaded (and for int4 unpacked) once and multiplied against M tokens'
// broadcast activation bytes, so a decode token (M = 1) streams the panel once and a prefill
// tile of M tokens reuses every unpacked chunk M times. Results go out with a masked store
// (AVX2: store_half; the last panel's padding rows are dropped). The constants and drivers
// below serve both ISAs; the kernels are each ISA's own (AVX2's tile shapes, register counts
// and chains: quant_panels_avx2.h).

constexpr int kTileTokens = 8;
// W8A8 (VNNI) and W4A16 prefill tiles: kTileTokens tokens x this many panels (AVX-512: 8 x 3 =
// 24 accumulators, 3 weight vectors and a broadcast: 28 of the 32 zmm; w8a8: 11 loads per 24
// vpdpbusd).
constexpr int64_t kPrefillPanels = 3;
// Decode (one token): panels swept at once, one memory stream each. At one thread four
// streams read ~5% faster than two (the core keeps more lines in flight).
constexpr int64_t kDecodePanels = 4;
constexpr int64_t kPrefetchAhead = 2048;  // bytes: decode kernels prefetch this far ahead in each panel stream
                                          // (measured: +10% over the hardware prefetcher alone)

// The panels a decode kernel sweeps after the current group (the next group of the same
// piece): `count` of them from `first` (count 0: none).
struct NextPanels {
  const uint8_t* first = nullptr;
  int count = 0;
};

// Decode prefetch for stream q (panel q of the group at `panel`) as it reads byte `off`:
// kPrefetchAhead bytes ahead in the panel's first `stream_bytes` (its weights, or the whole
// panel); past them, the same distance into panel q of the next group: its `lead_bytes` from
// `lead_at` first (int4: the first scales, which sit after its weights), then its bytes from
// the start. So the next group starts on lines already in flight rather than with cold
// streams: +6% (median of 8 runs) on Qwen3-MoE expert shapes (768 x 2048, 2048 x 768) at one
// thread, where a panel is 7-18 KiB and its first 2 KiB matter; neutral on 2048-column
// dense shapes.
constexpr int64_t kScaleLead = 512;  // int4: next panels' scale bytes prefetched from the tail
inline void decode_prefetch(const uint8_t* panel, int q, int64_t panel_bytes, int64_t stream_bytes, int64_t off,
                            NextPanels next, int64_t lead_at, int64_t lead_bytes) {
  const int64_t ahead = off + kPrefetchAhead;
  const uint8_t* at = nullptr;
  if (ahead < stream_bytes) {
    at = panel + q * panel_bytes + ahead;
  } else if (q < next.count) {
    const int64_t o = ahead - stream_bytes;
    at = next.first + q * panel_bytes + (o < lead_bytes ? lead_at + o : o - lead_bytes);
  }
  if (at) _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T0);
}

// An int4 decode step's prefetch of group g's scales in each of its P panels, those past the
// first kScaleLead bytes (decode_prefetch brought those in from the previous group's tail).
template <int P>
inline void prefetch_group_scales(const uint8_t* panel, int64_t panel_bytes, int64_t chunks, int64_t groups,
                                  int64_t g) {
  const int64_t scale_bytes = groups * kPanelRows * 2, at = g * kPanelRows * 2 + kScaleLead;
  if (at < scale_bytes)
    for (int q = 0; q < P; ++q)
      _mm_prefetch(reinterpret_cast<const char*>(panel + q * panel_bytes + chunks * 64 + at), _MM_HINT_T0);
}

// The 128-bit vpshufb control that moves byte j of every 32-bit lane to the lane's low byte,
// zeros elsewhere (vpshufb indexes bytes within each 128-bit lane: dword d of a lane starts
// at byte 4d); byte_pickers broadcasts it to each ISA's vectors.
inline __m128i byte_picker_lane(int j) {
  return _mm_setr_epi32(static_cast<int32_t>(0x80808000u | (0u + j)), static_cast<int32_t>(0x80808000u | (4u + j)),
                        static_cast<int32_t>(0x80808000u | (8u + j)), static_cast<int32_t>(0x80808000u | (12u + j)));
}

// Prefill: while a tile of tokens sweeps panels already in L2, pull the next panels of the
// thread's piece from memory into L2 (one line per chunk step), so the next tile's first
// sweep does not stall on DRAM (the hardware prefetcher does not cross into them early).
struct L2Prefetch {
  const uint8_t* next = nullptr;
  const uint8_t* end = nullptr;
  void step() {
    if (next < end) {
      _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T1);
      next += 64;
    }
  }
  void finish() {
    for (; next < end; next += 64) _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T1);
  }
};

// The byte range [begin, end) split evenly over `parts`: part `i` of it, in whole lines.
inline L2Prefetch prefetch_part(const uint8_t* begin, int64_t bytes, int64_t parts, int64_t i) {
  const int64_t lines = (bytes + 63) / 64, per = (lines + parts - 1) / parts;
  const int64_t l0 = std::min(lines, i * per), l1 = std::min(lines, l0 + per);
  return {begin + l0 * 64, begin + l1 * 64};
}

// f.template operator()<P>() for P = np in [1, MaxP]: a kernel over np adjacent panels
// (only P <= MaxP is instantiated: a prefill tile of 8 tokens x 4 panels would not fit the
// registers).
template <int MaxP, class F>
inline void with_panels(int64_t np, F&& f) {
  static_assert(MaxP >= 1 && MaxP <= 4);
  if constexpr (MaxP >= 4) {
    if (np >= 4) return f.template operator()<4>();
  }
  if constexpr (MaxP >= 3) {
    if (np == 3) return f.template operator()<3>();
  }
  if constexpr (MaxP >= 2) {
    if (np == 2) return f.template operator()<2>();
  }
  f.template operator()<1>();
}

// Calls f.template operator()<M>() with M = mt in [1, kTileTokens].
template <class F>
inline void with_tile_tokens(int64_t mt, F&& f) {
  switch (mt) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 5: f.template operator()<5>(); break;
    case 6: f.template operator()<6>(); break;
    case 7: f.template operator()<7>(); break;
    default: f.template operator()<8>(); break;
  }
}

// W4A16 prefill: a block of kW4A16BlockCols columns of P panels is unpacked once to f32
// weights (w = (nibble - 8) * scale, exact in f32: a 4-bit integer times an f16) in an
// L1-resident buffer, then every token of the call runs an f32 FMA tile over it, so the
// unpacking is paid once per block instead of once per token tile. Accumulators of all
// tokens live in `acc` [m, P * 16] across blocks. Error: plain f32 sums of exact products
// in column order, |y - y_exact| <= k * 2^-24 * sum_t |w_t x_t| (first order).
constexpr int64_t kW4A16BlockCols = 128;

#if INFERA_QUANT_AVX512
// acc += u8 x s8 dot products of 4 bytes per lane (vpdpbusd). Written as asm: with the
// intrinsic GCC 12 copies every accumulator of a tile through a spare register (or the
// stack) around each instruction, ~2x the uops of the inner loop.
inline __m512i dpbusd(__m512i acc, __m512i u, __m512i s) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}

inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows past the matrix exist only in its last panel: a kernel over P adjacent panels is told
// how many rows of its last one are valid (`rows_last`), all others are full.
inline __mmask16 row_mask(int rows_valid) { return static_cast<__mmask16>((1u << rows_valid) - 1u); }

// W4A8 over P adjacent panels: y[i, r] = dx[i] * sum_g scale[r, g] * (sum_{t in g} nib[r, t] *
// xq[i, t] - gcorr[i, g]), gcorr = 8 * sum_{t in g} xq[i, t] (the nibbles carry +8).
template <int M, int P>
void w4a8_panels(const uint8_t* panel, int64_t panel_bytes, int64_t chunks, int64_t groups, int64_t gs,
                 const int8_t* xq, int64_t ld, const int32_t* gcorr, const float* dx, float* y, int64_t ldy,
                 int rows_last, L2Prefetch pf = {}, NextPanels next = {}) {
  // Few tokens have few independent vpdpbusd chains: split low/high nibbles over two so
  // the instruction's latency does not bound the stream.
  constexpr bool kSplit = M * P <= 2;
  const __m512i low = _mm512_set1_epi8(0x0f);
  const int64_t chunks_per_group = gs / 8;
  __m512 facc[P][M];
  for (int q = 0; q < P; ++q)
    for (int i = 0; i < M; ++i) facc[q][i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    // The accumulators start at -gcorr: the correction costs a broadcast load, not a subtract.
    __m512i ia[P][M], ib[P][M];
    for (int i = 0; i < M; ++i) {
      const __m512i start = _mm512_set1_epi32(-gcorr[i * groups + g]);
      for (int q = 0; q < P; ++q) {
        ia[q][i] = start;
        ib[q][i] = _mm512_setzero_si512();
      }
    }
    const int8_t* xg = xq + g * gs;
    const uint8_t* pg = panel + g * chunks_per_group * 64;
    for (int q = 0; q < P; ++q) pf.step();
    if constexpr (M == 1) prefetch_group_scales<P>(panel, panel_bytes, chunks, groups, g);
    for (int64_t c = 0; c < chunks_per_group; ++c) {
      __m512i lo[P], hi[P];
      for (int q = 0; q < P; ++q) {
        const __m512i v = _mm512_load_si512(pg + q * panel_bytes + c * 64);
        if constexpr (M == 1) {
          decode_prefetch(panel, q, panel_bytes, chunks * 64, (g * chunks_per_group + c) * 64, next, chunks * 64,
                          kScaleLead);
        }
        lo[q] = _mm512_and_si512(v, low);
        hi[q] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      for (int i = 0; i < M; ++i) {
        const int8_t* xc = xg + i * ld + c * 8;
        const __m512i xl = bcast4(xc), xh = bcast4(xc + 4);
        for (int q = 0; q < P; ++q) {
          ia[q][i] = dpbusd(ia[q][i], lo[q], xl);
          if constexpr (kSplit) {
            ib[q][i] = dpbusd(ib[q][i], hi[q], xh);
          } else {
            ia[q][i] = dpbusd(ia[q][i], hi[q], xh);
          }
        }
      }
    }
    for (int q = 0; q < P; ++q) {
      const auto* scales = reinterpret_cast<const __m256i*>(panel + q * panel_bytes + chunks * 64 + g * kPanelRows * 2);
      const __m512 sc = _mm512_cvtph_ps(_mm256_load_si256(scales));
      for (int i = 0; i < M; ++i) {
        const __m512i d = kSplit ? _mm512_add_epi32(ia[q][i], ib[q][i]) : ia[q][i];
        facc[q][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, facc[q][i]);
      }
    }
  }
  pf.finish();
  for (int q = 0; q < P; ++q) {
    const __mmask16 mask = row_mask(q == P - 1 ? rows_last : static_cast<int>(kPanelRows));
    for (int i = 0; i < M; ++i)
      _mm512_mask_storeu_ps(y + i * ldy + q * kPanelRows, mask, _mm512_mul_ps(facc[q][i], _mm512_set1_ps(dx[i])));
  }
}

// W8A8 over P adjacent panels: y[i, r] = dx[i] * scale[r] * (sum_t (w + 128) * xq[i, t] - 128 * sum_t xq[i, t]).
template <int M, int P>
void w8a8_panels(const uint8_t* panel, int64_t panel_bytes, int64_t chunks, const int8_t* xq, int64_t ld,
                 const int32_t* xsum128, const float* dx, float* y, int64_t ldy, int rows_last, L2Prefetch pf = {},
                 NextPanels next = {}) {
  // One token, one panel would be a single dependent vpdpbusd chain: alternate two.
  constexpr int A = (M == 1 && P == 1) ? 2 : 1;
  __m512i acc[P][M][A];
  for (int q = 0; q < P; ++q)
    for (int i = 0; i < M; ++i)
      for (int a = 0; a < A; ++a) acc[q][i][a] = _mm512_setzero_si512();
  int64_t c = 0;
  for (; c + A <= chunks; c += A) {
    pf.step();
    for (int a = 0; a < A; ++a) {
      __m512i v[P];
      for (int q = 0; q < P; ++q) {
        v[q] = _mm512_load_si512(panel + q * panel_bytes + (c + a) * 64);
        if constexpr (M == 1) decode_prefetch(panel, q, panel_bytes, panel_bytes, (c + a) * 64, next, 0, 0);
      }
      for (int i = 0; i < M; ++i) {
        const __m512i xb = bcast4(xq + i * ld + (c + a) * 4);
        for (int q = 0; q < P; ++q) acc[q][i][a] = dpbusd(acc[q][i][a], v[q], xb);
      }
    }
  }
  pf.finish();
  for (; c < chunks; ++c) {
    for (int q = 0; q < P; ++q) {
      const __m512i v = _mm512_load_si512(panel + q * panel_bytes + c * 64);
      for (int i = 0; i < M; ++i) acc[q][i][0] = dpbusd(acc[q][i][0], v, bcast4(xq + i * ld + c * 4));
    }
  }
  for (int q = 0; q < P; ++q) {
    const __m512 sc = _mm512_load_ps(reinterpret_cast<const float*>(panel + q * panel_bytes + chunks * 64));
    const __mmask16 mask = row_mask(q == P - 1 ? rows_last : static_cast<int>(kPanelRows));
    for (int i = 0; i < M; ++i) {
      __m512i d = acc[q][i][0];
      for (int a = 1; a < A; ++a) d = _mm512_add_epi32(d, acc[q][i][a]);
      d = _mm512_sub_epi32(d, _mm512_set1_epi32(xsum128[i]));
      const __m512 r = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), sc), _mm512_set1_ps(dx[i]));
      _mm512_mask_storeu_ps(y + i * ldy + q * kPanelRows, mask, r);
    }
  }
}

// pick[j]: byte_picker_lane(j) in every 128-bit lane.
inline void byte_pickers(__m512i pick[4]) {
  for (int j = 0; j < 4; ++j) pick[j] = _mm512_broadcast_i32x4(byte_picker_lane(j));
}

// W4A16: int4 chunks unpacked to f32 in registers, f32 FMA against broadcast activations:
// y[i, r] = sum_g scale[r, g] * (sum_{t in g} nib[r, t] * x[i, t] - xsum8[i, g]), xsum8 = 8 * sum
// of the group's x. Column j of a chunk is byte j % 4 of the low (j < 4) or high nibbles; one
// vpshufb moves it into the low byte of every lane (zeros above), so a column costs a
// shuffle, a convert and the FMAs.
template <int M>
void w4a16_panel(const uint8_t* panel, int64_t chunks, int64_t groups, int64_t gs, const float* x, int64_t k,
                 const float* xsum8, float* y, int64_t ldy, int rows_valid) {
  constexpr int A = M == 1 ? 4 : (M == 2 ? 2 : 1);  // independent FMA chains per token
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512i pick[4];
  byte_pickers(pick);
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(panel + chunks * 64);
  const int64_t chunks_per_group = gs / 8;
  __m512 facc[M];
  for (int i = 0; i < M; ++i) facc[i] = _mm512_setzero_ps();
  const uint8_t* p = panel;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 gacc[M][A];
    for (int i = 0; i < M; ++i)
      for (int a = 0; a < A; ++a) gacc[i][a] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks_per_group; ++c, p += 64) {
      const __m512i v = _mm512_load_si512(p);
      if constexpr (M == 1) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchAhead), _MM_HINT_T0);
      const __m512i nib[2] = {_mm512_and_si512(v, low), _mm512_and_si512(_mm512_srli_epi16(v, 4), low)};
      const int64_t col0 = g * gs + c * 8;
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m512 wv = _mm512_cvtepi32_ps(_mm512_shuffle_epi8(nib[j / 4], pick[j % 4]));
        for (int i = 0; i < M; ++i)
          gacc[i][j % A] = _mm512_fmadd_ps(wv, _mm512_set1_ps(x[i * k + col0 + j]), gacc[i][j % A]);
      }
    }
    const __m512 sc = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales + g * kPanelRows)));
    for (int i = 0; i < M; ++i) {
      __m512 s = gacc[i][0];
      for (int a = 1; a < A; ++a) s = _mm512_add_ps(s, gacc[i][a]);
      s = _mm512_sub_ps(s, _mm512_set1_ps(xsum8[i * groups + g]));
      facc[i] = _mm512_fmadd_ps(s, sc, facc[i]);
    }
  }
  for (int i = 0; i < M; ++i) _mm512_mask_storeu_ps(y + i * ldy, row_mask(rows_valid), facc[i]);
}

// wbuf[c, q * 16 + r] = weight of row r of panel q at column c0 + c, c < cols (multiple of 8).
template <int P>
void w4a16_unpack_block(const uint8_t* panel, int64_t panel_bytes, int64_t chunks, int64_t gs, int64_t c0, int64_t cols,
                        float* wbuf) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512i pick[4];
  byte_pickers(pick);
  const __m512 eight = _mm512_set1_ps(8.0f);
  for (int q = 0; q < P; ++q) {
    const uint8_t* pq = panel + q * panel_bytes;
    const uint16_t* scales = reinterpret_cast<const uint16_t*>(pq + chunks * 64);
    for (int64_t c = 0; c < cols; c += 8) {
      const int64_t col = c0 + c;
      const __m512 sc =
          _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales + col / gs * kPanelRows)));
      const __m512i v = _mm512_load_si512(pq + col / 8 * 64);
      const __m512i nib[2] = {_mm512_and_si512(v, low), _mm512_and_si512(_mm512_srli_epi16(v, 4), low)};
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m512 wq = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_shuffle_epi8(nib[j / 4], pick[j % 4])), eight);
        _mm512_store_ps(wbuf + (c + j) * (P * kPanelRows) + q * kPanelRows, _mm512_mul_ps(wq, sc));
      }
    }
  }
}

// acc[i, :] += sum_c wbuf[c, :] * x[i, c0 + c] for M tokens, P * 16 rows.
template <int M, int P>
void w4a16_block_tile(const float* wbuf, int64_t cols, const float* x, int64_t k, int64_t c0, float* acc) {
  __m512 a[M][P];
  for (int i = 0; i < M; ++i)
    for (int q = 0; q < P; ++q) a[i][q] = _mm512_loadu_ps(acc + i * (P * kPanelRows) + q * kPanelRows);
  const float* xb = x + c0;
  for (int64_t c = 0; c < cols; ++c) {
    __m512 wv[P];
    for (int q = 0; q < P; ++q) wv[q] = _mm512_load_ps(wbuf + c * (P * kPanelRows) + q * kPanelRows);
    for (int i = 0; i < M; ++i) {
      const __m512 xv = _mm512_set1_ps(xb[i * k + c]);
      for (int q = 0; q < P; ++q) a[i][q] = _mm512_fmadd_ps(wv[q], xv, a[i][q]);
    }
  }
  for (int i = 0; i < M; ++i)
    for (int q = 0; q < P; ++q) _mm512_storeu_ps(acc + i * (P * kPanelRows) + q * kPanelRows, a[i][q]);
}

// ---- AMX (Sapphire Rapids and later): W8A8 prefill on tile registers ----------------------
//
// A w8a8 panel is already the B operand of an int8 tile product in its VNNI layout: 16
// chunks (64 columns of x) are 16 tile rows of 64 bytes, lane r = weight row r. So
// tdpbsud (s8 activations x u8 weights) multiplies 16 tokens x 64 columns by a panel's
// 64 x 16 block, 16384 multiply-adds per instruction, ~8x the vpdpbusd rate. The integer
// sums are the same as the VNNI kernel's, and so is the float epilogue: bit-identical y.
// Used when the CPU has AMX-INT8, Linux grants the tile state, k is a multiple of 64 and
// the call has at least kAmxMinTokens tokens (set_quant_amx(false) turns it off: tests;
// INFERA_AMX=0 in the environment too: A/B runs).

constexpr int64_t kAmxMinTokens = 8;

bool amx_usable() { return amx_unavailable_reason() == nullptr; }

const char* amx_status() {
  const char* why = amx_unavailable_reason();
  return why != nullptr ? why : "in use";
}

// Tiles 0-1: A (16 tokens x 64 columns of xq), 2-3: B (a panel's 64 columns), 4-7: C
// (16 tokens x 16 rows of int32), C[4 + 2a + b] = A[a] . B[b].
__attribute__((target("amx-tile,amx-int8"))) void amx_configure() { amx_tiles::load_tiles(amx_tiles::all_16x64()); }

__attribute__((target("amx-tile,amx-int8"))) void amx_release() { _tile_release(); }

// y[i, q * 16 + r] for TA * 16 tokens (rows of xq; rows past the call's tokens are zero
// padding, not stored: tokens_valid) over P adjacent panels of a w8a8 matrix.
template <int TA, int P>
__attribute__((target("amx-tile,amx-int8"))) void w8a8_amx_tile(const uint8_t* panel, int64_t panel_bytes,
                                                                int64_t chunks, const int8_t* xq, int64_t ld,
                                                                const int32_t* xsum128, const float* dx, float* y,
                                                                int64_t ldy, int64_t tokens_valid, int rows_last) {
  _tile_zero(4);
  if constexpr (P == 2) _tile_zero(5);
  if constexpr (TA == 2) _tile_zero(6);
  if constexpr (TA == 2 && P == 2) _tile_zero(7);
  for (int64_t c = 0; c < chunks; c += 16) {
    _tile_loadd(2, panel + c * 64, 64);
    if constexpr (P == 2) _tile_loadd(3, panel + panel_bytes + c * 64, 64);
    _tile_loadd(0, xq + c * 4, ld);
    _tile_dpbsud(4, 0, 2);
    if constexpr (P == 2) _tile_dpbsud(5, 0, 3);
    if constexpr (TA == 2) {
      _tile_loadd(1, xq + 16 * ld + c * 4, ld);
      _tile_dpbsud(6, 1, 2);
      if constexpr (P == 2) _tile_dpbsud(7, 1, 3);
    }
  }
  alignas(64) int32_t c_out[4][16 * 16];
  _tile_stored(4, c_out[0], 64);
  if constexpr (P == 2) _tile_stored(5, c_out[1], 64);
  if constexpr (TA == 2) _tile_stored(6, c_out[2], 64);
  if constexpr (TA == 2 && P == 2) _tile_stored(7, c_out[3], 64);
  for (int a = 0; a < TA; ++a)
    for (int q = 0; q < P; ++q) {
      const __m512 sc = _mm512_load_ps(reinterpret_cast<const float*>(panel + q * panel_bytes + chunks * 64));
      const __mmask16 mask = row_mask(q == P - 1 ? rows_last : static_cast<int>(kPanelRows));
      const int32_t* cq = c_out[2 * a + q];
      for (int64_t t = 0; t < 16 && a * 16 + t < tokens_valid; ++t) {
        const int64_t i = a * 16 + t;
        const __m512i d = _mm512_sub_epi32(_mm512_load_si512(cq + t * 16), _mm512_set1_epi32(xsum128[i]));
        const __m512 r = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), sc), _mm512_set1_ps(dx[i]));
        _mm512_mask_storeu_ps(y + i * ldy + q * kPanelRows, mask, r);
      }
    }
}

// Panels [p0, p1) of a w8a8 matrix for all m tokens (xq has rows up to a multiple of 32).
void w8a8_amx_panels(const PackedQuantMat& pk, int64_t p0, int64_t p1, int64_t n, const int8_t* xq, int64_t ld,
                     const int32_t* xsum128, const float* dx, int64_t m, float* y) {
  amx_configure();
  for (int64_t p = p0; p < p1; p += 2) {
    const int64_t np = std::min<int64_t>(2, p1 - p);
    const int rows_last = static_cast<int>(std::min<int64_t>(kPanelRows, n - (p + np - 1) * kPanelRows));
    for (int64_t i0 = 0; i0 < m; i0 += 32) {
      const bool two_a = m - i0 > 16;
      const uint8_t* panel = pk.panel(p);
      const int8_t* xt = xq + i0 * ld;
      float* yt = y + i0 * n + p * kPanelRows;
      const int64_t valid = m - i0;
      if (np == 2) {
        if (two_a)
          w8a8_amx_tile<2, 2>(panel, pk.panel_bytes, pk.chunks, xt, ld, xsum128 + i0, dx + i0, yt, n, valid, rows_last);
        else
          w8a8_amx_tile<1, 2>(panel, pk.panel_bytes, pk.chunks, xt, ld, xsum128 + i0, dx + i0, yt, n, valid, rows_last);
      } else {
        if (two_a)
          w8a8_amx_tile<2, 1>(panel, pk.panel_bytes, pk.chunks, xt, ld, xsum128 + i0, dx + i0, yt, n, valid, rows_last);
        else
          w8a8_amx_tile<1, 1>(panel, pk.panel_bytes, pk.chunks, xt, ld, xsum128 + i0, dx + i0, yt, n, valid, rows_last);
      }
    }
  }
  amx_release();
}

// Lanes [0, rows) of the 16 floats at v to y.
inline void store_panel_rows(float* y, const float* v, int rows) {
  _mm512_mask_storeu_ps(y, row_mask(rows), _mm512_loadu_ps(v));
}
#else
#include "infera/kernels/cpu/quant_panels_avx2.h"
#endif

// y[i, 16 * q + r] for all m tokens over P adjacent panels.
template <int P>
void w4a16_panels_gemm(const uint8_t* panel, int64_t panel_bytes, int64_t chunks, int64_t gs, const float* x, int64_t m,
                       int64_t k, float* y, int64_t ldy, int rows_last) {
  constexpr int64_t kRows = P * kPanelRows;
  alignas(64) static thread_local float wbuf[kW4A16BlockCols * kPrefillPanels * kPanelRows];
  static thread_local std::vector<float> acc_storage;
  acc_storage.assign(static_cast<size_t>(m * kRows), 0.0f);
  float* acc = acc_storage.data();
  for (int64_t c0 = 0; c0 < k; c0 += kW4A16BlockCols) {
    const int64_t cols = std::min(kW4A16BlockCols, k - c0);
    w4a16_unpack_block<P>(panel, panel_bytes, chunks, gs, c0, cols, wbuf);
    for (int64_t i0 = 0; i0 < m; i0 += kTileTokens) {
      with_tile_tokens(std::min<int64_t>(kTileTokens, m - i0),
                       [&]<int M>() { w4a16_block_tile<M, P>(wbuf, cols, x + i0 * k, k, c0, acc + i0 * kRows); });
    }
  }
  for (int64_t i = 0; i < m; ++i)
    for (int q = 0; q < P; ++q)
      store_panel_rows(y + i * ldy + q * kPanelRows, acc + i * kRows + q * kPanelRows,
                       q == P - 1 ? rows_last : static_cast<int>(kPanelRows));
}

// Quantizes x [m, w.cols] for the panel kernels of w's scheme into the thread's scratch
// (int8 rows of stride activation_ld, scales, integer corrections; W4A16 decode: 8 x group
// sums of x). use_amx: zero rows up to whole 32-token tiles (the AMX kernel reads them).
ActivationScratch& prepare_activations(const float* x, int64_t m, const QuantMatRef& w, bool use_amx) {
  const int64_t k = w.cols, groups = w.groups_per_row(), gs = w.group_size;
  ActivationScratch& s = activation_scratch();
  const int64_t ld = activation_ld(k), bld = ld / 32;
  const bool a8 = scheme_quantizes_activations(w.scheme);
  if (a8) {
    // Rows up to a multiple of 32 tokens: the AMX kernel loads whole 16-token tiles (zeros).
    const int64_t rows = use_amx ? (m + 31) / 32 * 32 : m;
    s.q.resize(static_cast<size_t>(rows * ld));
    if (use_amx) std::memset(s.q.data() + m * ld, 0, static_cast<size_t>((rows - m) * ld));
    s.scale.resize(static_cast<size_t>(m));
    s.block_sums.resize(static_cast<size_t>(m * bld));
    quantize_activations(x, m, k, s.q.data(), ld, s.scale.data(), s.block_sums.data());
    // Per token and group the integer correction: w4a8 8 * sum(xq in group); w8a8 128 * sum(xq).
    const int64_t per_token = w.scheme == QuantScheme::kW4A8 ? groups : 1;
    s.corr.resize(static_cast<size_t>(m * per_token));
    for (int64_t i = 0; i < m; ++i) {
      const int32_t* bs = s.block_sums.data() + i * bld;
      if (w.scheme == QuantScheme::kW4A8) {
        const int64_t bpg = gs / 32;
        for (int64_t g = 0; g < groups; ++g) {
          int32_t sum = 0;
          for (int64_t b = 0; b < bpg; ++b) sum += bs[g * bpg + b];
          s.corr[i * groups + g] = 8 * sum;
        }
      } else {
        int32_t sum = 0;
        for (int64_t b = 0; b < bld; ++b) sum += bs[b];
        s.corr[i] = 128 * sum;
      }
    }
  }
  if (w.scheme == QuantScheme::kW4A16 && m == 1) {
    // 8 * (sum of each group's x): the nibbles carry +8.
    s.xsum8.resize(static_cast<size_t>(m * groups));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t g = 0; g < groups; ++g) {
        float sum = 0.0f;
        for (int64_t t = g * gs; t < (g + 1) * gs; ++t) sum += x[i * k + t];
        s.xsum8[i * groups + g] = 8.0f * sum;
      }
  }
  return s;
}

// One token (m = 1) over panels [p0, p1) of w's packed copy, activations prepared by
// prepare_activations: every scheme sweeps kDecodePanels panels at once (w4a16: one), the
// next group prefetched from the current one's tail.
// `after`: the panels swept right after p1 (the next matrix of a joint pass), prefetched from
// the last group's tail like the piece's own next groups.
void decode_panels(const QuantMatRef& w, int64_t p0, int64_t p1, const float* x, const ActivationScratch& s, float* y,
                   NextPanels after = {}) {
  const PackedQuantMat& pk = *w.packed;
  const int64_t k = w.cols, n = w.rows, groups = w.groups_per_row(), gs = w.group_size;
  const int64_t chunks = pk.chunks, pb = pk.panel_bytes, ld = activation_ld(k);
  const int8_t* xq = s.q.data();
  const float* dx = s.scale.data();
  const int32_t* corr = s.corr.data();
  auto rows_in = [&](int64_t p) { return static_cast<int>(std::min<int64_t>(kPanelRows, n - p * kPanelRows)); };
  if (w.scheme == QuantScheme::kW4A16) {
    for (int64_t p = p0; p < p1; ++p)
      w4a16_panel<1>(pk.panel(p), chunks, groups, gs, x, k, s.xsum8.data(), y + p * kPanelRows, n, rows_in(p));
    return;
  }
  for (int64_t p = p0; p < p1;) {
    const int64_t np = std::min<int64_t>(kDecodePanels, p1 - p);
    const NextPanels next =
        p + np < p1 ? NextPanels{pk.panel(p + np), static_cast<int>(std::min<int64_t>(kDecodePanels, p1 - p - np))}
                    : after;
    with_panels<kDecodePanels>(np, [&]<int P>() {
      if (w.scheme == QuantScheme::kW4A8) {
        w4a8_panels<1, P>(pk.panel(p), pb, chunks, groups, gs, xq, ld, corr, dx, y + p * kPanelRows, n,
                          rows_in(p + P - 1), {}, next);
      } else {
        w8a8_panels<1, P>(pk.panel(p), pb, chunks, xq, ld, corr, dx, y + p * kPanelRows, n, rows_in(p + P - 1), {},
                          next);
      }
    });
    p += np;
  }
}

// Pieces of `panels` for `threads`: several per thread (dynamic balance on a shared machine),
// each a whole number of the kernels' panel groups.
int64_t piece_grain(int64_t panels, int64_t m, int threads) {
  const int64_t multiple = m == 1 ? kDecodePanels : 6;  // whole decode groups; prefill: groups of 2 (w4a8) and 3 panels
  const int64_t grain = std::max<int64_t>(multiple, panels / (8 * std::max(threads, 1)));
  return (grain + multiple - 1) / multiple * multiple;
}

// Threads split the panels (prefill: pieces handed out dynamically; decode: shares); inside
// a piece every panel (or pair, w8a8) is swept by all tokens in tiles of kTileTokens while it
// sits in L1/L2.
void qmatmul_packed(const float* x, int64_t m, const QuantMatRef& w, float* y) {
  const PackedQuantMat& pk = *w.packed;
  const int64_t k = w.cols, n = w.rows, groups = w.groups_per_row(), gs = w.group_size;
  const int64_t panels = pk.panels, chunks = pk.chunks, pb = pk.panel_bytes;
#if INFERA_QUANT_AVX512
  const bool use_amx =
      w.scheme == QuantScheme::kW8A8 && m >= kAmxMinTokens && k % 64 == 0 && quant_amx_enabled() && amx_usable();
#else
  constexpr bool use_amx = false;  // (AVX-512 CPUs alone have AMX)
#endif
  const ActivationScratch& s = prepare_activations(x, m, w, use_amx);
  const int64_t ld = activation_ld(k);
  const int8_t* xq = s.q.data();
  const float* dx = s.scale.data();
  const int32_t* corr = s.corr.data();
  const int64_t grain = piece_grain(panels, m, num_threads());
  auto rows_in = [&](int64_t p) { return static_cast<int>(std::min<int64_t>(kPanelRows, n - p * kPanelRows)); };
  const auto piece = [&](int64_t p0, int64_t p1) {
    switch (w.scheme) {
      case QuantScheme::kW4A8:
        if (m > 1) {
          // Prefill: kTileTokens tokens x 2 panels (16 accumulators), the next pair
          // prefetched over the token tiles.
          const int64_t tiles = (m + kTileTokens - 1) / kTileTokens;
          for (int64_t p = p0; p < p1; p += 2) {
            const int64_t np = std::min<int64_t>(2, p1 - p);
            const int64_t next_panels = std::min<int64_t>(2, p1 - p - np);
            for (int64_t i0 = 0; i0 < m; i0 += kTileTokens) {
              const L2Prefetch pf = next_panels > 0
                                        ? prefetch_part(pk.panel(p + np), next_panels * pb, tiles, i0 / kTileTokens)
                                        : L2Prefetch{};
              with_tile_tokens(std::min<int64_t>(kTileTokens, m - i0), [&]<int M>() {
                auto run = [&]<int P>() {
                  w4a8_panels<M, P>(pk.panel(p), pb, chunks, groups, gs, xq + i0 * ld, ld, corr + i0 * groups, dx + i0,
                                    y + i0 * n + p * kPanelRows, n, rows_in(p + np - 1), pf);
                };
                with_panels<2>(np, run);
              });
            }
          }
          break;
        }
        decode_panels(w, p0, p1, x, s, y);
        break;
      case QuantScheme::kW8A8:
#if INFERA_QUANT_AVX512
        if (use_amx) {
          w8a8_amx_panels(pk, p0, p1, n, xq, ld, corr, dx, m, y);
          break;
        }
#endif
        if (m == 1) {
          decode_panels(w, p0, p1, x, s, y);
          break;
        }
        // A prefill tile takes kPrefillPanels panels.
        for (int64_t p = p0; p < p1; p += kPrefillPanels) {
          const int64_t np = std::min<int64_t>(kPrefillPanels, p1 - p);
          const int rows_last = rows_in(p + np - 1);
          // The next group of this piece, prefetched over this group's token tiles.
          const int64_t next_panels = std::min<int64_t>(kPrefillPanels, p1 - p - np);
          const int64_t tiles = (m + kTileTokens - 1) / kTileTokens;
          for (int64_t i0 = 0; i0 < m; i0 += kTileTokens) {
            const L2Prefetch pf = next_panels > 0
                                      ? prefetch_part(pk.panel(p + np), next_panels * pb, tiles, i0 / kTileTokens)
                                      : L2Prefetch{};
            with_tile_tokens(std::min<int64_t>(kTileTokens, m - i0), [&]<int M>() {
              auto run = [&]<int P>() {
                w8a8_panels<M, P>(pk.panel(p), pb, chunks, xq + i0 * ld, ld, corr + i0, dx + i0,
                                  y + i0 * n + p * kPanelRows, n, rows_last, pf);
              };
              with_panels<kPrefillPanels>(np, run);
            });
          }
        }
        break;
      case QuantScheme::kW4A16:
        if (m == 1) {
          decode_panels(w, p0, p1, x, s, y);
          break;
        }
        for (int64_t p = p0; p < p1; p += kPrefillPanels) {
          const int64_t np = std::min<int64_t>(kPrefillPanels, p1 - p);
          auto run = [&]<int P>() {
            w4a16_panels_gemm<P>(pk.panel(p), pb, chunks, gs, x, m, k, y + p * kPanelRows, n, rows_in(p + np - 1));
          };
          with_panels<kPrefillPanels>(np, run);
        }
        break;
    }
  };
  // A decode step: each thread's share front to back, a lagging thread's last pieces taken
  // by the others (parallel_shares; W4A8 TinyLlama-shaped, two threads, end to end,
  // alternating: 63.2-64.6 tokens/s against 54.9-62.8 with pieces handed out one by one).
  if (m == 1)
    parallel_shares(panels, grain, num_threads(), piece);
  else
    parallel_chunks(panels, grain, piece);
}

// One token against several matrices that share it (q/k/v, gate/up): the activations are
// quantized once and the panels of all matrices are one index space split over the threads
// (one parallel region instead of one per matrix; a small matrix no longer runs alone).
// The caller checked: every matrix packed, one scheme, cols and group size.
void qgemv_packed_multi(const float* x, const QuantMatRef* const* ws, float* const* ys, int count) {
  const ActivationScratch& s = prepare_activations(x, 1, *ws[0], false);
  static thread_local std::vector<int64_t> starts;  // per call on the decode path: no allocation once warm
  std::vector<int64_t>& first = starts;  // (a reference: the workers below must see this thread's)
  first.assign(static_cast<size_t>(count) + 1, 0);  // first global panel of each matrix
  for (int i = 0; i < count; ++i) first[i + 1] = first[i] + ws[i]->packed->panels;
  const int64_t total = first[count];
  // Pieces in whole decode groups of every matrix: a piece may span matrices, each part runs
  // as its own range.
  const int64_t grain = piece_grain(total, 1, num_threads());
  parallel_shares(total, grain, num_threads(), [&](int64_t p0, int64_t p1) {
    for (int i = 0; i < count; ++i) {
      const int64_t a = std::max(p0, first[i]), b = std::min(p1, first[i + 1]);
      if (a >= b) continue;
      // The piece goes on into the next matrix (same panel size: gate/up, experts): its
      // first panels are prefetched from this part's tail.
      NextPanels after;
      if (b == first[i + 1] && i + 1 < count && p1 > first[i + 1] &&
          ws[i + 1]->packed->panel_bytes == ws[i]->packed->panel_bytes) {
        after = {ws[i + 1]->packed->panel(0),
                 static_cast<int>(std::min<int64_t>({kDecodePanels, p1 - first[i + 1], ws[i + 1]->packed->panels}))};
      }
      decode_panels(*ws[i], a - first[i], b - first[i], x, s, ys[i], after);
    }
  });
}

void qmatmul(const float* x, int64_t m, const QuantMatRef& w, float* y) {
  if (m == 0 || w.rows == 0) return;
  const int64_t k = w.cols, n = w.rows;
  Operands ops{&w, x, nullptr, 0, nullptr, nullptr};
  if (scheme_quantizes_activations(w.scheme)) {
    ActivationScratch& s = activation_scratch();
    const int64_t ld = activation_ld(k);
    s.q.resize(static_cast<size_t>(m * ld));
    s.scale.resize(static_cast<size_t>(m));
    const bool sums = w.scheme == QuantScheme::kW4A8;
    if (sums) s.block_sums.resize(static_cast<size_t>(m * (ld / 32)));
    quantize_activations(x, m, k, s.q.data(), ld, s.scale.data(), sums ? s.block_sums.data() : nullptr);
    ops.xq = s.q.data();
    ops.ld = ld;
    ops.dx = s.scale.data();
    ops.bsums = sums ? s.block_sums.data() : nullptr;
  }
  switch (w.scheme) {
    case QuantScheme::kW8A8: sweep<W8A8Tile>(ops, m, n, k, y); break;
    case QuantScheme::kW4A8: sweep<W4A8Tile>(ops, m, n, k / 2, y); break;
    case QuantScheme::kW4A16: sweep<W4A16Tile>(ops, m, n, k / 2, y); break;
  }
}

}  // namespace

const QuantKernelTable& table() {
#if INFERA_QUANT_AVX512
  static const QuantKernelTable t{&quantize_activations, &qmatmul, &qmatmul_packed, &qgemv_packed_multi, &amx_status};
#else
  static const QuantKernelTable t{&quantize_activations, &qmatmul, &qmatmul_packed, &qgemv_packed_multi, nullptr};
#endif
  return t;
}

}  // namespace infera::kernels::INFERA_QUANT_NS
