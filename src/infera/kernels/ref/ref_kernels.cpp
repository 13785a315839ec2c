// Scalar reference kernels: plain loops with double accumulators, written to be read and
// trusted, not to be fast. The optimized paths are tested against these.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "infera/base/error.h"
#include "infera/kernels/kernels.h"

namespace infera::kernels::ref {

float weight_at(const MatRef& w, int64_t row, int64_t col) {
  const int64_t i = row * w.cols + col;
  switch (w.dtype) {
    case DType::kF32: return static_cast<const float*>(w.data)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    default: break;
  }
  fail("matmul: weight dtype {} is not supported (expected f32, bf16 or f16)", dtype_name(w.dtype));
}

void matmul(const float* x, int64_t m, const MatRef& w, float* y) {
  const int64_t n = w.rows, k = w.cols;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t t = 0; t < k; ++t) sum += double(x[i * k + t]) * double(weight_at(w, j, t));
      y[i * n + j] = static_cast<float>(sum);
    }
  }
}

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps, float w_offset) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[r * n + i]) * double(x[r * n + i]);
    const double inv = 1.0 / std::sqrt(ss / double(n) + double(eps));
    for (int64_t i = 0; i < n; ++i) {
      y[r * n + i] = static_cast<float>(double(x[r * n + i]) * inv * (double(w[i]) + w_offset));
    }
  }
}

void silu_mul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    gate[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * double(up[i]));
  }
}

void softmax(float* x, int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(x[i]));
  double sum = 0.0;
  std::vector<double> e(n);
  for (int64_t i = 0; i < n; ++i) sum += e[i] = std::exp(double(x[i]) - mx);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(e[i] / sum);
}

void add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void rope_neox(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const int32_t* positions,
               const float* inv_freq, float attn_factor) {
  const int64_t half = rot_dim / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        // The angle in f32 as Hugging Face computes it (positions.float() @ inv_freq).
        const float angle = static_cast<float>(positions[t]) * inv_freq[i];
        const double c = double(std::cos(angle)) * attn_factor;
        const double s = double(std::sin(angle)) * attn_factor;
        const double x0 = v[i], x1 = v[i + half];
        v[i] = static_cast<float>(x0 * c - x1 * s);
        v[i + half] = static_cast<float>(x1 * c + x0 * s);
      }
    }
  }
}

void attention_contiguous(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* k,
                          const float* v, int64_t n_ctx, int64_t n_kv_heads, int64_t head_dim, float scale,
                          float* out) {
  INFERA_ASSERT(n_heads % n_kv_heads == 0);
  INFERA_ASSERT(pos0 + n_tokens <= n_ctx);
  const int64_t group = n_heads / n_kv_heads;
  std::vector<double> scores;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t ctx = pos0 + t + 1;  // causal: keys [0, pos0 + t]
    scores.assign(ctx, 0.0);
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / group;
      const float* qh = q + (t * n_heads + h) * head_dim;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < ctx; ++j) {
        const float* kj = k + (j * n_kv_heads + kvh) * head_dim;
        double dot = 0.0;
        for (int64_t d = 0; d < head_dim; ++d) dot += double(qh[d]) * double(kj[d]);
        scores[j] = dot * scale;
        mx = std::max(mx, scores[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < ctx; ++j) sum += scores[j] = std::exp(scores[j] - mx);
      float* oh = out + (t * n_heads + h) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j < ctx; ++j) acc += scores[j] * double(v[(j * n_kv_heads + kvh) * head_dim + d]);
        oh[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace infera::kernels::ref
