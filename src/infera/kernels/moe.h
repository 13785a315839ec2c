// Mixture-of-experts kernels: the router (softmax over experts, top-k, optional
// renormalisation) and the token <-> expert regrouping used to run one GEMM per expert
// (gather the expert's rows, matmul, scatter-add the weighted results back).
//
// All router math is f32 (the HF reference computes softmax(router_logits.float())).
// Scalar references (namespace ref, double accumulation, full sort) are the truth the
// tests compare against.
#pragma once

#include <cstdint>
#include <vector>

namespace infera::kernels {

// logits [n_tokens, n_experts] (router output, f32) -> per token the top-k experts by
// softmax probability, ties to the lower expert id (as torch.topk on CPU returns them):
// ids [n_tokens, k], weights [n_tokens, k] = p[id] (divided by the sum of the k
// probabilities when `normalize`, HF norm_topk_prob). Experts are listed best first.
// 1 <= k <= n_experts.
void moe_route_softmax(const float* logits, int64_t n_tokens, int64_t n_experts, int64_t k, bool normalize,
                       int32_t* ids, float* weights);

// The assignments of a batch grouped by expert (a counting sort, stable in token order):
// expert e owns entries [offsets[e], offsets[e + 1]); entry i is token rows[i] with
// router weight weights[i].
struct ExpertGroups {
  std::vector<int32_t> offsets;  // [n_experts + 1]
  std::vector<int32_t> rows;  // [n_tokens * k]
  std::vector<float> weights;  // [n_tokens * k]

  int64_t count(int64_t e) const { return offsets[e + 1] - offsets[e]; }
};

// ids/weights [n_tokens, k] from moe_route_softmax. Throws infera::Error on an id outside
// [0, n_experts).
void group_by_expert(const int32_t* ids, const float* weights, int64_t n_tokens, int64_t k, int64_t n_experts,
                     ExpertGroups& out);

// out[i, :] = x[rows[i], :] for i < n; x [*, cols], out [n, cols].
void gather_rows(const float* x, int64_t cols, const int32_t* rows, int64_t n, float* out);

// y[rows[i], :] += w[i] * src[i, :] for i < n (in order, so repeated rows accumulate in a
// fixed order: results do not depend on thread count).
void scatter_add_weighted(const float* src, int64_t cols, const int32_t* rows, const float* w, int64_t n, float* y);

namespace ref {

void moe_route_softmax(const float* logits, int64_t n_tokens, int64_t n_experts, int64_t k, bool normalize,
                       int32_t* ids, float* weights);
void group_by_expert(const int32_t* ids, const float* weights, int64_t n_tokens, int64_t k, int64_t n_experts,
                     ExpertGroups& out);

}  // namespace ref

}  // namespace infera::kernels
