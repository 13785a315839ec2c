// The Gated DeltaNet kernels (delta.h), written once over the Simd abstraction (simd.h) and
// compiled three times: delta_scalar.cpp, delta_avx2.cpp, delta_avx512.cpp each define
// INFERA_SIMD_LEVEL and INFERA_KERNEL_NS, then include this file. Include it from nowhere
// else. The scalar references they are tested against live in delta.cpp (kernels::ref).
//
// Layout facts the kernels lean on:
//  - Column j of a head's state S [dk, dv] evolves on its own: delta_j, o_j and the update
//    of column j read only column j of S (plus k, q). So S is processed in column blocks
//    of a few vectors that stay in registers (recurrent) or in L1 (chunked), and the
//    token loop runs inside a block.
//  - Heads are independent: threads split the value heads (one sequence's call keeps
//    every thread busy once n_v_heads >= threads).
#pragma once

#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "infera/base/threads.h"
#include "infera/kernels/cpu/delta_dispatch.h"
#include "infera/kernels/cpu/simd.h"

namespace infera::kernels::INFERA_KERNEL_NS {
namespace {

using S = Simd;
using V = S::V;
constexpr int L = S::kLanes;

int threads_for(int64_t tasks) {
  if (omp_in_parallel()) return 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads(), tasks)));
}

// Vector v of a column block starting at p; the block's last vector holds `tail` lanes
// (1..L), the others L.
template <int NV>
inline V ld(const float* p, int v, int tail) {
  return (v == NV - 1 && tail != L) ? S::load_partial(p + v * L, tail) : S::load(p + v * L);
}
template <int NV>
inline void st(float* p, int v, V x, int tail) {
  if (v == NV - 1 && tail != L)
    S::store_partial(p + v * L, x, tail);
  else
    S::store(p + v * L, x);
}

// Calls f(std::integral_constant<int, NV>, j0, tail) for the column blocks of [0, n): up
// to MaxVec vectors each, the last vector of the last block partial.
template <int MaxVec, class F>
inline void column_blocks(int64_t n, F&& f) {
  for (int64_t j0 = 0; j0 < n; j0 += MaxVec * L) {
    const int64_t cols = std::min<int64_t>(MaxVec * L, n - j0);
    const int nvec = static_cast<int>((cols + L - 1) / L);
    const int tail = static_cast<int>(cols - (nvec - 1) * L);
    switch (nvec) {
      case 1: f(std::integral_constant<int, 1>{}, j0, tail); break;
      case 2:
        if constexpr (MaxVec >= 2) f(std::integral_constant<int, 2>{}, j0, tail);
        break;
      case 3:
        if constexpr (MaxVec >= 3) f(std::integral_constant<int, 3>{}, j0, tail);
        break;
      case 4:
        if constexpr (MaxVec >= 4) f(std::integral_constant<int, 4>{}, j0, tail);
        break;
      default: break;
    }
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  V acc = S::zero();
  int64_t i = 0;
  for (; i + L <= n; i += L) acc = S::fma(S::load(a + i), S::load(b + i), acc);
  float s = S::reduce_add(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[0, n) += a * x[0, n).
inline void axpy(float* y, float a, const float* x, int64_t n) {
  const V av = S::set1(a);
  int64_t i = 0;
  for (; i + L <= n; i += L) S::store(y + i, S::fma(av, S::load(x + i), S::load(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// y[0, n) = a * x[0, n).
inline void scale_to(float* y, float a, const float* x, int64_t n) {
  const V av = S::set1(a);
  int64_t i = 0;
  for (; i + L <= n; i += L) S::store(y + i, S::mul(av, S::load(x + i)));
  for (; i < n; ++i) y[i] = a * x[i];
}

// Flush-to-zero and denormals-are-zero for the calling thread while alive. Decays make
// denormals here: exp(gc_i - gc_j) of far-apart tokens (the vector exp bottoms out near
// 1e-38, and products of it are denormal) and a state that keeps decaying. One denormal
// operand costs ~100 cycles, which made whole prefills slower than the scalar loops; a
// value below 1e-38 is zero to every sum it joins.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }  // FTZ | DAZ
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

// A per-thread buffer that only grows: nothing is allocated per call once warm.
float* scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// ---- recurrence (decode) ---------------------------------------------------------------

// One column block of one value head over all tokens. Per token, with S the block's
// columns (undecayed): kv = Sᵀk; delta = beta (v - decay kv); S = decay S + k deltaᵀ;
// o = Sᵀq. Same arithmetic as the reference up to the order of the decay multiply.
template <int NV>
void recurrent_block(float* Sh, int64_t dk, int64_t dv, int64_t j0, int tail, const float* q, const float* k,
                     const float* v, const float* g, const float* beta, int64_t n_tokens, int64_t qk_stride,
                     int64_t v_stride, int64_t gb_stride, float* out) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* kt = k + t * qk_stride;
    const float* qt = q + t * qk_stride;
    const float decay = std::exp(g[t * gb_stride]);
    const float b = beta[t * gb_stride];
    V acc[NV];
    for (int x = 0; x < NV; ++x) acc[x] = S::zero();
    for (int64_t i = 0; i < dk; ++i) {
      const float* row = Sh + i * dv + j0;
      const V ki = S::set1(kt[i]);
      for (int x = 0; x < NV; ++x) acc[x] = S::fma(ld<NV>(row, x, tail), ki, acc[x]);
    }
    const V dec = S::set1(decay), bv = S::set1(b);
    const float* vt = v + t * v_stride + j0;
    V delta[NV], o[NV];
    for (int x = 0; x < NV; ++x) {
      delta[x] = S::mul(bv, S::sub(ld<NV>(vt, x, tail), S::mul(dec, acc[x])));
      o[x] = S::zero();
    }
    for (int64_t i = 0; i < dk; ++i) {
      float* row = Sh + i * dv + j0;
      const V ki = S::set1(kt[i]), qi = S::set1(qt[i]);
      for (int x = 0; x < NV; ++x) {
        const V r = S::fma(ki, delta[x], S::mul(dec, ld<NV>(row, x, tail)));
        st<NV>(row, x, r, tail);
        o[x] = S::fma(r, qi, o[x]);
      }
    }
    float* ot = out + t * v_stride + j0;
    for (int x = 0; x < NV; ++x) st<NV>(ot, x, o[x], tail);
  }
}

void recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t n_tokens,
               const DeltaShape& s, float* state, float* out) {
  const int64_t group = s.n_v_heads / s.n_k_heads, dk = s.dk, dv = s.dv;
  const int64_t qk_stride = s.n_k_heads * dk, v_stride = s.n_v_heads * dv;
#pragma omp parallel for schedule(static) num_threads(threads_for(s.n_v_heads))
  for (int64_t h = 0; h < s.n_v_heads; ++h) {
    const FlushDenormals ftz;
    const int64_t hk = h / group;
    float* Sh = state + h * dk * dv;  // [dk, dv]
    column_blocks<4>(dv, [&](auto nv, int64_t j0, int tail) {
      recurrent_block<decltype(nv)::value>(Sh, dk, dv, j0, tail, q + hk * dk, k + hk * dk, v + h * dv, g + h, beta + h,
                                           n_tokens, qk_stride, v_stride, s.n_v_heads, out + h * dv);
    });
  }
}

// ---- chunked delta rule (prefill) --------------------------------------------------------

// Register tile of the chunk's state products: R token rows x NV vectors of columns.
// kColVecs for the tile with two outputs per row (state_products), kWideColVecs for the
// one-output tiles: 16 accumulators on AVX-512 (of 32 registers), 8 on AVX2 (of 16).
constexpr int kRowTile = 4;
constexpr int kColVecs = L == 16 ? 2 : 1;
constexpr int kWideColVecs = L == 16 ? 4 : 2;

// For chunk rows [i0, i0 + R) and one column block of dv:
//   vn = U - W S  (U, W: [C, dv], [C, dk] rows of the chunk)
//   o  = exp(gc) (q S)
template <int R, int NV>
void state_products(const float* Sh, int64_t dk, int64_t dv, int64_t j0, int tail, int64_t i0, const float* U,
                    const float* W, const float* qc, const float* gc, float* vn, float* o, int64_t o_stride) {
  V acc_v[R][NV], acc_q[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int x = 0; x < NV; ++x) {
      acc_v[r][x] = ld<NV>(U + (i0 + r) * dv + j0, x, tail);
      acc_q[r][x] = S::zero();
    }
  }
  for (int64_t d = 0; d < dk; ++d) {
    V sv[NV];
    for (int x = 0; x < NV; ++x) sv[x] = ld<NV>(Sh + d * dv + j0, x, tail);
    for (int r = 0; r < R; ++r) {
      const V w = S::set1(-W[(i0 + r) * dk + d]), qd = S::set1(qc[(i0 + r) * dk + d]);
      for (int x = 0; x < NV; ++x) {
        acc_v[r][x] = S::fma(w, sv[x], acc_v[r][x]);
        acc_q[r][x] = S::fma(qd, sv[x], acc_q[r][x]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const V eg = S::set1(std::exp(gc[i0 + r]));
    for (int x = 0; x < NV; ++x) {
      st<NV>(vn + (i0 + r) * dv + j0, x, acc_v[r][x], tail);
      st<NV>(o + (i0 + r) * o_stride + j0, x, S::mul(eg, acc_q[r][x]), tail);
    }
  }
}

// Rows [i0, i0 + R) of Y (=, or += when Accumulate) M X over one column block, with M
// lower triangular [C, C] (zeros above the diagonal up to i0 + R): Σ_{j < i0 + R}
// M[i, j] X[j, cols]. The X row loaded once serves all R rows.
template <int R, int NV, bool Accumulate>
void lower_matmul(const float* M, int64_t ldm, const float* X, int64_t ldx, float* Y, int64_t ldy, int64_t i0,
                  int64_t j0, int tail) {
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < NV; ++x) acc[r][x] = Accumulate ? ld<NV>(Y + (i0 + r) * ldy + j0, x, tail) : S::zero();
  for (int64_t j = 0; j < i0 + R; ++j) {
    V xv[NV];
    for (int x = 0; x < NV; ++x) xv[x] = ld<NV>(X + j * ldx + j0, x, tail);
    for (int r = 0; r < R; ++r) {
      const V m = S::set1(M[(i0 + r) * ldm + j]);
      for (int x = 0; x < NV; ++x) acc[r][x] = S::fma(m, xv[x], acc[r][x]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < NV; ++x) st<NV>(Y + (i0 + r) * ldy + j0, x, acc[r][x], tail);
}

// Rows [i0, i0 + R) of M = X kᵀ over one column block of M (X: [C, dk] rows, kT: the
// chunk's keys transposed, [dk, ldk]): broadcast X[i, d] times a vector of kT row d, so no
// horizontal sums.
template <int R, int NV>
void gram_tile(const float* X, int64_t dk, const float* kT, int64_t ldk, float* M, int64_t ldm, int64_t i0, int64_t j0,
               int tail) {
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < NV; ++x) acc[r][x] = S::zero();
  for (int64_t d = 0; d < dk; ++d) {
    V kv[NV];
    for (int x = 0; x < NV; ++x) kv[x] = ld<NV>(kT + d * ldk + j0, x, tail);
    for (int r = 0; r < R; ++r) {
      const V xd = S::set1(X[(i0 + r) * dk + d]);
      for (int x = 0; x < NV; ++x) acc[r][x] = S::fma(xd, kv[x], acc[r][x]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < NV; ++x) st<NV>(M + (i0 + r) * ldm + j0, x, acc[r][x], tail);
}

// row[j] *= sign * exp(gci - gc[j]) for j < count (the decay between tokens j and i);
// row[j] = 0 for j in [count, n).
void decay_row(float* row, const float* gc, float gci, float sign, int64_t count, int64_t n) {
  const V gv = S::set1(gci), sv = S::set1(sign);
  int64_t j = 0;
  for (; j + L <= count; j += L) {
    S::store(row + j, S::mul(S::mul(sv, S::load(row + j)), S::exp(S::sub(gv, S::load(gc + j)))));
  }
  for (; j < count; ++j) row[j] = sign * row[j] * std::exp(gci - gc[j]);
  std::fill(row + count, row + n, 0.0f);
}

// S rows [d0, d0 + R), one column block: S = e_last S + Σ_i kf[i, d] vn[i].
template <int R, int NV>
void state_update(float* Sh, int64_t dk, int64_t dv, int64_t j0, int tail, int64_t d0, float e_last, const float* kf,
                  const float* vn, int64_t n) {
  V acc[R][NV];
  const V e = S::set1(e_last);
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < NV; ++x) acc[r][x] = S::mul(e, ld<NV>(Sh + (d0 + r) * dv + j0, x, tail));
  for (int64_t i = 0; i < n; ++i) {
    V vv[NV];
    for (int x = 0; x < NV; ++x) vv[x] = ld<NV>(vn + i * dv + j0, x, tail);
    for (int r = 0; r < R; ++r) {
      const V kd = S::set1(kf[i * dk + d0 + r]);
      for (int x = 0; x < NV; ++x) acc[r][x] = S::fma(kd, vv[x], acc[r][x]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < NV; ++x) st<NV>(Sh + (d0 + r) * dv + j0, x, acc[r][x], tail);
}

// Runs body(std::integral_constant<int, R>, i0) over [0, n) in tiles of kRowTile rows,
// then single rows.
template <class F>
inline void row_tiles(int64_t n, F&& body) {
  int64_t i = 0;
  for (; i + kRowTile <= n; i += kRowTile) body(std::integral_constant<int, kRowTile>{}, i);
  for (; i < n; ++i) body(std::integral_constant<int, 1>{}, i);
}

void chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t n_tokens,
             const DeltaShape& s, float* state, float* out, int64_t chunk) {
  const int64_t group = s.n_v_heads / s.n_k_heads;
  const int64_t dk = s.dk, dv = s.dv, C = chunk;
  const int64_t qk_stride = s.n_k_heads * dk, v_stride = s.n_v_heads * dv, Hv = s.n_v_heads;
#pragma omp parallel for schedule(static) num_threads(threads_for(s.n_v_heads))
  for (int64_t h = 0; h < s.n_v_heads; ++h) {
    const FlushDenormals ftz;
    const int64_t hk = h / group;
    float* Sh = state + h * dk * dv;  // [dk, dv]
    // Per-chunk work buffers, rows = tokens of the chunk.
    float* gc = scratch(static_cast<size_t>(C * (3 + 2 * C + 5 * dk + 3 * dv)));
    float* A = gc + C;  // [C, C]
    float* P = A + C * C;  // [C, C] (q_i·k_j) exp(gc_i - gc_j), j <= i
    float* tmp = P + C * C;  // [C]
    float* kb = tmp + C;  // [C, dk] k * beta
    float* kbg = kb + C * dk;  // [C, dk] k * beta * exp(gc)
    float* W = kbg + C * dk;  // [C, dk]
    float* qk = W + C * dk;  // [C, dk] q rows, then k * exp(g_last - gc)
    float* vb = qk + C * dk;  // [C, dv] v * beta
    float* U = vb + C * dv;  // [C, dv]
    float* vn = U + C * dv;  // [C, dv]
    float* kT = vn + C * dv;  // [dk, C] the chunk's keys, transposed
    for (int64_t c0 = 0; c0 < n_tokens; c0 += C) {
      const int64_t n = std::min(C, n_tokens - c0);
      auto kt = [&](int64_t i) { return k + (c0 + i) * qk_stride + hk * dk; };
      auto qt = [&](int64_t i) { return q + (c0 + i) * qk_stride + hk * dk; };
      float acc = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        acc += g[(c0 + i) * Hv + h];
        gc[i] = acc;
        const float b = beta[(c0 + i) * Hv + h];
        scale_to(kb + i * dk, b, kt(i), dk);
        scale_to(kbg + i * dk, std::exp(gc[i]), kb + i * dk, dk);
        scale_to(vb + i * dv, b, v + (c0 + i) * v_stride + h * dv, dv);
        std::memcpy(qk + i * dk, qt(i), dk * sizeof(float));
      }
      // A = -(k_beta kᵀ ⊙ decay), strictly lower; then (I + A)^-1 by forward substitution:
      // row i += Σ_m A[i][m] row m (rows m < i already final; their entries >= m are 0).
      // With P = (q kᵀ ⊙ decay), lower including the diagonal, for the intra-chunk attention.
      for (int64_t i = 0; i < n; ++i)
        for (int64_t d = 0; d < dk; ++d) kT[d * C + i] = kt(i)[d];
      row_tiles(n, [&](auto rows, int64_t i0) {
        constexpr int R = decltype(rows)::value;
        column_blocks<kWideColVecs>(i0 + R, [&](auto nv, int64_t j0, int tail) {
          gram_tile<R, decltype(nv)::value>(kb, dk, kT, C, A, C, i0, j0, tail);
          gram_tile<R, decltype(nv)::value>(qk, dk, kT, C, P, C, i0, j0, tail);
        });
      });
      for (int64_t i = 0; i < n; ++i) {
        decay_row(A + i * C, gc, gc[i], -1.0f, i, n);
        decay_row(P + i * C, gc, gc[i], 1.0f, i + 1, n);
      }
      for (int64_t i = 1; i < n; ++i) {
        std::memcpy(tmp, A + i * C, i * sizeof(float));
        for (int64_t m = 1; m < i; ++m) axpy(A + i * C, tmp[m], A + m * C, m);
      }
      for (int64_t i = 0; i < n; ++i) A[i * C + i] = 1.0f;
      // U = T v_beta, W = T (k_beta ⊙ exp(gc)) (T = A, lower incl. diagonal).
      row_tiles(n, [&](auto rows, int64_t i0) {
        constexpr int R = decltype(rows)::value;
        column_blocks<kWideColVecs>(dv, [&](auto nv, int64_t j0, int tail) {
          lower_matmul<R, decltype(nv)::value, false>(A, C, vb, dv, U, dv, i0, j0, tail);
        });
        column_blocks<kWideColVecs>(dk, [&](auto nv, int64_t j0, int tail) {
          lower_matmul<R, decltype(nv)::value, false>(A, C, kbg, dk, W, dk, i0, j0, tail);
        });
      });
      // v_new = U - W S;  o = exp(gc) (q S) + Σ_{j<=i} (q_i·k_j) exp(gc_i - gc_j) v_new_j.
      float* oc = out + c0 * v_stride + h * dv;
      row_tiles(n, [&](auto rows, int64_t i0) {
        column_blocks<kColVecs>(dv, [&](auto nv, int64_t j0, int tail) {
          state_products<decltype(rows)::value, decltype(nv)::value>(Sh, dk, dv, j0, tail, i0, U, W, qk, gc, vn, oc,
                                                                     v_stride);
        });
      });
      row_tiles(n, [&](auto rows, int64_t i0) {
        column_blocks<kWideColVecs>(dv, [&](auto nv, int64_t j0, int tail) {
          lower_matmul<decltype(rows)::value, decltype(nv)::value, true>(P, C, vn, dv, oc, v_stride, i0, j0, tail);
        });
      });
      // S = exp(gc_last) S + Σ_i (k_i exp(gc_last - gc_i)) v_new_iᵀ.
      const float g_last = gc[n - 1];
      for (int64_t i = 0; i < n; ++i) scale_to(qk + i * dk, std::exp(g_last - gc[i]), kt(i), dk);
      row_tiles(dk, [&](auto rows, int64_t d0) {
        column_blocks<kWideColVecs>(dv, [&](auto nv, int64_t j0, int tail) {
          state_update<decltype(rows)::value, decltype(nv)::value>(Sh, dk, dv, j0, tail, d0, std::exp(g_last), qk, vn,
                                                                   n);
        });
      });
    }
  }
}

// ---- causal conv1d + SiLU, gated RMSNorm -----------------------------------------------

inline V silu_v(V x) { return S::div(x, S::add(S::set1(1.0f), S::exp(S::sub(S::zero(), x)))); }
inline float silu_1(float x) { return x / (1.0f + std::exp(-x)); }

// In place, without copying the input: outputs are produced from the last token back to
// the first, so the inputs a token reads (its own and the kernel - 1 before it) are still
// unwritten; rows before the chunk come from `state`. Threads split the channels.
void conv1d_silu(float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t kernel, float* state) {
  const int64_t hist = kernel - 1, C = channels, T = n_tokens;
  // taps [kernel, C] (w transposed, so a vector of channels reads one row per tap), then the
  // next state [hist, C]: the last hist rows of [state ; x].
  float* taps = scratch(static_cast<size_t>(kernel * C + hist * C));
  float* next = taps + kernel * C;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < kernel; ++j) taps[j * C + c] = w[c * kernel + j];
  for (int64_t r = 0; r < hist; ++r) {
    const int64_t row = T + r;  // in [state ; x] coordinates
    std::memcpy(next + r * C, row < hist ? state + row * C : x + (row - hist) * C, C * sizeof(float));
  }
  // Row i of [state ; x].
  auto window = [&](int64_t i) -> const float* { return i < hist ? state + i * C : x + (i - hist) * C; };
  const int64_t vecs = (C + L - 1) / L;
  const int threads = threads_for(T * C >= (int64_t{1} << 16) ? vecs : 1);
#pragma omp parallel num_threads(threads)
  {
    const FlushDenormals ftz;
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t c0 = std::min(C, vecs * id / nt * L), c1 = std::min(C, vecs * (id + 1) / nt * L);
    for (int64_t t = T - 1; t >= 0; --t) {
      float* y = x + t * C;
      int64_t c = c0;
      for (; c + L <= c1; c += L) {
        V acc = S::zero();
        for (int64_t j = 0; j < kernel; ++j) acc = S::fma(S::load(taps + j * C + c), S::load(window(t + j) + c), acc);
        S::store(y + c, silu_v(acc));
      }
      for (; c < c1; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < kernel; ++j) acc += taps[j * C + c] * window(t + j)[c];
        y[c] = silu_1(acc);
      }
    }
  }
  std::memcpy(state, next, hist * C * sizeof(float));
}

void rmsnorm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) {
#pragma omp parallel for schedule(static) num_threads(threads_for(rows >= 64 ? rows / 32 : 1))
  for (int64_t r = 0; r < rows; ++r) {
    const FlushDenormals ftz;
    float* p = x + r * n;
    const float* zr = z + r * n;
    const float inv = 1.0f / std::sqrt(dot(p, p, n) / static_cast<float>(n) + eps);
    const V iv = S::set1(inv);
    int64_t i = 0;
    for (; i + L <= n; i += L) {
      S::store(p + i, S::mul(S::mul(S::load(w + i), S::mul(S::load(p + i), iv)), silu_v(S::load(zr + i))));
    }
    for (; i < n; ++i) p[i] = w[i] * (p[i] * inv) * silu_1(zr[i]);
  }
}

}  // namespace

const DeltaTable& delta_table() {
  static const DeltaTable table{recurrent, chunked, conv1d_silu, rmsnorm_gated};
  return table;
}

}  // namespace infera::kernels::INFERA_KERNEL_NS
