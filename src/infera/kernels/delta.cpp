#include "infera/kernels/delta.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "infera/base/error.h"
#include "infera/base/options.h"
#include "infera/base/threads.h"
#include "infera/kernels/cpu/delta_dispatch.h"

namespace infera::kernels {
namespace {

void check_shape(const DeltaShape& s) {
  INFERA_ASSERT(s.n_k_heads > 0 && s.n_v_heads > 0 && s.dk > 0 && s.dv > 0 && s.n_v_heads % s.n_k_heads == 0,
                "gated delta rule: bad head geometry");
}

// The reference loops as a table: the scalar path's recurrence and chunked rule (on one
// lane the register tiling of delta_impl.h buys nothing, and the compiler vectorizes these
// plain loops better), and every entry when INFERA_GDN_KERNELS=ref (A/B benchmarks of
// whole models against the pre-SIMD kernels).
const DeltaTable& reference_table() {
  static const DeltaTable table{ref::gated_delta_rule_recurrent, ref::gated_delta_rule_chunked, ref::causal_conv1d_silu,
                                ref::rmsnorm_gated};
  return table;
}

bool reference_requested() {
  static const bool on = [] { return option_env("gdn_kernels", BadEnvValue::kWarnAndIgnore) == "ref"; }();
  return on;
}

const DeltaTable& table_for(Isa isa) {
  if (reference_requested()) return reference_table();
  switch (isa) {
    case Isa::kAvx512:
      INFERA_ASSERT(cpu_features().has_avx512_path(), "kernel path avx512 is not available on this CPU");
      return cpu_avx512::delta_table();
    case Isa::kAvx2:
      INFERA_ASSERT(cpu_features().has_avx2_path(), "kernel path avx2 is not available on this CPU");
      return cpu_avx2::delta_table();
    case Isa::kScalar: break;
  }
  static const DeltaTable scalar{reference_table().recurrent, reference_table().chunked,
                                 cpu_scalar::delta_table().conv1d_silu, cpu_scalar::delta_table().rmsnorm_gated};
  return scalar;
}

int threads_for(int64_t tasks) {
  if (omp_in_parallel()) return 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads(), tasks)));
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

// ---- dispatch ----

void gated_delta_rule_recurrent(Isa isa, const float* q, const float* k, const float* v, const float* g,
                                const float* beta, int64_t n_tokens, const DeltaShape& s, float* state, float* out) {
  check_shape(s);
  INFERA_ASSERT(n_tokens >= 0);
  if (n_tokens == 0) return;
  table_for(isa).recurrent(q, k, v, g, beta, n_tokens, s, state, out);
}
void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                int64_t n_tokens, const DeltaShape& s, float* state, float* out) {
  gated_delta_rule_recurrent(best_isa(), q, k, v, g, beta, n_tokens, s, state, out);
}

void gated_delta_rule_chunked(Isa isa, const float* q, const float* k, const float* v, const float* g,
                              const float* beta, int64_t n_tokens, const DeltaShape& s, float* state, float* out,
                              int64_t chunk) {
  check_shape(s);
  INFERA_ASSERT(chunk >= 1 && n_tokens >= 0);
  if (n_tokens == 0) return;
  table_for(isa).chunked(q, k, v, g, beta, n_tokens, s, state, out, chunk);
}
void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                              int64_t n_tokens, const DeltaShape& s, float* state, float* out, int64_t chunk) {
  gated_delta_rule_chunked(best_isa(), q, k, v, g, beta, n_tokens, s, state, out, chunk);
}

void causal_conv1d_silu(Isa isa, float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t kernel,
                        float* state) {
  INFERA_ASSERT(kernel >= 1 && channels >= 0 && n_tokens >= 0);
  table_for(isa).conv1d_silu(x, n_tokens, channels, w, kernel, state);
}
void causal_conv1d_silu(float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t kernel, float* state) {
  causal_conv1d_silu(best_isa(), x, n_tokens, channels, w, kernel, state);
}

void rmsnorm_gated(Isa isa, float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) {
  INFERA_ASSERT(rows >= 0 && n > 0);
  table_for(isa).rmsnorm_gated(x, z, w, rows, n, eps);
}
void rmsnorm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) {
  rmsnorm_gated(best_isa(), x, z, w, rows, n, eps);
}

// ---- scalar references ----

namespace ref {

void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                int64_t n_tokens, const DeltaShape& s, float* state, float* out) {
  check_shape(s);
  const int64_t group = s.n_v_heads / s.n_k_heads;
  const int64_t dk = s.dk, dv = s.dv;
#pragma omp parallel for schedule(static) num_threads(threads_for(s.n_v_heads))
  for (int64_t h = 0; h < s.n_v_heads; ++h) {
    const int64_t hk = h / group;
    float* S = state + h * dk * dv;  // [dk, dv]
    std::vector<float> delta(static_cast<size_t>(dv));
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* kt = k + (t * s.n_k_heads + hk) * dk;
      const float* qt = q + (t * s.n_k_heads + hk) * dk;
      const float* vt = v + (t * s.n_v_heads + h) * dv;
      const float decay = std::exp(g[t * s.n_v_heads + h]);
      const float b = beta[t * s.n_v_heads + h];
      for (int64_t j = 0; j < dv; ++j) delta[j] = 0.0f;
      for (int64_t i = 0; i < dk; ++i) {
        float* row = S + i * dv;
        for (int64_t j = 0; j < dv; ++j) {
          row[j] *= decay;
          delta[j] += row[j] * kt[i];
        }
      }
      for (int64_t j = 0; j < dv; ++j) delta[j] = b * (vt[j] - delta[j]);
      float* ot = out + (t * s.n_v_heads + h) * dv;
      for (int64_t j = 0; j < dv; ++j) ot[j] = 0.0f;
      for (int64_t i = 0; i < dk; ++i) {
        float* row = S + i * dv;
        const float ki = kt[i], qi = qt[i];
        for (int64_t j = 0; j < dv; ++j) {
          row[j] += ki * delta[j];
          ot[j] += row[j] * qi;
        }
      }
    }
  }
}

void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                              int64_t n_tokens, const DeltaShape& s, float* state, float* out, int64_t chunk) {
  check_shape(s);
  INFERA_ASSERT(chunk >= 1);
  const int64_t group = s.n_v_heads / s.n_k_heads;
  const int64_t dk = s.dk, dv = s.dv, C = chunk;
  const int64_t qk_stride = s.n_k_heads * dk, v_stride = s.n_v_heads * dv;
#pragma omp parallel for schedule(static) num_threads(threads_for(s.n_v_heads))
  for (int64_t h = 0; h < s.n_v_heads; ++h) {
    const int64_t hk = h / group;
    float* S = state + h * dk * dv;  // [dk, dv]
    // Per-chunk work buffers (rows = tokens of the chunk).
    std::vector<float> gc(C), A(C * C), kb(C * dk), kbg(C * dk), vb(C * dv), U(C * dv), W(C * dk), vn(C * dv), row(C),
        qs(dv);
    for (int64_t c0 = 0; c0 < n_tokens; c0 += C) {
      const int64_t L = std::min(C, n_tokens - c0);
      auto kt = [&](int64_t i) { return k + (c0 + i) * qk_stride + hk * dk; };
      auto qt = [&](int64_t i) { return q + (c0 + i) * qk_stride + hk * dk; };
      auto vt = [&](int64_t i) { return v + (c0 + i) * v_stride + h * dv; };
      // Cumulative log decay within the chunk; beta-weighted keys and values.
      float acc = 0.0f;
      for (int64_t i = 0; i < L; ++i) {
        acc += g[(c0 + i) * s.n_v_heads + h];
        gc[i] = acc;
        const float b = beta[(c0 + i) * s.n_v_heads + h];
        const float eg = std::exp(gc[i]);
        for (int64_t d = 0; d < dk; ++d) {
          kb[i * dk + d] = kt(i)[d] * b;
          kbg[i * dk + d] = kb[i * dk + d] * eg;
        }
        for (int64_t d = 0; d < dv; ++d) vb[i * dv + d] = vt(i)[d] * b;
      }
      // A = -(k_beta k^T ⊙ decay) strictly lower; then (I + A_strict)^-1 by forward
      // substitution, row by row exactly as the HF loop does.
      for (int64_t i = 0; i < L; ++i) {
        for (int64_t j = 0; j < L; ++j) {
          float val = 0.0f;
          if (j < i) {
            float dot = 0.0f;
            for (int64_t d = 0; d < dk; ++d) dot += kb[i * dk + d] * kt(j)[d];
            val = -dot * std::exp(gc[i] - gc[j]);
          }
          A[i * C + j] = val;
        }
      }
      for (int64_t i = 1; i < L; ++i) {
        for (int64_t j = 0; j < i; ++j) {
          float sum = A[i * C + j];
          for (int64_t m = j + 1; m < i; ++m) sum += A[i * C + m] * A[m * C + j];
          row[j] = sum;
        }
        for (int64_t j = 0; j < i; ++j) A[i * C + j] = row[j];
      }
      for (int64_t i = 0; i < L; ++i) A[i * C + i] = 1.0f;
      // U = T v_beta [L, dv];  W = T (k_beta ⊙ exp(gc)) [L, dk]  (T = A, lower incl. diag).
      for (int64_t i = 0; i < L; ++i) {
        float* u = U.data() + i * dv;
        float* w = W.data() + i * dk;
        std::fill(u, u + dv, 0.0f);
        std::fill(w, w + dk, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          const float a = A[i * C + j];
          for (int64_t d = 0; d < dv; ++d) u[d] += a * vb[j * dv + d];
          for (int64_t d = 0; d < dk; ++d) w[d] += a * kbg[j * dk + d];
        }
      }
      // v_new = U - W S;  o = exp(gc) (q S) + Σ_{j<=i} (q_i·k_j) exp(gc_i - gc_j) v_new_j.
      for (int64_t i = 0; i < L; ++i) {
        float* vni = vn.data() + i * dv;
        std::memcpy(vni, U.data() + i * dv, dv * sizeof(float));
        const float* w = W.data() + i * dk;
        std::fill(qs.begin(), qs.end(), 0.0f);
        const float* qi = qt(i);
        for (int64_t d = 0; d < dk; ++d) {
          const float* Sd = S + d * dv;
          const float wd = w[d], qd = qi[d];
          for (int64_t e = 0; e < dv; ++e) {
            vni[e] -= wd * Sd[e];
            qs[e] += qd * Sd[e];
          }
        }
        float* oi = out + (c0 + i) * v_stride + h * dv;
        const float eg = std::exp(gc[i]);
        for (int64_t e = 0; e < dv; ++e) oi[e] = eg * qs[e];
      }
      for (int64_t i = 0; i < L; ++i) {
        float* oi = out + (c0 + i) * v_stride + h * dv;
        const float* qi = qt(i);
        for (int64_t j = 0; j <= i; ++j) {
          float dot = 0.0f;
          const float* kj = kt(j);
          for (int64_t d = 0; d < dk; ++d) dot += qi[d] * kj[d];
          const float a = dot * std::exp(gc[i] - gc[j]);
          const float* vnj = vn.data() + j * dv;
          for (int64_t e = 0; e < dv; ++e) oi[e] += a * vnj[e];
        }
      }
      // S = exp(gc_last) S + Σ_i (k_i exp(gc_last - gc_i)) v_new_i^T.
      const float g_last = gc[L - 1];
      const float e_last = std::exp(g_last);
      for (int64_t d = 0; d < dk * dv; ++d) S[d] *= e_last;
      for (int64_t i = 0; i < L; ++i) {
        const float f = std::exp(g_last - gc[i]);
        const float* ki = kt(i);
        const float* vni = vn.data() + i * dv;
        for (int64_t d = 0; d < dk; ++d) {
          const float kd = ki[d] * f;
          float* Sd = S + d * dv;
          for (int64_t e = 0; e < dv; ++e) Sd[e] += kd * vni[e];
        }
      }
    }
  }
}

void causal_conv1d_silu(float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t kernel, float* state) {
  INFERA_ASSERT(kernel >= 1 && channels >= 0 && n_tokens >= 0);
  const int64_t hist = kernel - 1;
  // window = [state ; x] over time, [hist + n_tokens, channels].
  std::vector<float> window(static_cast<size_t>((hist + n_tokens) * channels));
  std::memcpy(window.data(), state, hist * channels * sizeof(float));
  std::memcpy(window.data() + hist * channels, x, n_tokens * channels * sizeof(float));
#pragma omp parallel for schedule(static) num_threads(threads_for(n_tokens > 8 ? n_tokens : 1))
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* y = x + t * channels;
    for (int64_t c = 0; c < channels; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < kernel; ++j) acc += w[c * kernel + j] * window[(t + j) * channels + c];
      y[c] = silu(acc);
    }
  }
  std::memcpy(state, window.data() + n_tokens * channels, hist * channels * sizeof(float));
}

}  // namespace ref

void l2norm_rows(float* x, int64_t rows, int64_t n, float eps, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* p = x + r * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(p[i]) * p[i];
    const float f = scale / static_cast<float>(std::sqrt(ss + eps));
    for (int64_t i = 0; i < n; ++i) p[i] *= f;
  }
}

void gdn_gates(const float* a, const float* b, int64_t rows, int64_t heads, const float* neg_exp_a,
               const float* dt_bias, float* g, float* beta) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const float x = a[r * heads + h] + dt_bias[h];
      // softplus as torch.nn.functional.softplus (threshold 20: linear above).
      const float sp = x > 20.0f ? x : std::log1p(std::exp(x));
      g[r * heads + h] = neg_exp_a[h] * sp;
      beta[r * heads + h] = 1.0f / (1.0f + std::exp(-b[r * heads + h]));
    }
  }
}

namespace ref {

void rmsnorm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* p = x + r * n;
    const float* zr = z + r * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(p[i]) * p[i];
    const float inv = 1.0f / static_cast<float>(std::sqrt(ss / n + eps));
    for (int64_t i = 0; i < n; ++i) p[i] = w[i] * (p[i] * inv) * silu(zr[i]);
  }
}

}  // namespace ref

}  // namespace infera::kernels
