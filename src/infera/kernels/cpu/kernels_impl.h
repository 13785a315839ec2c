// The optimized kernels, written once over the Simd abstraction (simd.h) and compiled
// three times: kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512.cpp each define
// INFERA_SIMD_LEVEL and INFERA_KERNEL_NS, then include this file. Include it from nowhere
// else: everything lives in an anonymous namespace inside the per-ISA namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <omp.h>

#include "infera/base/error.h"
#include "infera/base/threads.h"
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

// Runs f(i0, i1) over [0, n) in pieces of `grain`, handed out dynamically: a thread that
// loses its core for a while (the machine is shared) does not hold the others back.
template <class F>
void parallel_chunks(int64_t n, int64_t grain, F&& f) {
  const int threads = num_threads();
  if (threads <= 1 || n < 2 * grain || omp_in_parallel()) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t pieces = ceil_div(n, grain);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t p = 0; p < pieces; ++p) f(p * grain, std::min(n, (p + 1) * grain));
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

// ---------------------------------------------------------------------------------------
// GEMV (m < kGemmMinRows): memory bound, so W is streamed once per kGemvMaxRows rows of x,
// straight from its stored dtype, R rows at a time (R independent FMA chains hide latency and keep R
// streams in flight); each W vector is used for all M rows of x.
constexpr int kGemvMaxRows = 4;
constexpr int kAccRegs = L == 16 ? 16 : 8;  // accumulators that fit beside the operands

template <DType D, int M, int R>
inline void gemv_tile(const float* x, int64_t k, const typename Weights<D>::T* w, float* y,
                      int64_t ldy) {
  using W = Weights<D>;
  V acc[M][R];
  for (int i = 0; i < M; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = S::zero();
  int64_t t = 0;
  for (; t + L <= k; t += L) {
    V xv[M];
    for (int i = 0; i < M; ++i) xv[i] = S::load(x + i * k + t);
    for (int r = 0; r < R; ++r) {
      const V wv = W::load(w + r * k + t);
      for (int i = 0; i < M; ++i) acc[i][r] = S::fma(xv[i], wv, acc[i][r]);
    }
  }
  for (int i = 0; i < M; ++i) {
    for (int r = 0; r < R; ++r) {
      float s = S::reduce_add(acc[i][r]);
      for (int64_t u = t; u < k; ++u) s += x[i * k + u] * W::one(w + r * k + u);
      y[i * ldy + r] = s;
    }
  }
}

template <DType D, int M>
void gemv(const float* x, int64_t k, const typename Weights<D>::T* w, int64_t n0, int64_t n1,
          float* y, int64_t ldy) {
  constexpr int R = std::max(1, std::min(4, kAccRegs / M));
  const int64_t blocks = ceil_div(n1 - n0, R);
  // Pieces of ~256 KiB of weights: long contiguous streams for the prefetchers, and enough
  // pieces (~90 for a 2048 x 5632 bf16 matrix) to balance the threads.
  const int64_t row_bytes = k * static_cast<int64_t>(sizeof(typename Weights<D>::T));
  const int64_t grain = std::max<int64_t>(1, (int64_t{256} << 10) / (row_bytes * R));
  parallel_chunks(blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t j = n0 + b * R;
      if (j + R <= n1) {
        gemv_tile<D, M, R>(x, k, w + j * k, y + (j - n0), ldy);
      } else {
        for (; j < n1; ++j) gemv_tile<D, M, 1>(x, k, w + j * k, y + (j - n0), ldy);
      }
    }
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
constexpr int kNR = kNV * L;                          // 64 (AVX-512), 16 (AVX2), 4 (scalar)
constexpr int64_t kKC = 256;                          // panel: kKC * kNR f32 (64 KiB, L2)

template <int MR>
inline void gemm_micro(const float* x, int64_t ldx, const float* panel, int64_t kc, float* y,
                       int64_t ldy, int64_t ncols, bool accumulate) {
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
  if (ncols == kNR) {
    for (int i = 0; i < MR; ++i) {
      for (int v = 0; v < kNV; ++v) {
        float* p = y + i * ldy + v * L;
        S::store(p, accumulate ? S::add(S::load(p), acc[i][v]) : acc[i][v]);
      }
    }
  } else {  // last panel: only ncols columns exist in y
    alignas(64) float tmp[kNR];
    for (int i = 0; i < MR; ++i) {
      for (int v = 0; v < kNV; ++v) S::store(tmp + v * L, acc[i][v]);
      float* p = y + i * ldy;
      for (int64_t c = 0; c < ncols; ++c) p[c] = accumulate ? p[c] + tmp[c] : tmp[c];
    }
  }
}

// panel[t][c] = W[j0 + c][k0 + t] as f32, zero for c >= nr. Blocks of L x L: L weight
// rows are loaded as vectors along k (converted on load), transposed in registers and
// stored as panel rows, so every load and store is a full contiguous vector.
template <DType D>
void pack_panel(const typename Weights<D>::T* w, int64_t k, int64_t j0, int64_t nr, int64_t k0,
                int64_t kc, float* panel) {
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

template <DType D>
void gemm(const float* x, int64_t m, int64_t k, const typename Weights<D>::T* w, int64_t n0,
          int64_t n1, float* y, int64_t ldy) {
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
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t p = task / m_chunks, mc = task % m_chunks;
    const int64_t j0 = n0 + p * kNR, nr = std::min<int64_t>(kNR, n1 - j0);
    const int64_t i0 = mc * rows_per_chunk, i1 = std::min(m, i0 + rows_per_chunk);
    float* panel = panel_scratch.get(kKC * kNR);
    for (int64_t k0 = 0; k0 < k; k0 += kKC) {
      const int64_t kc = std::min(kKC, k - k0);
      pack_panel<D>(w, k, j0, nr, k0, kc, panel);
      for (int64_t i = i0; i < i1; i += kMR) {
        const float* xi = x + i * k + k0;
        float* yi = y + i * ldy + (j0 - n0);
        const bool acc = k0 > 0;
        switch (std::min<int64_t>(kMR, i1 - i)) {
          case 1: gemm_micro<1>(xi, k, panel, kc, yi, ldy, nr, acc); break;
          case 2: gemm_micro<2>(xi, k, panel, kc, yi, ldy, nr, acc); break;
          case 3: gemm_micro<3>(xi, k, panel, kc, yi, ldy, nr, acc); break;
          case 4: gemm_micro<4>(xi, k, panel, kc, yi, ldy, nr, acc); break;
          case 5: if constexpr (kMR >= 5) gemm_micro<5>(xi, k, panel, kc, yi, ldy, nr, acc); break;
          default: if constexpr (kMR >= 6) gemm_micro<kMR>(xi, k, panel, kc, yi, ldy, nr, acc); break;
        }
      }
    }
  }
}

// Below this many rows of x, GEMV passes (4 rows each, W streamed once per pass) beat
// packing W into panels: measured on a 2048 x 5632 bf16 matrix, packing costs about two
// W streams, and with weights coming from DRAM each extra pass costs one stream.
constexpr int64_t kGemmMinRows = 16;

template <DType D>
void matmul_typed(const float* x, int64_t m, const MatRef& w, int64_t n0, int64_t n1, float* y,
                  int64_t ldy) {
  const auto* wd = static_cast<const typename Weights<D>::T*>(w.data);
  const int64_t k = w.cols;
  if (m >= kGemmMinRows) return gemm<D>(x, m, k, wd, n0, n1, y, ldy);
  for (int64_t i = 0; i < m; i += kGemvMaxRows) {
    const float* xi = x + i * k;
    float* yi = y + i * ldy;
    switch (std::min<int64_t>(kGemvMaxRows, m - i)) {
      case 1: gemv<D, 1>(xi, k, wd, n0, n1, yi, ldy); break;
      case 2: gemv<D, 2>(xi, k, wd, n0, n1, yi, ldy); break;
      case 3: gemv<D, 3>(xi, k, wd, n0, n1, yi, ldy); break;
      default: gemv<D, 4>(xi, k, wd, n0, n1, yi, ldy); break;
    }
  }
}

void matmul_rows(const float* x, int64_t m, const MatRef& w, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  if (m <= 0 || n1 <= n0) return;
  if (w.cols == 0) {  // empty sum
    for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + (n1 - n0), 0.0f);
    return;
  }
  switch (w.dtype) {
    case DType::kF32: return matmul_typed<DType::kF32>(x, m, w, n0, n1, y, ldy);
    case DType::kBF16: return matmul_typed<DType::kBF16>(x, m, w, n0, n1, y, ldy);
    case DType::kF16: return matmul_typed<DType::kF16>(x, m, w, n0, n1, y, ldy);
    default: INFERA_ASSERT(false, "matmul: unsupported dtype reached a kernel table");
  }
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
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
             float w_offset) {
  parallel_range(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)),
                 [&](int64_t r0, int64_t r1) {
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

void rope_neox(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
               const int32_t* positions, const float* inv_freq, float attn_factor) {
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
// Work unit = (query token, kv head, key chunk): the `group` query heads that share one kv
// head are processed together so each K/V row is read once per unit. Keys go page by page
// (a run of consecutive slots in one block): scores for the run, one max/rescale per run,
// then V accumulation. A unit yields per head a running max m, a sum l of exp(s - m) and
// acc = sum of exp(s - m) * v. With one chunk the unit writes acc / l; with several
// (decode with a long context: flash-decoding) the partials are merged afterwards.

constexpr int64_t kMinChunkKeys = 256;  // below this, a chunk's merge costs more than it saves

struct UnitState {
  float* scores;  // [group, block_size]
  float* acc;     // [group, head_dim]
  float* m;       // [group]
  float* l;       // [group]
};

void attend_range(const float* q, int64_t group, int64_t kvh, int64_t key0, int64_t key1,
                  const PagedKv& kv, float scale, const UnitState& st) {
  const int64_t D = kv.head_dim, bs = kv.block_size;
  const int64_t token_stride = kv.n_kv_heads * D;  // between slots of one block
  for (int64_t g = 0; g < group; ++g) {
    st.m[g] = -std::numeric_limits<float>::infinity();
    st.l[g] = 0.0f;
    std::fill(st.acc + g * D, st.acc + (g + 1) * D, 0.0f);
  }
  for (int64_t p = key0; p < key1;) {
    const int64_t slot = p % bs;
    const int64_t run = std::min(bs - slot, key1 - p);
    const int64_t row0 = (static_cast<int64_t>(kv.block_table[p / bs]) * bs + slot) * token_stride +
                         kvh * D;
    const float* kp = kv.k_pool + row0;
    const float* vp = kv.v_pool + row0;
    for (int64_t j = 0; j < run; ++j) {
      for (int64_t g = 0; g < group; ++g) {
        st.scores[g * bs + j] = dot(q + g * D, kp + j * token_stride, D) * scale;
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      float* s = st.scores + g * bs;
      const float m_new = std::max(st.m[g], max_of(s, run));
      const float sum = exp_shift_sum(s, run, m_new);
      if (st.m[g] != m_new) {
        const float corr = std::exp(st.m[g] - m_new);  // 0 on the first run (m = -inf)
        st.l[g] *= corr;
        scale_inplace(st.acc + g * D, corr, D);
      }
      st.l[g] += sum;
      st.m[g] = m_new;
    }
    for (int64_t j = 0; j < run; ++j) {
      for (int64_t g = 0; g < group; ++g) {
        axpy(st.acc + g * D, st.scores[g * bs + j], vp + j * token_stride, D);
      }
    }
    p += run;
  }
}

void attention_paged(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0,
                     const PagedKv& kv, float scale, float* out) {
  const int64_t D = kv.head_dim, bs = kv.block_size, n_kv = kv.n_kv_heads;
  const int64_t group = n_heads / n_kv;
  const int threads = omp_in_parallel() ? 1 : num_threads();
  const int64_t ctx_max = pos0 + n_tokens;

  // Split keys into chunks only when (token, kv head) units alone cannot feed the threads.
  const int64_t base_units = n_tokens * n_kv;
  int64_t n_chunks = 1;
  if (base_units < 4 * threads) {
    n_chunks = std::clamp<int64_t>(ceil_div(4 * threads, base_units), 1,
                                   std::max<int64_t>(1, ctx_max / kMinChunkKeys));
  }
  // Chunk boundaries on block boundaries, so a page run never crosses a chunk.
  const int64_t chunk_len = ceil_div(ceil_div(ctx_max, n_chunks), bs) * bs;
  n_chunks = ceil_div(ctx_max, chunk_len);
  const int64_t units = base_units * n_chunks;

  // Partials of every (token, head, chunk): acc[D], m, l. Owned by the calling thread.
  static thread_local Scratch partial_scratch;
  const int64_t pstride = D + 2;
  float* partials = n_chunks > 1 ? partial_scratch.get(units * group * pstride) : nullptr;

  const int64_t work = ctx_max * n_tokens * n_heads * D;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) \
    if (threads > 1 && units > 1 && work > (1 << 16))
  for (int64_t u = 0; u < units; ++u) {
    const int64_t t = u / (n_kv * n_chunks);
    const int64_t kvh = (u / n_chunks) % n_kv;
    const int64_t c = u % n_chunks;
    const int64_t ctx = pos0 + t + 1;  // causal: keys [0, pos0 + t]
    const int64_t key0 = c * chunk_len, key1 = std::min(ctx, key0 + chunk_len);
    static thread_local Scratch unit_scratch;
    float* buf = unit_scratch.get(group * (bs + D + 2));
    const UnitState st{buf, buf + group * bs, buf + group * (bs + D), buf + group * (bs + D + 1)};
    const int64_t h0 = kvh * group;  // query heads h0 .. h0 + group - 1 share kv head kvh
    const float* qg = q + (t * n_heads + h0) * D;
    if (key0 < key1) {
      attend_range(qg, group, kvh, key0, key1, kv, scale, st);
    } else {  // a chunk past this token's causal end (prefill with several chunks)
      for (int64_t g = 0; g < group; ++g) {
        st.m[g] = -std::numeric_limits<float>::infinity();
        st.l[g] = 0.0f;
        std::fill(st.acc + g * D, st.acc + (g + 1) * D, 0.0f);
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      if (n_chunks == 1) {
        float* o = out + (t * n_heads + h0 + g) * D;
        const float inv = 1.0f / st.l[g];
        for (int64_t d = 0; d < D; ++d) o[d] = st.acc[g * D + d] * inv;
      } else {
        float* pp = partials + ((t * n_heads + h0 + g) * n_chunks + c) * pstride;
        std::copy(st.acc + g * D, st.acc + (g + 1) * D, pp);
        pp[D] = st.m[g];
        pp[D + 1] = st.l[g];
      }
    }
  }
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
  static const KernelTable t{matmul_rows, rmsnorm, silu_mul, softmax, add, rope_neox,
                             attention_paged};
  return t;
}

}  // namespace infera::kernels::INFERA_KERNEL_NS
