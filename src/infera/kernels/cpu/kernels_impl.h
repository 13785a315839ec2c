// The optimized kernels, written once over the Simd abstraction (simd.h) and compiled
// three times: kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512.cpp each define
// INFERA_SIMD_LEVEL and INFERA_KERNEL_NS, then include this file. Include it from nowhere
// else: everything lives in an anonymous namespace inside the per-ISA namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "infera/base/error.h"
#include "infera/base/threads.h"
#include "infera/kernels/cpu/amx_tiles.h"
#include "infera/kernels/cpu/dispatch.h"
#include "infera/kernels/cpu/simd.h"

namespace infera::kernels::INFERA_KERNEL_NS {
namespace {

using S = Simd;
using V = S::V;
constexpr int L = S::kLanes;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A per-thread buffer that only grows (no allocation per call once warm), 64-byte aligned.
struct Scratch {
  std::vector<float> storage;
  float* get(size_t n) {
    if (storage.size() < n + 16) storage.resize(n + 16);
    auto addr = reinterpret_cast<uintptr_t>(storage.data());
    return reinterpret_cast<float*>((addr + 63) & ~uintptr_t{63});
  }
};

// Runs f(i0, i1) over [0, n) split into one contiguous piece per thread, or inline when
// n is too small for a parallel region (~1-2 us) to pay off.
template <class F>
void parallel_range(int64_t n, int64_t grain, F&& f) {
  const int threads = num_threads();
  if (threads <= 1 || n < 2 * grain || omp_in_parallel()) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t pieces = std::min<int64_t>(threads, n / grain);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t p = 0; p < pieces; ++p) f(n * p / pieces, n * (p + 1) / pieces);
}

// ---------------------------------------------------------------------------------------
// Weight access by dtype: a vector of L weights as f32, or one weight.
template <DType D>
struct Weights;
template <>
struct Weights<DType::kF32> {
  using T = float;
  static V load(const T* p) { return S::load(p); }
  static float one(const T* p) { return *p; }
};
template <>
struct Weights<DType::kBF16> {
  using T = uint16_t;
  static V load(const T* p) { return S::load_bf16(p); }
  static float one(const T* p) { return bf16_to_f32(*p); }
};
template <>
struct Weights<DType::kF16> {
  using T = uint16_t;
  static V load(const T* p) { return S::load_f16(p); }
  static float one(const T* p) { return f16_to_f32(*p); }
};

// Whether a decode step reads D's weights as even / odd pairs (S::load_bf16_pairs) against x
// deinterleaved to match (deinterleave_pairs): bf16 on the vector paths. A 64-byte load, a
// shift and a mask instead of two widening loads (a shuffle each): from L2 (128 x 2048, one
// thread, Zen 4 EPYC) 58.5 -> 75-79 GB/s, from memory within the noise (end to end, bf16
// TinyLlama-shaped, one thread, 13.8-14.1 -> 13.8-14.6 tokens/s); the sums' order changes
// (each lane sums every other weight), alike for every row count.
template <DType D>
constexpr bool kPairs = (D == DType::kBF16) && L > 1;

// x's rows [m, k] with each block of 2L elements as its L even-indexed ones then its L odd
// ones (the blocks that fit whole; the rest as they are): what a bf16 pair load multiplies.
inline void deinterleave_pairs(const float* x, int64_t m, int64_t k, float* out) {
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * k;
    float* o = out + i * k;
    int64_t t = 0;
    for (; t + 2 * L <= k; t += 2 * L)
      for (int j = 0; j < L; ++j) {
        o[t + j] = xi[t + 2 * j];
        o[t + L + j] = xi[t + 2 * j + 1];
      }
    for (; t < k; ++t) o[t] = xi[t];
  }
}

// ---------------------------------------------------------------------------------------
// GEMV (m < kGemmMinRows): memory bound, so W is streamed once per kGemvMaxRows rows of x,
// straight from its stored dtype, R rows at a time (R independent FMA chains hide latency and keep R
// streams in flight); each W vector is used for all M rows of x. (kGemvMaxRows and
// kGemmMinRows: dispatch.h.)
// A piece of rows is read as R streams (R = 4 for one row of x), like the four streams
// `sysinfo --bandwidth` reads: stream r covers the r-th quarter of the piece's rows,
// contiguous memory, and a tile takes one row from each, a 64-byte line per row and step.
// Whether each row is also prefetched in software, and how far ahead into L1, is the one
// setting whose best value differs between machines, so it is chosen at run time
// (kernels::gemv_prefetch_for: `pf` bytes ahead, 0 for none). A prefetch runs on into the
// stream's next row (the next in memory), so no page boundary stops it: weights mapped from
// a file sit on 4 KiB pages, where the hardware prefetchers stop at every boundary (a
// 2048-long bf16 row is one page). Measured on the TinyLlama shapes (8 layers' matrices,
// 705 MB, bf16 / f16, one thread), GB/s: on a 2-core AMD EPYC under load 5-7, 4 streams 2
// KiB ahead 35.8 / 34.9 (1 KiB 33.3, 4 KiB 29.8, into L2 31.1; 6 streams 30.7, 8 streams
// 26.2), the read probe 35.9 in the same runs; the earlier tiles of 8 adjacent rows with
// the next tile prefetched into L2 24.7 / 27.0. On another, idle AMD EPYC (Zen 4, probe
// 28.2) the same 2 KiB prefetch lost: 4 streams 2 KiB ahead 23.1, 512 B 28.5, none 28.9
// (huge pages 23.8 / 29.8 / 30.3; 2 streams 25.5, 8 streams 25.5, one row at a time 17.5).
constexpr int kGemvStreams = 4;

// One block of 2L bf16 weights at u of R rows, as even / odd pairs (S::load_bf16_pairs; with
// kKept each weight ANDed with keep's mask first), against M rows of x deinterleaved to
// match (xd, rows ld apart): acc[i][r] += x_i . w_r over the block.
template <int M, int R, bool kKept = false>
inline void pair_step(const float* xd, int64_t ld, const uint16_t* const* row, int64_t u, const uint16_t* keep,
                      V (&acc)[M][R]) {
  V xe[M], xo[M];
  for (int i = 0; i < M; ++i) {
    xe[i] = S::load(xd + i * ld + u);
    xo[i] = S::load(xd + i * ld + u + L);
  }
  for (int r = 0; r < R; ++r) {
    V we, wo;
    if constexpr (kKept)
      S::load_bf16_pairs_kept(row[r] + u, keep, we, wo);
    else
      S::load_bf16_pairs(row[r] + u, we, wo);
    for (int i = 0; i < M; ++i) acc[i][r] = S::fma(xo[i], wo, S::fma(xe[i], we, acc[i][r]));
  }
}
constexpr int kAccRegs = L == 16 ? 16 : 8;  // accumulators that fit beside the operands

// Rows w + r * rs * k (r < R) against M rows of x; row r's sums go to y[i * ldy + r * rs].
// xd: x deinterleaved (deinterleave_pairs) where kPairs<D>.
template <DType D, int M, int R, bool kPrefetch>
inline void gemv_tile(const float* x, const float* xd, int64_t k, const typename Weights<D>::T* w, int64_t rs, float* y,
                      int64_t ldy, int64_t pf) {
  using W = Weights<D>;
  using T = typename W::T;
  constexpr int64_t kLine = 64;
  constexpr int64_t kStep = std::max<int64_t>(L, kLine / static_cast<int64_t>(sizeof(T)));  // one line per row
  const T* row[R];
  for (int r = 0; r < R; ++r) row[r] = w + r * rs * k;
  V acc[M][R];
  for (int i = 0; i < M; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = S::zero();
  int64_t t = 0;
  for (; t + kStep <= k; t += kStep) {
    // May point past the matrix: a prefetch never faults.
    if constexpr (kPrefetch) {
      for (int r = 0; r < R; ++r) S::prefetch(reinterpret_cast<const char*>(row[r] + t) + pf);
    }
    if constexpr (kPairs<D>) {
      static_assert(kStep % (2 * L) == 0);
      for (int64_t u = t; u < t + kStep; u += 2 * L) pair_step<M, R>(xd, k, row, u, nullptr, acc);
    } else {
      for (int64_t u = t; u < t + kStep; u += L) {
        V xv[M];
        for (int i = 0; i < M; ++i) xv[i] = S::load(x + i * k + u);
        for (int r = 0; r < R; ++r) {
          const V wv = W::load(row[r] + u);
          for (int i = 0; i < M; ++i) acc[i][r] = S::fma(xv[i], wv, acc[i][r]);
        }
      }
    }
  }
  for (; t + L <= k; t += L) {
    V xv[M];
    for (int i = 0; i < M; ++i) xv[i] = S::load(x + i * k + t);
    for (int r = 0; r < R; ++r) {
      const V wv = W::load(row[r] + t);
      for (int i = 0; i < M; ++i) acc[i][r] = S::fma(xv[i], wv, acc[i][r]);
    }
  }
  for (int i = 0; i < M; ++i) {
    for (int r = 0; r < R; ++r) {
      float s = S::reduce_add(acc[i][r]);
      for (int64_t u = t; u < k; ++u) s += x[i * k + u] * W::one(row[r] + u);
      y[i * ldy + r * rs] = s;
    }
  }
}

// bf16 (and f16) rows that do not start on a 64-byte line: a Hugging Face checkpoint's tensors sit at
// whatever offset the safetensors header leaves them, a GGUF file's on multiples of 32. A
// pair load (64 bytes on AVX-512) from such a row straddles two lines every time: one
// thread, bf16, 10 TinyLlama-shaped layers from memory, rows 16 or 32 bytes off a line
// 21.0-23.5 GB/s against 25.9-29.2 on lines (f16, 32-byte loads: alike either way; end to
// end, a TinyLlama-shaped checkpoint 8 bytes off: 8.7-9.7 -> 12.4-14.3 tokens/s). So a
// row of k weights, a multiple of 32, is read as whole lines instead: from the line that
// holds its first weight (the `a` weights before it, another row's or another tensor's,
// zeroed by a mask) to the one that holds its last (the rest zeroed). x is laid over the
// same lines (element v of the lines is x[v - a], zero outside x), deinterleaved per block
// of 2L as kPairs reads it. Rows on a line (a = 0) go the same way, with the same sums bit
// for bit as gemv_tile's pairs: 3-9% faster than it there (same process, alternating, one
// and two threads, every prefetch setting); gemv_tile keeps the rows of other lengths. f16
// rows too (32-byte loads, x laid over the lines as it is): the same sums as gemv_tile's on
// a line, and 4-11% faster than it (one thread: one setting of six 4% slower), 9% off one.
constexpr int64_t kLineHalves = 32;  // 16-bit weights per 64-byte line

template <DType D>
inline void lay_lines(const float* x, int64_t m, int64_t k, int64_t a, int64_t lines, float* out) {
  const int64_t n = lines * kLineHalves;
  const auto at = [&](const float* xi, int64_t v) { return v >= 0 && v < k ? xi[v] : 0.0f; };
  for (int64_t i = 0; i < m; ++i)
    for (int64_t t = 0; t < n; t += 2 * L)
      for (int j = 0; j < L; ++j) {
        if constexpr (kPairs<D>) {
          out[i * n + t + j] = at(x + i * k, t + 2 * j - a);
          out[i * n + t + L + j] = at(x + i * k, t + 2 * j + 1 - a);
        } else {
          out[i * n + t + j] = at(x + i * k, t + j - a);
          out[i * n + t + L + j] = at(x + i * k, t + L + j - a);
        }
      }
}

// One block of L f16 weights at u of R rows (with kKept each ANDed with keep's mask first)
// against M rows of x (rows ld apart).
template <int M, int R, bool kKept = false>
__attribute__((always_inline)) inline void half_step(const float* x, int64_t ld, const uint16_t* const* row, int64_t u,
                                                     const uint16_t* keep, V (&acc)[M][R]) {
  V xv[M];
  for (int i = 0; i < M; ++i) xv[i] = S::load(x + i * ld + u);
  for (int r = 0; r < R; ++r) {
    const V wv = kKept ? S::load_f16_kept(row[r] + u, keep) : S::load_f16(row[r] + u);
    for (int i = 0; i < M; ++i) acc[i][r] = S::fma(xv[i], wv, acc[i][r]);
  }
}

// Rows w + r * rs * k (r < R; w on a line, `lines` lines each) against M rows of x laid
// over the lines (xl); keep: the first line's mask then the last's (32 halves each).
template <DType D, int M, int R, bool kPrefetch>
inline void gemv_tile_lines(const float* xl, int64_t lines, int64_t k, const uint16_t* w, int64_t rs,
                            const uint16_t* keep, float* y, int64_t ldy, int64_t pf) {
  const uint16_t* row[R];
  for (int r = 0; r < R; ++r) row[r] = w + r * rs * k;
  V acc[M][R];
  for (int i = 0; i < M; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = S::zero();
  const int64_t n = lines * kLineHalves;
  const auto prefetch = [&](int64_t t) {
    if constexpr (kPrefetch) {
      for (int r = 0; r < R; ++r) S::prefetch(reinterpret_cast<const char*>(row[r] + t) + pf);
    }
  };
  const auto walk = [&](const auto& line) {
    line.template operator()<true>(0, keep);
    for (int64_t l = 1; l + 1 < lines; ++l) line.template operator()<false>(kLineHalves * l, nullptr);
    if (lines > 1) line.template operator()<true>(kLineHalves * (lines - 1), keep + kLineHalves);
  };
  if constexpr (kPairs<D>) {
    walk([&]<bool kKept>(int64_t t, const uint16_t* kp) {
      prefetch(t);
      for (int64_t u = t; u < t + kLineHalves; u += 2 * L)
        pair_step<M, R, kKept>(xl, n, row, u, kKept ? kp + (u - t) : nullptr, acc);
    });
  } else {
    // (f16: inlined. Called, it took acc by reference and its loop stored every sum each step,
    // as x might alias them: the MoE file's f16 prompt 1.21-1.56x, AVX2, Zen 3. The same for
    // bf16's pairs measured 0.86-0.89x.)
    walk([&]<bool kKept>(int64_t t, const uint16_t* kp) __attribute__((always_inline)) {
      prefetch(t);
      for (int64_t u = t; u < t + kLineHalves; u += L)
        half_step<M, R, kKept>(xl, n, row, u, kKept ? kp + (u - t) : nullptr, acc);
    });
  }
  for (int i = 0; i < M; ++i)
    for (int r = 0; r < R; ++r) y[i * ldy + r * rs] = S::reduce_add(acc[i][r]);
}

template <DType D, int M, bool kPrefetch>
void gemv(const float* x, int64_t k, const typename Weights<D>::T* w, int64_t n0, int64_t n1, float* y, int64_t ldy,
          int64_t pf) {
  constexpr int R = std::max(1, std::min(kGemvStreams, kAccRegs / M));
  // Pieces of ~256 KiB of weights (~90 for a 2048 x 5632 bf16 matrix): each thread reads its
  // share of them front to back, the last pieces of a lagging one taken by the others
  // (parallel_shares; against pieces handed out one by one, f16 / bf16 TinyLlama-shaped
  // layers, two threads, alternating in one process: 1-2% faster); one thread takes the
  // whole range as one piece.
  const int64_t row_bytes = k * static_cast<int64_t>(sizeof(typename Weights<D>::T));
  const int64_t grain = std::max<int64_t>(R, (int64_t{256} << 10) / row_bytes);
  // A thread's piece of rows [i0, i1) as R streams of q rows (tile.template operator()<R>(i,
  // q): rows i, i + q, ...), the rows left over one at a time (<1>(i, 0)).
  const auto pieces = [&](const auto& tile) {
    parallel_shares(n1 - n0, grain, num_threads(), [&](int64_t i0, int64_t i1) {
      const int64_t q = (i1 - i0) / R;  // rows per stream
      for (int64_t i = i0; i < i0 + q; ++i) tile.template operator()<R>(i, q);
      for (int64_t i = i0 + R * q; i < i1; ++i) tile.template operator()<1>(i, 0);
    });
  };
  const float* xd = nullptr;
  if constexpr (kPairs<D> || (D == DType::kF16 && L > 1)) {
    const auto addr = reinterpret_cast<uintptr_t>(w + n0 * k);
    if (row_bytes % 64 == 0 && addr % 2 == 0) {
      const int64_t a = static_cast<int64_t>(addr % 64 / 2), lines = ceil_div(k + a, kLineHalves);
      static thread_local Scratch xl_scratch;
      float* xl = xl_scratch.get(M * lines * kLineHalves);
      lay_lines<D>(x, M, k, a, lines, xl);
      alignas(64) uint16_t keep[2 * kLineHalves];
      for (int64_t v = 0; v < kLineHalves; ++v) {
        const int64_t last = kLineHalves * (lines - 1) + v;  // (an element of the lines)
        keep[v] = v >= a && (lines > 1 || v < k + a) ? 0xFFFF : 0;
        keep[kLineHalves + v] = last < k + a ? 0xFFFF : 0;
      }
      const uint16_t* wl = w - a;  // (the line holding row n0's first weight)
      pieces([&]<int kR>(int64_t i, int64_t rs) {
        gemv_tile_lines<D, M, kR, kPrefetch>(xl, lines, k, wl + (n0 + i) * k, rs, keep, y + i, ldy, pf);
      });
      return;
    }
  }
  if constexpr (kPairs<D>) {
    static thread_local Scratch xd_scratch;  // (the calling thread's; the threads below only read it)
    float* buf = xd_scratch.get(M * k);
    deinterleave_pairs(x, M, k, buf);
    xd = buf;
  }
  pieces([&]<int kR>(int64_t i, int64_t rs) {
    gemv_tile<D, M, kR, kPrefetch>(x, xd, k, w + (n0 + i) * k, rs, y + i, ldy, pf);
  });
}

// ---------------------------------------------------------------------------------------
// GEMM (m >= kGemmMinRows): compute bound. For each panel of kNR weight rows (= output
// columns) and kKC-long slice of k, the panel is converted to f32 and transposed once into
// a per-thread buffer [kKC][kNR], then swept by a register-blocked microkernel over all m
// rows of x: kMR rows x kNR columns of accumulators, one broadcast of x and kNV vector
// loads of the panel per kMR * kNV FMAs. Each weight is converted exactly once per call.
constexpr int kMR = L == 1 ? 4 : 6;
constexpr int kNV = L == 16 ? 4 : (L == 8 ? 2 : 4);  // 6x4 zmm / 6x2 ymm accumulators
constexpr int kNR = kNV * L;  // 64 (AVX-512), 16 (AVX2), 4 (scalar)
constexpr int64_t kKC = 256;  // panel: kKC * kNR f32 (64 KiB, L2)

// Stores (or adds to y, when accumulating over k panels) an MR x kNR tile of accumulators;
// only ncols columns exist in y for the last panel.
template <int MR>
inline void store_tile(V (&acc)[MR][kNV], float* y, int64_t ldy, int64_t ncols, bool accumulate) {
  if (ncols == kNR) {
    for (int i = 0; i < MR; ++i) {
      for (int v = 0; v < kNV; ++v) {
        float* p = y + i * ldy + v * L;
        S::store(p, accumulate ? S::add(S::load(p), acc[i][v]) : acc[i][v]);
      }
    }
  } else {
    alignas(64) float tmp[kNR];
    for (int i = 0; i < MR; ++i) {
      for (int v = 0; v < kNV; ++v) S::store(tmp + v * L, acc[i][v]);
      float* p = y + i * ldy;
      for (int64_t c = 0; c < ncols; ++c) p[c] = accumulate ? p[c] + tmp[c] : tmp[c];
    }
  }
}

template <int MR>
inline void gemm_micro(const float* x, int64_t ldx, const float* panel, int64_t kc, float* y, int64_t ldy,
                       int64_t ncols, bool accumulate) {
  V acc[MR][kNV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < kNV; ++v) acc[i][v] = S::zero();
  for (int64_t t = 0; t < kc; ++t) {
    const float* b = panel + t * kNR;
    V bv[kNV];
    for (int v = 0; v < kNV; ++v) bv[v] = S::load(b + v * L);
    for (int i = 0; i < MR; ++i) {
      const V a = S::set1(x[i * ldx + t]);
      for (int v = 0; v < kNV; ++v) acc[i][v] = S::fma(a, bv[v], acc[i][v]);
    }
  }
  store_tile<MR>(acc, y, ldy, ncols, accumulate);
}

// panel[t][c] = W[j0 + c][k0 + t] as f32, zero for c >= nr. Blocks of L x L: L weight
// rows are loaded as vectors along k (converted on load), transposed in registers and
// stored as panel rows, so every load and store is a full contiguous vector.
template <DType D>
void pack_panel(const typename Weights<D>::T* w, int64_t k, int64_t j0, int64_t nr, int64_t k0, int64_t kc,
                float* panel) {
  using W = Weights<D>;
  const typename W::T* src = w + j0 * k + k0;  // row c of the panel at src + c * k
  int64_t t = 0;
  for (; t + L <= kc; t += L) {
    for (int64_t cb = 0; cb < kNR; cb += L) {
      V r[L];
      for (int u = 0; u < L; ++u) r[u] = cb + u < nr ? W::load(src + (cb + u) * k + t) : S::zero();
      S::transpose(r);
      for (int u = 0; u < L; ++u) S::store(panel + (t + u) * kNR + cb, r[u]);
    }
  }
  for (; t < kc; ++t) {
    for (int64_t c = 0; c < kNR; ++c) panel[t * kNR + c] = c < nr ? W::one(src + c * k + t) : 0.0f;
  }
}

// Calls f(std::integral_constant<int, R>) with R = rows (1 <= rows <= kMR): the
// microkernels are instantiated per row count.
template <class F>
inline void with_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5:
      if constexpr (kMR >= 5) f(std::integral_constant<int, 5>{});
      return;
    default:
      if constexpr (kMR >= 6) f(std::integral_constant<int, kMR>{});
      return;
  }
}

// k per bf16-pair panel (below): 256 pairs x 64 columns x 4 B = 64 KiB (L2).
constexpr int64_t kDotKC = 512;
static_assert(kDotKC / 2 * kNR * 4 <= kKC * kNR * 4, "a bf16 panel fits the f32 panel's buffer");

#if INFERA_SIMD_LEVEL == 2
// ---------------------------------------------------------------------------------------
// bf16 GEMM on AVX512_BF16 (vdpbf16ps): x is rounded to bf16 once per call and multiplied
// with the bf16 weights two k at a time, 32 multiply-adds per instruction, twice the f32
// FMA's; each pair product is exact in f32 and summed in f32, so the only new error is
// x's rounding to bf16 (relative 2^-8 per term, as llama.cpp's bf16 path). Panels hold
// kNR weight rows as bf16 pairs, [kc / 2][kNR] 32-bit words, packed by the same 16 x 16
// transpose as the f32 panels but without a conversion, at half the bytes.

// xb[i * kp + t] = (bf16(x[i][2t]), bf16(x[i][2t + 1])), kp = ceil(k / 2): the low half
// holds the even k; the odd k's missing partner is 0.
void x_to_bf16_pairs(const float* x, int64_t m, int64_t k, uint32_t* xb) {
  const int64_t kp = (k + 1) / 2;
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * k;
    auto* o = reinterpret_cast<uint16_t*>(xb + i * kp);
    int64_t t = 0;
    for (; t + 32 <= k; t += 32) {
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xi + t + 16), _mm512_loadu_ps(xi + t));
      _mm512_storeu_si512(o + t, reinterpret_cast<const __m512i&>(h));
    }
    for (; t < k; ++t) o[t] = f32_to_bf16(xi[t]);
    if (k % 2 != 0) o[k] = 0;
  }
}

// panel[t][c] = (W[j0 + c][k0 + 2t], W[j0 + c][k0 + 2t + 1]) for 2t < kc; zero for
// c >= nr and for the partner of an odd kc's last k.
void pack_panel_pairs(const uint16_t* w, int64_t k, int64_t j0, int64_t nr, int64_t k0, int64_t kc, uint32_t* panel) {
  const uint16_t* src = w + j0 * k + k0;
  const int64_t kp = (kc + 1) / 2;
  int64_t t = 0;
  for (; 2 * (t + L) <= kc; t += L) {  // L pairs (2L weights) of L rows per block
    for (int64_t cb = 0; cb < kNR; cb += L) {
      V r[L];
      for (int u = 0; u < L; ++u) {
        r[u] = cb + u < nr ? _mm512_castsi512_ps(_mm512_loadu_si512(src + (cb + u) * k + 2 * t)) : S::zero();
      }
      S::transpose(r);  // moves 32-bit words only: the bf16 pairs travel intact
      for (int u = 0; u < L; ++u) _mm512_storeu_si512(panel + (t + u) * kNR + cb, _mm512_castps_si512(r[u]));
    }
  }
  for (; t < kp; ++t) {
    for (int64_t c = 0; c < kNR; ++c) {
      const uint32_t lo = c < nr ? src[c * k + 2 * t] : 0;
      const uint32_t hi = c < nr && 2 * t + 1 < kc ? src[c * k + 2 * t + 1] : 0;
      panel[t * kNR + c] = lo | hi << 16;
    }
  }
}

template <int MR>
inline void gemm_micro_bf16(const uint32_t* xb, int64_t ldx, const uint32_t* panel, int64_t kp, float* y, int64_t ldy,
                            int64_t ncols, bool accumulate) {
  V acc[MR][kNV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < kNV; ++v) acc[i][v] = S::zero();
  for (int64_t t = 0; t < kp; ++t) {
    const uint32_t* b = panel + t * kNR;
    __m512bh bv[kNV];
    for (int v = 0; v < kNV; ++v) {
      const __m512i raw = _mm512_loadu_si512(b + v * L);
      bv[v] = reinterpret_cast<const __m512bh&>(raw);
    }
    for (int i = 0; i < MR; ++i) {
      const __m512i araw = _mm512_set1_epi32(static_cast<int>(xb[i * ldx + t]));
      const __m512bh a = reinterpret_cast<const __m512bh&>(araw);
      for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, bv[v]);
    }
  }
  store_tile<MR>(acc, y, ldy, ncols, accumulate);
}

// ---- AMX-BF16 prefill (Sapphire Rapids and later) -----------------------------------------
//
// A bf16-pair panel is, 16 columns at a time, the B operand of tdpbf16ps as it lies: 16
// pairs (32 k) are 16 tile rows of 64 bytes (16 columns x one pair each), a panel row
// (kNR words) apart; A is 16 tokens x 16 pairs of xb, a row of x apart. One instruction
// makes 16 x 16 x 32 products (the pair products exact in f32, summed in f32), 16x a
// vdpbf16ps. Tiles: 0-1 A (tokens 0-15, 16-31), 2-3 B (columns c0 .. c0 + 31), 4-7 C.
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_bf16_configure() {
  amx_tiles::load_tiles(amx_tiles::all_16x64());
}

__attribute__((target("amx-tile,amx-bf16"))) inline void amx_bf16_release() { _tile_release(); }

// y[i][c0 + c] (+)= sum over the first `pairs` pairs (a multiple of 16) for TA * 16 tokens
// and columns c0 .. c0 + ncols (ncols <= 32; the panel is zero past its rows).
template <int TA>
__attribute__((target("amx-tile,amx-bf16"))) void amx_bf16_block(const uint32_t* xb, int64_t ldx, const uint32_t* panel,
                                                                 int64_t pairs, int64_t c0, float* y, int64_t ldy,
                                                                 int64_t ncols, bool accumulate) {
  _tile_zero(4);
  _tile_zero(5);
  if constexpr (TA == 2) {
    _tile_zero(6);
    _tile_zero(7);
  }
  const int64_t bstride = kNR * 4, astride = ldx * 4;
  for (int64_t t = 0; t < pairs; t += 16) {
    _tile_loadd(2, panel + t * kNR + c0, bstride);
    _tile_loadd(3, panel + t * kNR + c0 + 16, bstride);
    _tile_loadd(0, xb + t, astride);
    _tile_dpbf16ps(4, 0, 2);
    _tile_dpbf16ps(5, 0, 3);
    if constexpr (TA == 2) {
      _tile_loadd(1, xb + 16 * ldx + t, astride);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
  }
  alignas(64) float c_out[4][16 * 16];
  _tile_stored(4, c_out[0], 64);
  _tile_stored(5, c_out[1], 64);
  if constexpr (TA == 2) {
    _tile_stored(6, c_out[2], 64);
    _tile_stored(7, c_out[3], 64);
  }
  for (int a = 0; a < TA; ++a) {
    for (int q = 0; q < 2; ++q) {
      const int64_t cols = std::min<int64_t>(16, ncols - 16 * q);
      if (cols <= 0) continue;
      const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
      for (int r = 0; r < 16; ++r) {
        float* yr = y + (16 * a + r) * ldy + c0 + 16 * q;
        __m512 v = _mm512_load_ps(c_out[2 * a + q] + r * 16);
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, yr));
        _mm512_mask_storeu_ps(yr, mask, v);
      }
    }
  }
}
#endif

#if INFERA_SIMD_LEVEL == 2
// ---- f16 weights on AMX-BF16 -------------------------------------------------------------
//
// An f16 weight is exactly wh + wl with wh = bf16(w) and wl = bf16(w - wh): f16 has 11
// significant bits, bf16 8, so the remainder has at most 3 and bf16's exponent range holds
// it. x is split the same way, x ~ xh + xl (16 significant bits), and y = xh.wh + xh.wl +
// xl.wh, three tile products summed in f32 (each bf16 pair product exact): the dropped
// xl.wl and x's remainder are each below 2^-17 |x w| per term, against llama.cpp's 2^-12
// from its f16 activations. 16 tokens x 32 columns per pass: tiles 0-1 A (xh, xl), 2-3 B
// (wh, columns c0 .. c0 + 31), 4-5 B (wl), 6-7 C.
// 32 values (a then b) as bf16 at hi, and what the rounding left, rounded to bf16, at lo:
// v ~ hi + lo (exact when v has at most 16 significant bits). hi may alias the source.
inline void split_bf16(__m512 a, __m512 b, uint16_t* hi, uint16_t* lo) {
  const __m512bh hb = _mm512_cvtne2ps_pbh(b, a);
  const __m512i h = reinterpret_cast<const __m512i&>(hb);
  // The bf16 halves back to f32 (a shift), then the remainders rounded to bf16.
  const __m512 ha = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
  const __m512 hbf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
  const __m512bh lb = _mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hbf), _mm512_sub_ps(a, ha));
  _mm512_storeu_si512(hi, h);
  _mm512_storeu_si512(lo, reinterpret_cast<const __m512i&>(lb));
}

void x_to_bf16_split(const float* x, int64_t m, int64_t k, uint32_t* xh, uint32_t* xl) {
  const int64_t kp = (k + 1) / 2;
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * k;
    auto* h = reinterpret_cast<uint16_t*>(xh + i * kp);
    auto* l = reinterpret_cast<uint16_t*>(xl + i * kp);
    int64_t t = 0;
    for (; t + 32 <= k; t += 32) {
      split_bf16(_mm512_loadu_ps(xi + t), _mm512_loadu_ps(xi + t + 16), h + t, l + t);
    }
    for (; t < k; ++t) {
      h[t] = f32_to_bf16(xi[t]);
      l[t] = f32_to_bf16(xi[t] - bf16_to_f32(h[t]));
    }
    if (k % 2 != 0) h[k] = l[k] = 0;
  }
}

// The rows [j0, j0 + nr) x [k0, k0 + kc) of f16 weights (kc a multiple of 32) as two
// bf16-pair panels (pack_panel_pairs' layout): ph the bf16 roundings, pl the exact rests.
// The f16 pairs are laid out first (one transpose, into ph), then split in one linear pass
// (the pairs keep their places).
void pack_panel_pairs_f16(const uint16_t* w, int64_t k, int64_t j0, int64_t nr, int64_t k0, int64_t kc, uint32_t* ph,
                          uint32_t* pl) {
  pack_panel_pairs(w, k, j0, nr, k0, kc, ph);
  auto* h = reinterpret_cast<uint16_t*>(ph);
  auto* l = reinterpret_cast<uint16_t*>(pl);
  for (int64_t t = 0; t < kc * kNR; t += 32) {
    // (f16 to f32 is exact, and so is the rest: at most 3 significant bits)
    split_bf16(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + t))),
               _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + t + 16))), h + t, l + t);
  }
}

// y[r][c0 + c] (+)= the three products over `pairs` pairs (a multiple of 16) for 16 tokens
// (xh, xl rows ldx words apart) and columns c0 .. c0 + ncols (ncols <= 32).
__attribute__((target("amx-tile,amx-bf16"))) void amx_f16_block(const uint32_t* xh, const uint32_t* xl, int64_t ldx,
                                                                const uint32_t* ph, const uint32_t* pl, int64_t pairs,
                                                                int64_t c0, float* y, int64_t ldy, int64_t ncols,
                                                                bool accumulate) {
  _tile_zero(6);
  _tile_zero(7);
  const int64_t bstride = kNR * 4, astride = ldx * 4;
  for (int64_t t = 0; t < pairs; t += 16) {
    _tile_loadd(0, xh + t, astride);
    _tile_loadd(1, xl + t, astride);
    _tile_loadd(2, ph + t * kNR + c0, bstride);
    _tile_loadd(3, ph + t * kNR + c0 + 16, bstride);
    _tile_loadd(4, pl + t * kNR + c0, bstride);
    _tile_loadd(5, pl + t * kNR + c0 + 16, bstride);
    _tile_dpbf16ps(6, 0, 2);
    _tile_dpbf16ps(7, 0, 3);
    _tile_dpbf16ps(6, 0, 4);
    _tile_dpbf16ps(7, 0, 5);
    _tile_dpbf16ps(6, 1, 2);
    _tile_dpbf16ps(7, 1, 3);
  }
  alignas(64) float c_out[2][16 * 16];
  _tile_stored(6, c_out[0], 64);
  _tile_stored(7, c_out[1], 64);
  for (int q = 0; q < 2; ++q) {
    const int64_t cols = std::min<int64_t>(16, ncols - 16 * q);
    if (cols <= 0) continue;
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
    for (int r = 0; r < 16; ++r) {
      float* yr = y + r * ldy + c0 + 16 * q;
      __m512 v = _mm512_load_ps(c_out[q] + r * 16);
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, yr));
      _mm512_mask_storeu_ps(yr, mask, v);
    }
  }
}

// The f16 GEMM with AMX (m >= 16): per panel and 512-long slice of k, the weights split into
// two bf16-pair panels once and swept by 16-token tiles; the last < 16 tokens, and slices
// whose length is not a multiple of 32, take the f32 FMA microkernel on the f32 panel.
void gemm_f16_amx(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n0, int64_t n1, float* y,
                  int64_t ldy) {
  const int threads = omp_in_parallel() ? 1 : num_threads();
  const int64_t n_panels = ceil_div(n1 - n0, kNR);
  const int64_t kp = (k + 1) / 2;
  static thread_local Scratch x_scratch;
  auto* xh = reinterpret_cast<uint32_t*>(x_scratch.get(2 * m * kp));
  uint32_t* xl = xh + m * kp;
  x_to_bf16_split(x, m, k, xh, xl);
  const int64_t m16 = m / 16 * 16;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && n_panels > 1)
  for (int64_t p = 0; p < n_panels; ++p) {
    static thread_local Scratch panel_scratch;
    const int64_t j0 = n0 + p * kNR, nr = std::min<int64_t>(kNR, n1 - j0);
    float* panel = panel_scratch.get(kDotKC * kNR + kKC * kNR);  // two bf16-pair panels, then an f32 one
    auto* ph = reinterpret_cast<uint32_t*>(panel);
    uint32_t* pl = ph + kDotKC / 2 * kNR;
    float* pf = panel + kDotKC * kNR;
    float* yp = y + (j0 - n0);
    // The f32 microkernel over rows [i0, m) and k [k0, k0 + kc).
    const auto f32_rows = [&](int64_t i0, int64_t k0, int64_t kc) {
      for (int64_t kk = k0; kk < k0 + kc; kk += kKC) {
        const int64_t kcc = std::min(kKC, k0 + kc - kk);
        pack_panel<DType::kF16>(w, k, j0, nr, kk, kcc, pf);
        for (int64_t i = i0; i < m; i += kMR) {
          with_rows(std::min<int64_t>(kMR, m - i), [&](auto r) {
            gemm_micro<decltype(r)::value>(x + i * k + kk, k, pf, kcc, yp + i * ldy, ldy, nr, kk > 0);
          });
        }
      }
    };
    for (int64_t k0 = 0; k0 < k; k0 += kDotKC) {
      const int64_t kc = std::min(kDotKC, k - k0);
      if (kc % 32 != 0) {
        f32_rows(0, k0, kc);
        continue;
      }
      pack_panel_pairs_f16(w, k, j0, nr, k0, kc, ph, pl);
      amx_bf16_configure();
      for (int64_t i = 0; i < m16; i += 16) {
        for (int64_t c0 = 0; c0 < nr; c0 += 32) {
          amx_f16_block(xh + i * kp + k0 / 2, xl + i * kp + k0 / 2, kp, ph, pl, kc / 2, c0, yp + i * ldy, ldy,
                        std::min<int64_t>(32, nr - c0), k0 > 0);
        }
      }
      amx_bf16_release();
      if (m16 < m) f32_rows(m16, k0, kc);
    }
  }
}
#endif

// bf16 weights take the bf16-pair GEMM (AMX tiles, or vdpbf16ps where bf16_vector_dot():
// the AVX-512 path requires AVX512_BF16) unless set_bf16_dot(false) asks for the f32 products.
template <DType D>
constexpr bool kHasDotPath = INFERA_SIMD_LEVEL == 2 && D == DType::kBF16;

template <DType D>
void gemm(const float* x, int64_t m, int64_t k, const typename Weights<D>::T* w, int64_t n0, int64_t n1, float* y,
          int64_t ldy) {
#if INFERA_SIMD_LEVEL == 2
  if constexpr (D == DType::kF16) {
    if (bf16_dot_enabled() && bf16_amx_enabled()) return gemm_f16_amx(x, m, k, w, n0, n1, y, ldy);
  }
#endif
  const int threads = omp_in_parallel() ? 1 : num_threads();
  const int64_t n_panels = ceil_div(n1 - n0, kNR);
  const int64_t m_blocks = ceil_div(m, kMR);
  // Split over weight panels (each packed once); split m as well only when there are too
  // few panels to keep every thread busy (small n).
  int64_t m_chunks = 1;
  if (n_panels < 2 * threads) m_chunks = std::min(m_blocks, ceil_div(2 * threads, n_panels));
  const int64_t rows_per_chunk = ceil_div(m_blocks, m_chunks) * kMR;
  m_chunks = ceil_div(m, rows_per_chunk);
  const int64_t tasks = n_panels * m_chunks;
  static thread_local Scratch panel_scratch;
#if INFERA_SIMD_LEVEL == 2
  const bool bf16_products = kHasDotPath<D> && bf16_dot_enabled();
  const bool amx = bf16_products && m >= 16 && bf16_amx_enabled();
  const bool dot = bf16_products && (amx || bf16_vector_dot());
  static thread_local Scratch x_scratch;
  const int64_t kp = (k + 1) / 2;
  uint32_t* xb = nullptr;
  if (dot) {
    xb = reinterpret_cast<uint32_t*>(x_scratch.get(m * kp));
    x_to_bf16_pairs(x, m, k, xb);
  }
#else
  constexpr bool dot = false;
#endif
  const int64_t kc_max = dot ? kDotKC : kKC;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t p = task / m_chunks, mc = task % m_chunks;
    const int64_t j0 = n0 + p * kNR, nr = std::min<int64_t>(kNR, n1 - j0);
    const int64_t i0 = mc * rows_per_chunk, i1 = std::min(m, i0 + rows_per_chunk);
    float* panel = panel_scratch.get(kKC * kNR);  // also holds a kDotKC bf16 panel: same bytes
    for (int64_t k0 = 0; k0 < k; k0 += kc_max) {
      const int64_t kc = std::min(kc_max, k - k0);
      const bool acc = k0 > 0;
#if INFERA_SIMD_LEVEL == 2
      if (dot) {
        auto* pp = reinterpret_cast<uint32_t*>(panel);
        pack_panel_pairs(reinterpret_cast<const uint16_t*>(w), k, j0, nr, k0, kc, pp);
        const int64_t kpc = (kc + 1) / 2;
        const int64_t pa = amx ? kpc / 16 * 16 : 0;  // pairs on AMX tiles; the rest below
        int64_t i = i0;
        if (pa > 0 && i1 - i0 >= 16) {
          amx_bf16_configure();
          while (i + 16 <= i1) {
            const int64_t rows = i + 32 <= i1 ? 32 : 16;
            for (int64_t c0 = 0; c0 < nr; c0 += 32) {
              const int64_t nc = std::min<int64_t>(32, nr - c0);
              float* yt = y + i * ldy + (j0 - n0);
              if (rows == 32) {
                amx_bf16_block<2>(xb + i * kp + k0 / 2, kp, pp, pa, c0, yt, ldy, nc, acc);
              } else {
                amx_bf16_block<1>(xb + i * kp + k0 / 2, kp, pp, pa, c0, yt, ldy, nc, acc);
              }
            }
            if (pa < kpc) {  // the tail pairs of this panel
              for (int64_t r = i; r < i + rows; r += kMR) {
                with_rows(std::min<int64_t>(kMR, i + rows - r), [&](auto mr) {
                  gemm_micro_bf16<decltype(mr)::value>(xb + r * kp + k0 / 2 + pa, kp, pp + pa * kNR, kpc - pa,
                                                       y + r * ldy + (j0 - n0), ldy, nr, true);
                });
              }
            }
            i += rows;
          }
          amx_bf16_release();
        }
        for (; i < i1; i += kMR) {
          with_rows(std::min<int64_t>(kMR, i1 - i), [&](auto rows) {
            gemm_micro_bf16<decltype(rows)::value>(xb + i * kp + k0 / 2, kp, pp, (kc + 1) / 2, y + i * ldy + (j0 - n0),
                                                   ldy, nr, acc);
          });
        }
        continue;
      }
#endif
      pack_panel<D>(w, k, j0, nr, k0, kc, panel);
      for (int64_t i = i0; i < i1; i += kMR) {
        with_rows(std::min<int64_t>(kMR, i1 - i), [&](auto rows) {
          gemm_micro<decltype(rows)::value>(x + i * k + k0, k, panel, kc, y + i * ldy + (j0 - n0), ldy, nr, acc);
        });
      }
    }
  }
}

template <DType D, bool kPrefetch>
void gemv_rows(const float* x, int64_t m, int64_t k, const typename Weights<D>::T* w, int64_t n0, int64_t n1, float* y,
               int64_t ldy, int64_t pf) {
  for (int64_t i = 0; i < m; i += kGemvMaxRows) {
    const float* xi = x + i * k;
    float* yi = y + i * ldy;
    switch (std::min<int64_t>(kGemvMaxRows, m - i)) {
      case 1: gemv<D, 1, kPrefetch>(xi, k, w, n0, n1, yi, ldy, pf); break;
      case 2: gemv<D, 2, kPrefetch>(xi, k, w, n0, n1, yi, ldy, pf); break;
      case 3: gemv<D, 3, kPrefetch>(xi, k, w, n0, n1, yi, ldy, pf); break;
      default: gemv<D, 4, kPrefetch>(xi, k, w, n0, n1, yi, ldy, pf); break;
    }
  }
}

template <DType D>
void matmul_typed(const float* x, int64_t m, const MatRef& w, int64_t n0, int64_t n1, float* y, int64_t ldy,
                  int gemv_prefetch) {
  const auto* wd = static_cast<const typename Weights<D>::T*>(w.data);
  const int64_t k = w.cols;
  if (m >= kGemmMinRows) return gemm<D>(x, m, k, wd, n0, n1, y, ldy);
  if (gemv_prefetch > 0) return gemv_rows<D, true>(x, m, k, wd, n0, n1, y, ldy, gemv_prefetch);
  gemv_rows<D, false>(x, m, k, wd, n0, n1, y, ldy, 0);
}

void matmul_rows(const float* x, int64_t m, const MatRef& w, int64_t n0, int64_t n1, float* y, int64_t ldy,
                 int gemv_prefetch) {
  if (m <= 0 || n1 <= n0) return;
  if (w.cols == 0) {  // empty sum
    for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + (n1 - n0), 0.0f);
    return;
  }
  switch (w.dtype) {
    case DType::kF32: return matmul_typed<DType::kF32>(x, m, w, n0, n1, y, ldy, gemv_prefetch);
    case DType::kBF16: return matmul_typed<DType::kBF16>(x, m, w, n0, n1, y, ldy, gemv_prefetch);
    case DType::kF16: return matmul_typed<DType::kF16>(x, m, w, n0, n1, y, ldy, gemv_prefetch);
    default: INFERA_ASSERT(false, "matmul: unsupported dtype reached a kernel table");
  }
}

// What matmul_rows runs for weights of dtype d on this path, in words (infera sysinfo).
std::string matmul_path(DType d) {
  const char* isa = INFERA_SIMD_LEVEL == 2 ? "avx512" : INFERA_SIMD_LEVEL == 1 ? "avx2" : "scalar";
  const std::string tile = std::to_string(kMR) + "x" + std::to_string(kNR);
  const char* convert = d == DType::kBF16  ? " (bf16 widened by a shift)"
                        : d == DType::kF16 ? (INFERA_SIMD_LEVEL > 0 ? " (f16 converted by F16C)" : " (f16 converted)")
                                           : "";
  std::string prefill = std::string(isa) + " f32 FMA " + tile + " tiles on packed f32 panels" + convert;
  if (d == DType::kF16 && INFERA_SIMD_LEVEL == 2 && bf16_dot_enabled() && bf16_amx_enabled()) {
    prefill =
        "AMX tdpbf16ps tiles, 16 tokens x 32 rows per pass, each f16 weight split exactly into two bf16 parts and "
        "x into two (three products, below 2^-17 |x w| per term), on packed bf16-pair panels (" +
        prefill + " for the last < 16 tokens and k slices not a multiple of 32)";
  }
  if (d == DType::kBF16 && INFERA_SIMD_LEVEL == 2 && bf16_dot_enabled()) {
    if (bf16_vector_dot()) {
      prefill = std::string(isa) + " vdpbf16ps (AVX512_BF16) " + tile +
                " tiles on packed bf16-pair panels, x rounded to bf16";
    }
    if (bf16_amx_enabled()) {
      prefill =
          "AMX tdpbf16ps tiles, 32 tokens x 32 rows per pass, on packed bf16-pair panels, x rounded to bf16 "
          "(" +
          std::string(isa) + " vdpbf16ps " + tile + " tiles for the last < 16 tokens and k tails)";
    }
  }
  const std::string decode = std::string(isa) + " f32 FMA matvec, " + std::to_string(kGemvStreams) +
                             " row streams, software prefetch into L1: " + gemv_prefetch_text() + convert +
                             ((d == DType::kBF16 || d == DType::kF16) && INFERA_SIMD_LEVEL > 0
                                  ? ", rows read as whole 64-byte lines (those off a line masked at their ends)"
                                  : "");
  return "prefill (m >= " + std::to_string(kGemmMinRows) + "): " + prefill + "; decode: " + decode;
}

// ---------------------------------------------------------------------------------------
// Vector helpers over arrays (tails with masked loads/stores).
inline float dot(const float* a, const float* b, int64_t n) {
  V acc = S::zero();
  int64_t i = 0;
  for (; i + L <= n; i += L) acc = S::fma(S::load(a + i), S::load(b + i), acc);
  if (i < n) {
    const int r = static_cast<int>(n - i);
    acc = S::fma(S::load_partial(a + i, r), S::load_partial(b + i, r), acc);
  }
  return S::reduce_add(acc);
}

// y += a * x
inline void axpy(float* y, float a, const float* x, int64_t n) {
  const V av = S::set1(a);
  int64_t i = 0;
  for (; i + L <= n; i += L) S::store(y + i, S::fma(av, S::load(x + i), S::load(y + i)));
  if (i < n) {
    const int r = static_cast<int>(n - i);
    S::store_partial(y + i, S::fma(av, S::load_partial(x + i, r), S::load_partial(y + i, r)), r);
  }
}

inline void scale_inplace(float* y, float a, int64_t n) {
  const V av = S::set1(a);
  int64_t i = 0;
  for (; i + L <= n; i += L) S::store(y + i, S::mul(av, S::load(y + i)));
  for (; i < n; ++i) y[i] *= a;
}

inline float max_of(const float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  if (n >= L) {
    V m = S::load(x);
    for (i = L; i + L <= n; i += L) m = S::max(m, S::load(x + i));
    mx = S::reduce_max(m);
  }
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  return mx;
}

// x[i] = exp(x[i] - shift); returns the sum of the new values.
inline float exp_shift_sum(float* x, int64_t n, float shift) {
  const V sv = S::set1(shift);
  V sum = S::zero();
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const V e = S::exp(S::sub(S::load(x + i), sv));
    S::store(x + i, e);
    sum = S::add(sum, e);
  }
  if (i < n) {
    const int r = static_cast<int>(n - i);
    const V e = S::keep_first(S::exp(S::sub(S::load_partial(x + i, r), sv)), r);
    S::store_partial(x + i, e, r);
    sum = S::add(sum, e);
  }
  return S::reduce_add(sum);
}

// ---------------------------------------------------------------------------------------
// Element-wise ops and norms.
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps, float w_offset) {
  parallel_range(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t r0, int64_t r1) {
    const V off = S::set1(w_offset);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      const float inv = 1.0f / std::sqrt(dot(xr, xr, n) / static_cast<float>(n) + eps);
      const V iv = S::set1(inv);
      int64_t i = 0;
      for (; i + L <= n; i += L) {
        S::store(yr + i, S::mul(S::mul(S::load(xr + i), iv), S::add(S::load(w + i), off)));
      }
      for (; i < n; ++i) yr[i] = xr[i] * inv * (w[i] + w_offset);
    }
  });
}

void silu_mul(float* gate, const float* up, int64_t n) {
  parallel_range(n, 1 << 15, [&](int64_t i0, int64_t i1) {
    const V one = S::set1(1.0f), zero = S::zero();
    int64_t i = i0;
    for (; i + L <= i1; i += L) {
      const V g = S::load(gate + i);
      const V sig = S::div(one, S::add(one, S::exp(S::sub(zero, g))));
      S::store(gate + i, S::mul(S::mul(g, sig), S::load(up + i)));
    }
    for (; i < i1; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  });
}

void softmax(float* x, int64_t n) {
  const float mx = max_of(x, n);
  const float sum = exp_shift_sum(x, n, mx);
  scale_inplace(x, 1.0f / sum, n);
}

void add(float* y, const float* x, int64_t n) {
  parallel_range(n, 1 << 16, [&](int64_t i0, int64_t i1) {
    int64_t i = i0;
    for (; i + L <= i1; i += L) S::store(y + i, S::add(S::load(y + i), S::load(x + i)));
    for (; i < i1; ++i) y[i] += x[i];
  });
}

void rope_neox(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const int32_t* positions,
               const float* inv_freq, float attn_factor) {
  const int64_t half = rot_dim / 2;
  parallel_range(n_tokens, std::max<int64_t>(1, 8192 / std::max<int64_t>(n_heads * rot_dim, 1)),
                 [&](int64_t t0, int64_t t1) {
                   static thread_local Scratch scratch;
                   float* cos_t = scratch.get(2 * half);  // [half] cos, then [half] sin, for one token
                   float* sin_t = cos_t + half;
                   for (int64_t t = t0; t < t1; ++t) {
                     // cos/sin once per token, shared by all heads. The angle in f32 as Hugging Face
                     // computes it (positions.float() @ inv_freq).
                     for (int64_t i = 0; i < half; ++i) {
                       const float angle = static_cast<float>(positions[t]) * inv_freq[i];
                       cos_t[i] = std::cos(angle) * attn_factor;
                       sin_t[i] = std::sin(angle) * attn_factor;
                     }
                     for (int64_t h = 0; h < n_heads; ++h) {
                       float* v0 = x + (t * n_heads + h) * head_dim;
                       float* v1 = v0 + half;
                       int64_t i = 0;
                       for (; i + L <= half; i += L) {
                         const V c = S::load(cos_t + i), s = S::load(sin_t + i);
                         const V a = S::load(v0 + i), b = S::load(v1 + i);
                         S::store(v0 + i, S::sub(S::mul(a, c), S::mul(b, s)));
                         S::store(v1 + i, S::add(S::mul(b, c), S::mul(a, s)));
                       }
                       for (; i < half; ++i) {
                         const float a = v0[i], b = v1[i];
                         v0[i] = a * cos_t[i] - b * sin_t[i];
                         v1[i] = b * cos_t[i] + a * sin_t[i];
                       }
                     }
                   }
                 });
}

// ---------------------------------------------------------------------------------------
// Paged attention with online softmax.
//
// Work unit = (tile of query tokens, kv head, key chunk). Its "rows" are the tile's tokens
// times the `group` query heads that share the kv head, so every K/V row read from the
// cache serves all of them (prefill reads K/V once per tile, not once per token). Keys go
// page by page (a run of consecutive slots in one block): scores for the run, one
// max/rescale per row and run, then V accumulation. Causality: a row's valid keys in a run
// are a prefix of it (keys < pos0 + t + 1), so masking is a per-row length, never a -inf.
// A unit yields per row a running max m, a sum l of exp(s - m) and acc = sum exp(s - m) v.
// With one chunk the unit writes acc / l; with several (decode with a long context:
// flash-decoding, so both threads work on one sequence) partials are merged afterwards.

constexpr int64_t kMinChunkKeys = 256;  // below this, a chunk's merge costs more than it saves
constexpr int64_t kMaxTileRows = 64;  // query rows per unit: acc[64][head_dim] stays in L1/L2

struct UnitState {
  float* scores;  // [rows, block_size]
  float* acc;  // [rows, head_dim]
  float* m;  // [rows]
  float* l;  // [rows]
  const float** q_rows;  // [rows] the row's query vector
  int64_t* key_end;  // [rows] causal limit: keys < key_end
};

// K/V element access by the cache's storage dtype: L elements as f32, or one. Conversion
// happens in registers; the cache is never widened in memory.
template <DType D>
struct KvElem;
template <>
struct KvElem<DType::kF32> {
  using T = float;
  static V load(const T* p) { return S::load(p); }
  static float one(const T* p) { return *p; }
};
template <>
struct KvElem<DType::kBF16> {
  using T = uint16_t;
  static V load(const T* p) { return S::load_bf16(p); }
  static float one(const T* p) { return bf16_to_f32(*p); }
};
template <>
struct KvElem<DType::kI8> {
  using T = int8_t;
  static V load(const T* p) {
#if INFERA_SIMD_LEVEL == 2
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif INFERA_SIMD_LEVEL == 1
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
    return static_cast<float>(*p);
#endif
  }
  static float one(const T* p) { return static_cast<float>(*p); }
};

// Brings `n` elements from `row` on towards L2.
template <class T>
inline void prefetch_row_l2(const T* row, int64_t n) {
  const char* p = reinterpret_cast<const char*>(row);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  for (int64_t b = 0; b < bytes; b += 64) S::prefetch_l2(p + b);
}

// q . k over D elements, k in the cache's dtype (unscaled for int8).
template <DType KD>
inline float dot_kv(const float* q, const typename KvElem<KD>::T* k, int64_t D) {
  using E = KvElem<KD>;
  V acc = S::zero();
  int64_t d = 0;
  for (; d + L <= D; d += L) acc = S::fma(S::load(q + d), E::load(k + d), acc);
  float tail = 0.0f;
  for (; d < D; ++d) tail += q[d] * E::one(k + d);
  return S::reduce_add(acc) + tail;
}

// The L scores q . k_j of the keys k_j = k + j * D, j < L (D a multiple of L), in one
// vector: an accumulator per key, so L independent FMA chains instead of one, and the L
// horizontal sums in one reduce_lanes instead of one reduction each. Each key's products
// are summed in dot_kv's order; only the final horizontal sum's tree differs.
template <DType KD>
__attribute__((always_inline)) inline V dot_keys(const float* q, const typename KvElem<KD>::T* k, int64_t D) {
  using E = KvElem<KD>;
  V acc[L];
  for (int j = 0; j < L; ++j) acc[j] = S::zero();
  for (int64_t d = 0; d < D; d += L) {
    const V qv = S::load(q + d);
    for (int j = 0; j < L; ++j) acc[j] = S::fma(qv, E::load(k + j * D + d), acc[j]);
  }
  return S::reduce_lanes(acc);
}

// acc[r][0, C * L) += sum_j p[r][j] * v[j * stride + (0, C * L)], j < n, for R query rows
// over the same n keys, the C vectors of each row's acc in registers across the n keys:
// each V vector is loaded once for all R rows, with R x C independent FMA chains. A row's
// sums are the same, bit for bit, whatever R.
template <DType VD, int C, int R>
inline void accumulate_span_rows(float* const* acc, const float* const* p, const typename KvElem<VD>::T* v,
                                 int64_t stride, int64_t n) {
  using E = KvElem<VD>;
  V a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = S::load(acc[r] + c * L);
  for (int64_t j = 0; j < n; ++j) {
    V pj[R];
    for (int r = 0; r < R; ++r) pj[r] = S::set1(p[r][j]);
    for (int c = 0; c < C; ++c) {
      const V vj = E::load(v + j * stride + c * L);
      for (int r = 0; r < R; ++r) a[r][c] = S::fma(pj[r], vj, a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) S::store(acc[r] + c * L, a[r][c]);
}

// acc[0, D) += sum_j p[j] * v[j * stride + (0, D)], j < n: acc kept in registers across the
// n rows (one load/store of acc per page instead of per key), eight vectors at a time (eight
// independent FMA chains: enough to keep both FMA units busy through the latency).
template <DType VD>
inline void accumulate_rows(float* acc, const float* p, const typename KvElem<VD>::T* v, int64_t stride, int64_t n,
                            int64_t D) {
  using E = KvElem<VD>;
  int64_t d = 0;
  for (; d + 8 * L <= D; d += 8 * L) {
    float* a = acc + d;
    accumulate_span_rows<VD, 8, 1>(&a, &p, v + d, stride, n);
  }
  for (; d + 4 * L <= D; d += 4 * L) {
    float* a = acc + d;
    accumulate_span_rows<VD, 4, 1>(&a, &p, v + d, stride, n);
  }
  for (; d + L <= D; d += L) {
    float* a = acc + d;
    accumulate_span_rows<VD, 1, 1>(&a, &p, v + d, stride, n);
  }
  for (; d < D; ++d) {
    float a = acc[d];
    for (int64_t j = 0; j < n; ++j) a += p[j] * E::one(v + j * stride + d);
    acc[d] = a;
  }
}

// accumulate_rows for R rows with the same n (their results exactly the one-row ones):
// spans of C vectors with R x C accumulators, as many as the registers hold beside the
// operands (16 of the 32 AVX-512 registers, 8 of the 16 AVX2 ones).
template <DType VD, int R>
inline void accumulate_rows_group(float* const* acc, const float* const* p, const typename KvElem<VD>::T* v,
                                  int64_t stride, int64_t n, int64_t D) {
  constexpr int kAcc = L >= 16 ? 16 : 8;
  constexpr int C = kAcc / R >= 8 ? 8 : (kAcc / R >= 4 ? 4 : (kAcc / R >= 2 ? 2 : 1));
  int64_t d = 0;
  if constexpr (L > 1) {
    for (; d + C * L <= D; d += C * L) {
      float* a[R];
      for (int r = 0; r < R; ++r) a[r] = acc[r] + d;
      accumulate_span_rows<VD, C, R>(a, p, v + d, stride, n);
    }
  }
  if (d < D) {  // the narrow rest, one row at a time
    for (int r = 0; r < R; ++r) accumulate_rows<VD>(acc[r] + d, p[r], v + d, stride, n, D - d);
  }
}

// Rows r = ti * group + g: query token t0 + ti (ti < n_t), head kvh * group + g.
// KD: the cache's dtype. int8 folds its per-(token, head) scales into the scores (K) and
// into the softmax weights (V), so the inner loops stay plain dot products / FMAs.
template <DType KD>
void attend_tile(const float* q, int64_t n_heads, int64_t t0, int64_t n_t, int64_t group, int64_t kvh, int64_t pos0,
                 int64_t key0, int64_t key1, const PagedKv& kv, float scale, const UnitState& st) {
  using T = typename KvElem<KD>::T;
  const T* k_pool = static_cast<const T*>(kv.k_pool);
  const T* v_pool = static_cast<const T*>(kv.v_pool);
  const int64_t D = kv.head_dim, bs = kv.block_size;
  const int64_t rows = n_t * group;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = t0 + r / group, h = kvh * group + r % group;
    st.q_rows[r] = q + (t * n_heads + h) * D;
    st.key_end[r] = pos0 + t + 1;
    st.m[r] = -std::numeric_limits<float>::infinity();
    st.l[r] = 0.0f;
    std::fill(st.acc + r * D, st.acc + (r + 1) * D, 0.0f);
  }
  for (int64_t p = key0; p < key1;) {
    const int64_t slot = p % bs;
    const int64_t run = std::min(bs - slot, key1 - p);
    // This head's rows of the block are contiguous (kernels.h, PagedKv): keys D apart.
    const int64_t head_slot = kv_row(static_cast<int64_t>(kv.block_table[p / bs]) * bs + slot, kvh, bs, kv.n_kv_heads);
    const int64_t off = head_slot * D;
    const T* kp = k_pool + off;
    const T* vp = v_pool + off;
    // The next page's rows of this head (pages are scattered: the hardware prefetcher
    // cannot guess the next one), requested a slice per query row while this page is
    // computed: issued in one burst the requests outnumber the core's line fill buffers and
    // the core waits for the page instead of computing beside it (32K keys, 4 query rows per
    // KV head, f32: 6.8-7.8 -> 8.4-8.7 GB/s at one thread, 15.1-15.5 -> 17.8-18.2 at two).
    // Into L2 only (prefetcht1): 8.8 -> 9.7 GB/s at one thread, 19.6 -> 20.5 at two; a
    // burst is still slower (7.3), and two pages ahead no faster.
    const int64_t next = p + run;
    const T* next_k = nullptr;
    const T* next_v = nullptr;
    int64_t next_elems = 0;
    if (next < key1) {
      const int64_t next_off =
          kv_row(static_cast<int64_t>(kv.block_table[next / bs]) * bs + next % bs, kvh, bs, kv.n_kv_heads) * D;
      next_k = k_pool + next_off;
      next_v = v_pool + next_off;
      next_elems = std::min(bs - next % bs, key1 - next) * D;
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (next_elems > 0) {
        const int64_t e0 = next_elems * r / rows, e1 = next_elems * (r + 1) / rows;
        prefetch_row_l2(next_k + e0, e1 - e0);
        prefetch_row_l2(next_v + e0, e1 - e0);
      }
      const int64_t valid = std::clamp<int64_t>(st.key_end[r] - p, 0, run);
      if (valid == 0) continue;
      float* sc = st.scores + r * bs;
      int64_t j = 0;
      if (D % L == 0) {
        for (; j + L <= valid; j += L)
          S::store(sc + j, S::mul(dot_keys<KD>(st.q_rows[r], kp + j * D, D), S::set1(scale)));
      }
      for (; j < valid; ++j) sc[j] = dot_kv<KD>(st.q_rows[r], kp + j * D, D) * scale;
      if constexpr (KD == DType::kI8) {
        const float* ks = kv.k_scales + head_slot;
        for (int64_t j = 0; j < valid; ++j) sc[j] *= ks[j];
      }
    }
    // Then each row's online softmax over its scores (a separate pass: the rows' score
    // chains and softmax chains are independent of each other, and the core overlaps more
    // of them when they are not interleaved in one long loop body).
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t valid = std::clamp<int64_t>(st.key_end[r] - p, 0, run);
      if (valid == 0) continue;
      float* sc = st.scores + r * bs;
      const float m_new = std::max(st.m[r], max_of(sc, valid));
      const float sum = exp_shift_sum(sc, valid, m_new);
      if (st.m[r] != m_new) {
        const float corr = std::exp(st.m[r] - m_new);  // 0 on the first run (m = -inf)
        st.l[r] *= corr;
        scale_inplace(st.acc + r * D, corr, D);
      }
      st.l[r] += sum;
      st.m[r] = m_new;
      if constexpr (KD == DType::kI8) {  // l keeps the unscaled weights; V's scales join the products only
        const float* vs = kv.v_scales + head_slot;
        for (int64_t j = 0; j < valid; ++j) sc[j] *= vs[j];
      }
    }
    // Then V, up to four rows with the same keys at a time (each V row loaded once for all).
    for (int64_t r = 0; r < rows;) {
      const int64_t valid = std::clamp<int64_t>(st.key_end[r] - p, 0, run);
      int64_t g = 1;
      while (g < 4 && r + g < rows && std::clamp<int64_t>(st.key_end[r + g] - p, 0, run) == valid) ++g;
      if (valid == 0) {
        r += g;
        continue;
      }
      float* acc[4];
      const float* pr[4];
      for (int64_t i = 0; i < g; ++i) {
        acc[i] = st.acc + (r + i) * D;
        pr[i] = st.scores + (r + i) * bs;
      }
      if (g == 4)
        accumulate_rows_group<KD, 4>(acc, pr, vp, D, valid, D);
      else if (g >= 2)
        accumulate_rows_group<KD, 2>(acc, pr, vp, D, valid, D);
      else
        accumulate_rows<KD>(acc[0], pr[0], vp, D, valid, D);
      r += g == 3 ? 2 : g;  // three: a pair now, the third with what follows
    }
    p += run;
  }
}

void attention_paged(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const PagedKv& kv, float scale,
                     float* out) {
  const int64_t D = kv.head_dim, bs = kv.block_size, n_kv = kv.n_kv_heads;
  const int64_t group = n_heads / n_kv;
  const int threads = omp_in_parallel() ? 1 : num_threads();
  const int64_t ctx_max = pos0 + n_tokens;
  const int64_t want_units = 4 * threads;  // enough for dynamic balancing

  // Query tile: as many tokens as fit kMaxTileRows rows, fewer if that starves threads.
  int64_t tile = std::clamp<int64_t>(kMaxTileRows / group, 1, n_tokens);
  while (tile > 1 && ceil_div(n_tokens, tile) * n_kv < want_units) tile = ceil_div(tile, 2);
  const int64_t n_tiles = ceil_div(n_tokens, tile);

  // Split keys into chunks only when tiles alone cannot feed the threads (decode).
  const int64_t base_units = n_tiles * n_kv;
  int64_t n_chunks = 1;
  if (base_units < want_units) {
    n_chunks = std::clamp<int64_t>(ceil_div(want_units, base_units), 1, std::max<int64_t>(1, ctx_max / kMinChunkKeys));
  }
  // Chunk boundaries on block boundaries, so a page run never crosses a chunk.
  const int64_t chunk_len = ceil_div(ceil_div(ctx_max, n_chunks), bs) * bs;
  n_chunks = ceil_div(ctx_max, chunk_len);
  const int64_t units = base_units * n_chunks;

  // Partials of every (token, head, chunk): acc[D], m, l. Owned by the calling thread.
  static thread_local Scratch partial_scratch;
  const int64_t pstride = D + 2;
  float* partials = n_chunks > 1 ? partial_scratch.get(n_tokens * n_heads * n_chunks * pstride) : nullptr;

  const int64_t work = ctx_max * n_tokens * n_heads * D;
  parallel_region(threads > 1 && units > 1 && work > (1 << 16) ? threads : 1, [&] {
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < units; ++u) {
      // Tiles in reverse: the last tokens see the most keys; start them first.
      const int64_t ti = n_tiles - 1 - u / (n_kv * n_chunks);
      const int64_t kvh = (u / n_chunks) % n_kv;
      const int64_t c = u % n_chunks;
      const int64_t t0 = ti * tile, n_t = std::min(tile, n_tokens - t0);
      const int64_t rows = n_t * group;
      const int64_t key0 = c * chunk_len;
      const int64_t key1 = std::min(pos0 + t0 + n_t, key0 + chunk_len);  // last row's limit
      static thread_local Scratch unit_scratch;
      static thread_local std::vector<const float*> q_rows;
      static thread_local std::vector<int64_t> key_end;
      if (static_cast<int64_t>(q_rows.size()) < rows) {
        q_rows.resize(rows);
        key_end.resize(rows);
      }
      float* buf = unit_scratch.get(rows * (bs + D + 2));
      const UnitState st{buf,           buf + rows * bs, buf + rows * (bs + D), buf + rows * (bs + D + 1),
                         q_rows.data(), key_end.data()};
      switch (kv.dtype) {
        case DType::kBF16:
          attend_tile<DType::kBF16>(q, n_heads, t0, n_t, group, kvh, pos0, key0, key1, kv, scale, st);
          break;
        case DType::kI8:
          attend_tile<DType::kI8>(q, n_heads, t0, n_t, group, kvh, pos0, key0, key1, kv, scale, st);
          break;
        default:  // kF32 (the public wrapper rejects the rest)
          attend_tile<DType::kF32>(q, n_heads, t0, n_t, group, kvh, pos0, key0, key1, kv, scale, st);
          break;
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = t0 + r / group, h = kvh * group + r % group;
        if (n_chunks == 1) {
          float* o = out + (t * n_heads + h) * D;
          const float inv = 1.0f / st.l[r];
          for (int64_t d = 0; d < D; ++d) o[d] = st.acc[r * D + d] * inv;
        } else {  // rows with no key in this chunk leave m = -inf, l = 0, acc = 0
          float* pp = partials + ((t * n_heads + h) * n_chunks + c) * pstride;
          std::copy(st.acc + r * D, st.acc + (r + 1) * D, pp);
          pp[D] = st.m[r];
          pp[D + 1] = st.l[r];
        }
      }
    }
  });
  if (n_chunks == 1) return;

  // Merge: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c, M = max_c m_c.
  for (int64_t th = 0; th < n_tokens * n_heads; ++th) {
    const float* pp = partials + th * n_chunks * pstride;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < n_chunks; ++c) mx = std::max(mx, pp[c * pstride + D]);
    float* o = out + th * D;
    std::fill(o, o + D, 0.0f);
    float l = 0.0f;
    for (int64_t c = 0; c < n_chunks; ++c) {
      const float wgt = std::exp(pp[c * pstride + D] - mx);  // 0 for empty chunks (m = -inf)
      l += wgt * pp[c * pstride + D + 1];
      axpy(o, wgt, pp + c * pstride, D);
    }
    scale_inplace(o, 1.0f / l, D);
  }
}

}  // namespace

const KernelTable& table() {
  static const KernelTable t{matmul_rows, matmul_path, rmsnorm, silu_mul, softmax, add, rope_neox, attention_paged};
  return t;
}

}  // namespace infera::kernels::INFERA_KERNEL_NS
