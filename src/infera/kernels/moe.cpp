#include "infera/kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "infera/base/error.h"
#include "infera/kernels/kernels.h"

namespace infera::kernels {
namespace {

void check_route_args(int64_t n_tokens, int64_t n_experts, int64_t k) {
  INFERA_ASSERT(n_tokens >= 0 && n_experts >= 1 && k >= 1 && k <= n_experts, "moe_route_softmax: bad sizes");
}

}  // namespace

void moe_route_softmax(const float* logits, int64_t n_tokens, int64_t n_experts, int64_t k, bool normalize,
                       int32_t* ids, float* weights) {
  check_route_args(n_tokens, n_experts, k);
  std::vector<float> p(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::memcpy(p.data(), logits + t * n_experts, n_experts * sizeof(float));
    softmax(p.data(), n_experts);
    int32_t* tid = ids + t * k;
    float* tw = weights + t * k;
    // Insertion into a best-first list of k: k is small (8..10) and E at most a few hundred,
    // so this beats sorting all E. Strict '>' keeps the lower id first on ties.
    int64_t filled = 0;
    for (int64_t e = 0; e < n_experts; ++e) {
      const float v = p[e];
      if (filled == k && !(v > tw[k - 1])) continue;
      int64_t pos = filled < k ? filled++ : k - 1;
      while (pos > 0 && v > tw[pos - 1]) {
        tw[pos] = tw[pos - 1];
        tid[pos] = tid[pos - 1];
        --pos;
      }
      tw[pos] = v;
      tid[pos] = static_cast<int32_t>(e);
    }
    if (normalize) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += tw[j];
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < k; ++j) tw[j] *= inv;
    }
  }
}

void group_by_expert(const int32_t* ids, const float* weights, int64_t n_tokens, int64_t k, int64_t n_experts,
                     ExpertGroups& out) {
  const int64_t n = n_tokens * k;
  out.offsets.assign(static_cast<size_t>(n_experts + 1), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= n_experts) fail("group_by_expert: expert id {} outside [0, {})", ids[i], n_experts);
    ++out.offsets[ids[i] + 1];
  }
  for (int64_t e = 0; e < n_experts; ++e) out.offsets[e + 1] += out.offsets[e];
  out.rows.resize(static_cast<size_t>(n));
  out.weights.resize(static_cast<size_t>(n));
  std::vector<int32_t> cursor(out.offsets.begin(), out.offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t slot = cursor[ids[i]]++;
    out.rows[slot] = static_cast<int32_t>(i / k);
    out.weights[slot] = weights[i];
  }
}

void gather_rows(const float* x, int64_t cols, const int32_t* rows, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * cols, x + rows[i] * cols, cols * sizeof(float));
}

void scatter_add_weighted(const float* src, int64_t cols, const int32_t* rows, const float* w, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    float* dst = y + rows[i] * cols;
    const float* s = src + i * cols;
    const float wi = w[i];
    for (int64_t c = 0; c < cols; ++c) dst[c] += wi * s[c];
  }
}

namespace ref {

void moe_route_softmax(const float* logits, int64_t n_tokens, int64_t n_experts, int64_t k, bool normalize,
                       int32_t* ids, float* weights) {
  check_route_args(n_tokens, n_experts, k);
  std::vector<double> p(static_cast<size_t>(n_experts));
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* l = logits + t * n_experts;
    const double mx = *std::max_element(l, l + n_experts);
    double sum = 0.0;
    for (int64_t e = 0; e < n_experts; ++e) sum += p[e] = std::exp(static_cast<double>(l[e]) - mx);
    for (auto& v : p) v /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    double top = 0.0;
    for (int64_t j = 0; j < k; ++j) top += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[j];
      weights[t * k + j] = static_cast<float>(normalize ? p[order[j]] / top : p[order[j]]);
    }
  }
}

void group_by_expert(const int32_t* ids, const float* weights, int64_t n_tokens, int64_t k, int64_t n_experts,
                     ExpertGroups& out) {
  out.offsets.assign(1, 0);
  out.rows.clear();
  out.weights.clear();
  for (int64_t e = 0; e < n_experts; ++e) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        if (ids[t * k + j] != e) continue;
        out.rows.push_back(static_cast<int32_t>(t));
        out.weights.push_back(weights[t * k + j]);
      }
    }
    out.offsets.push_back(static_cast<int32_t>(out.rows.size()));
  }
}

}  // namespace ref

}  // namespace infera::kernels
