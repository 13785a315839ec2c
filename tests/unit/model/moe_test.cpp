// MoE: router and expert-grouping kernels against their scalar references, and the
// grouped MoE FFN (one matmul per active expert) against a per-token dense evaluation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "infera/base/error.h"
#include "infera/kernels/moe.h"
#include "infera/model/blocks.h"

namespace infera {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(MoeRouter, MatchesReferenceForManyShapes) {
  for (auto [T, E, k] : {std::tuple{1, 8, 2}, {7, 8, 8}, {33, 128, 8}, {5, 64, 1}, {16, 256, 10}}) {
    for (bool normalize : {false, true}) {
      const auto logits = random_vec(static_cast<size_t>(T * E), 17 + E + k, 2.0f);
      std::vector<int32_t> ids(T * k), ref_ids(T * k);
      std::vector<float> w(T * k), ref_w(T * k);
      kernels::moe_route_softmax(logits.data(), T, E, k, normalize, ids.data(), w.data());
      kernels::ref::moe_route_softmax(logits.data(), T, E, k, normalize, ref_ids.data(), ref_w.data());
      EXPECT_EQ(ids, ref_ids) << "T=" << T << " E=" << E << " k=" << k;
      for (int i = 0; i < T * k; ++i) EXPECT_NEAR(w[i], ref_w[i], 1e-6f) << i;
      if (normalize) {
        for (int t = 0; t < T; ++t) {
          float sum = 0;
          for (int j = 0; j < k; ++j) sum += w[t * k + j];
          EXPECT_NEAR(sum, 1.0f, 1e-5f);
        }
      }
    }
  }
}

TEST(MoeRouter, TiesPickTheLowerExpertAndOrderIsBestFirst) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 2.0f};
  std::vector<int32_t> ids(3);
  std::vector<float> w(3);
  kernels::moe_route_softmax(logits.data(), 1, 5, 3, false, ids.data(), w.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 4}));
  kernels::moe_route_softmax(logits.data(), 1, 5, 4, false, ids.data(), w.data());
  EXPECT_EQ(ids[3], 0);
  EXPECT_GT(w[2], w[3]);
}

TEST(MoeGroups, MatchReferenceAndCoverEveryAssignment) {
  const int T = 40, E = 16, k = 4;
  const auto logits = random_vec(T * E, 5);
  std::vector<int32_t> ids(T * k);
  std::vector<float> w(T * k);
  kernels::moe_route_softmax(logits.data(), T, E, k, true, ids.data(), w.data());
  kernels::ExpertGroups g, ref;
  kernels::group_by_expert(ids.data(), w.data(), T, k, E, g);
  kernels::ref::group_by_expert(ids.data(), w.data(), T, k, E, ref);
  EXPECT_EQ(g.offsets, ref.offsets);
  EXPECT_EQ(g.rows, ref.rows);
  EXPECT_EQ(g.weights, ref.weights);
  EXPECT_EQ(g.offsets.back(), T * k);
  const std::vector<int32_t> bad = {0, 16};
  EXPECT_THROW(kernels::group_by_expert(bad.data(), w.data(), 1, 2, E, g), Error);
}

TEST(MoeGroups, GatherScatterRoundTrip) {
  const int64_t cols = 5;
  const auto x = random_vec(4 * cols, 9);
  const std::vector<int32_t> rows = {2, 0, 2};
  std::vector<float> g(rows.size() * cols);
  kernels::gather_rows(x.data(), cols, rows.data(), 3, g.data());
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(g[cols + c], x[c]);
  std::vector<float> y(4 * cols, 0.0f);
  const std::vector<float> w = {0.5f, 1.0f, 0.25f};
  kernels::scatter_add_weighted(g.data(), cols, rows.data(), w.data(), 3, y.data());
  for (int64_t c = 0; c < cols; ++c) {
    EXPECT_FLOAT_EQ(y[2 * cols + c], 0.75f * x[2 * cols + c]);
    EXPECT_FLOAT_EQ(y[c], x[c]);
    EXPECT_EQ(y[cols + c], 0.0f);
  }
}

// Direct evaluation: every token, every selected expert, one GEMV each, double sums.
std::vector<float> moe_direct(const MoeWeights& w, const std::vector<float>& x, int64_t T, int64_t H) {
  const int64_t E = w.n_experts(), k = w.top_k;
  std::vector<float> y(T * H, 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x.data() + t * H;
    std::vector<float> logit(E);
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t i = 0; i < H; ++i) s += double(kernels::ref::weight_at(w.router, e, i)) * xt[i];
      logit[e] = float(s);
    }
    std::vector<int32_t> ids(k);
    std::vector<float> wt(k);
    kernels::ref::moe_route_softmax(logit.data(), 1, E, k, w.norm_topk_prob, ids.data(), wt.data());
    for (int64_t j = 0; j < k; ++j) {
      const auto& G = w.gate[ids[j]];
      const auto& U = w.up[ids[j]];
      const auto& D = w.down[ids[j]];
      std::vector<double> h(G.rows);
      for (int64_t r = 0; r < G.rows; ++r) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < H; ++i) {
          g += double(kernels::ref::weight_at(G, r, i)) * xt[i];
          u += double(kernels::ref::weight_at(U, r, i)) * xt[i];
        }
        h[r] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t o = 0; o < H; ++o) {
        double s = 0;
        for (int64_t r = 0; r < G.rows; ++r) s += double(kernels::ref::weight_at(D, o, r)) * h[r];
        y[t * H + o] += float(wt[j] * s);
      }
    }
  }
  return y;
}

TEST(MoeFfn, GroupedExecutionEqualsPerTokenEvaluation) {
  const int64_t H = 24, I = 16, E = 6, k = 2;
  const auto router = random_vec(E * H, 1, 0.5f);
  std::vector<std::vector<float>> gates, ups, downs;
  MoeWeights w;
  w.router = {router.data(), DType::kF32, E, H};
  w.top_k = k;
  w.norm_topk_prob = true;
  for (int64_t e = 0; e < E; ++e) {
    gates.push_back(random_vec(I * H, 100 + e, 0.2f));
    ups.push_back(random_vec(I * H, 200 + e, 0.2f));
    downs.push_back(random_vec(H * I, 300 + e, 0.2f));
  }
  for (int64_t e = 0; e < E; ++e) {
    w.gate.push_back({gates[e].data(), DType::kF32, I, H});
    w.up.push_back({ups[e].data(), DType::kF32, I, H});
    w.down.push_back({downs[e].data(), DType::kF32, H, I});
  }
  MoeFfn ffn;
  for (int64_t T : {1, 3, 37}) {
    const auto x = random_vec(T * H, 7 + T);
    std::vector<float> y(T * H);
    std::vector<uint64_t> counts(E, 0);
    ffn.forward(w, x.data(), T, H, y.data(), counts.data());
    const auto expect = moe_direct(w, x, T, H);
    for (int64_t i = 0; i < T * H; ++i) ASSERT_NEAR(y[i], expect[i], 1e-4f) << "T=" << T << " i=" << i;
    uint64_t total = 0;
    for (auto c : counts) total += c;
    EXPECT_EQ(total, static_cast<uint64_t>(T * k));
  }
}

}  // namespace
}  // namespace infera
