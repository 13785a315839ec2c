// MoE: router and expert-grouping kernels against their scalar references, and the
// grouped MoE FFN (one matmul per active expert) against a per-token dense evaluation.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "../kernels/ggml_random_blocks.h"
#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/base/membw.h"
#include "infera/base/threads.h"
#include "infera/kernels/kernels.h"
#include "infera/kernels/moe.h"
#include "infera/kernels/quant.h"
#include "infera/model/blocks.h"

namespace infera {
namespace {

using test::random_vec;

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
  ids.resize(4);
  w.resize(4);
  kernels::moe_route_softmax(logits.data(), 1, 5, 4, false, ids.data(), w.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 4, 0}));
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

float weight_value(const kernels::LinearWeight& w, int64_t r, int64_t c) {
  return w.quantized ? kernels::ref::qweight_at(w.quant, r, c) * kernels::ref::qscale_at(w.quant, r, c)
                     : kernels::ref::weight_at(w.dense, r, c);
}

// SwiGLU of one token with double sums: out[H] += scale * down(silu(gate x) * up x).
void swiglu_direct(const kernels::LinearWeight& G, const kernels::LinearWeight& U, const kernels::LinearWeight& D,
                   const float* xt, int64_t H, double scale, float* out) {
  std::vector<double> h(G.rows());
  for (int64_t r = 0; r < G.rows(); ++r) {
    double g = 0, u = 0;
    for (int64_t i = 0; i < H; ++i) {
      g += double(weight_value(G, r, i)) * xt[i];
      u += double(weight_value(U, r, i)) * xt[i];
    }
    h[r] = g / (1 + std::exp(-g)) * u;
  }
  for (int64_t o = 0; o < H; ++o) {
    double s = 0;
    for (int64_t r = 0; r < G.rows(); ++r) s += double(weight_value(D, o, r)) * h[r];
    out[o] += float(scale * s);
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
      if (!w.has_expert(ids[j])) continue;
      swiglu_direct(w.gate[ids[j]], w.up[ids[j]], w.down[ids[j]], xt, H, wt[j], y.data() + t * H);
    }
    if (!w.shared.empty()) {
      double g = 0;
      for (int64_t i = 0; i < H; ++i) g += double(kernels::ref::weight_at(w.shared_gate, 0, i)) * xt[i];
      swiglu_direct(w.shared.gate, w.shared.up, w.shared.down, xt, H, 1 / (1 + std::exp(-g)), y.data() + t * H);
    }
  }
  return y;
}

// f32 experts (and a shared expert) with random weights; the vectors own the data.
struct RandomMoe {
  std::vector<std::vector<float>> data;
  MoeWeights w;
  RandomMoe(int64_t H, int64_t I, int64_t E, int64_t k, int64_t shared_inter) {
    auto add = [&](int64_t rows, int64_t cols, uint32_t seed, float scale) {
      data.push_back(random_vec(rows * cols, seed, scale));
      return kernels::MatRef{data.back().data(), DType::kF32, rows, cols};
    };
    data.reserve(3 * E + 5);
    w.router = add(E, H, 1, 0.5f);
    w.top_k = k;
    w.norm_topk_prob = true;
    for (int64_t e = 0; e < E; ++e) {
      w.gate.push_back(kernels::dense_linear(add(I, H, 100 + e, 0.2f)));
      w.up.push_back(kernels::dense_linear(add(I, H, 200 + e, 0.2f)));
      w.down.push_back(kernels::dense_linear(add(H, I, 300 + e, 0.2f)));
    }
    if (shared_inter > 0) {
      w.shared.gate = kernels::dense_linear(add(shared_inter, H, 400, 0.2f));
      w.shared.up = kernels::dense_linear(add(shared_inter, H, 401, 0.2f));
      w.shared.down = kernels::dense_linear(add(H, shared_inter, 402, 0.2f));
      w.shared_gate = add(1, H, 403, 0.3f);
    }
  }
};

TEST(MoeFfn, GroupedExecutionEqualsPerTokenEvaluation) {
  const int64_t H = 24, I = 16, E = 6, k = 2;
  for (int64_t shared : {0, 20}) {
    RandomMoe moe(H, I, E, k, shared);
    for (auto schedule : {MoeFfn::Schedule::kPerExpert, MoeFfn::Schedule::kWorkItems, MoeFfn::Schedule::kAuto}) {
      MoeFfn ffn;
      ffn.set_schedule(schedule);
      for (int64_t T : {1, 3, 37}) {
        const auto x = random_vec(T * H, 7 + T);
        std::vector<float> y(T * H);
        std::vector<uint64_t> counts(E, 0);
        ffn.forward(moe.w, x.data(), T, H, y.data(), counts.data());
        const auto expect = moe_direct(moe.w, x, T, H);
        for (int64_t i = 0; i < T * H; ++i) {
          ASSERT_NEAR(y[i], expect[i], 1e-4f) << "T=" << T << " i=" << i << " shared=" << shared;
        }
        uint64_t total = 0;
        for (auto c : counts) total += c;
        EXPECT_EQ(total, static_cast<uint64_t>(T * k));
      }
    }
  }
}

// The work-item schedule (row blocks of every active expert in one parallel region) gives
// the per-expert schedule's result whatever the thread count, with experts of another
// rank (expert parallelism) skipped but still counted.
TEST(MoeFfn, WorkItemsMatchPerExpertAndSkipDroppedExperts) {
  const int64_t H = 96, I = 80, E = 8, k = 3, T = 5;
  RandomMoe moe(H, I, E, k, 40);
  moe.w.drop_expert(2);
  const auto x = random_vec(T * H, 11);
  std::vector<float> a(T * H), b(T * H);
  std::vector<uint64_t> counts(E, 0);
  MoeFfn per_expert, items;
  per_expert.set_schedule(MoeFfn::Schedule::kPerExpert);
  items.set_schedule(MoeFfn::Schedule::kWorkItems);
  per_expert.forward(moe.w, x.data(), T, H, a.data(), counts.data());
  items.forward(moe.w, x.data(), T, H, b.data(), counts.data());
  const auto expect = moe_direct(moe.w, x, T, H);
  for (int64_t i = 0; i < T * H; ++i) {
    ASSERT_NEAR(a[i], b[i], 1e-5f * (1 + std::fabs(a[i]))) << i;
    ASSERT_NEAR(b[i], expect[i], 1e-4f) << i;
  }
  uint64_t total = 0;
  for (auto c : counts) total += c;
  EXPECT_EQ(total, static_cast<uint64_t>(2 * T * k));  // dropped experts are counted too
}

// Experts in llama.cpp's block types (as a GGUF file holds them), on odd shapes: the batch
// grouped by expert (one GEMM per expert, per-expert or work-item schedule, the latter also
// in chunks of tokens) gives bit for bit what running the tokens one at a time gives.
// The router and the shared expert's gate are Q8_0 here (GGUF routers are usually f32): a
// block-type matmul computes each row alone, so the routing does not depend on the batch.
struct GgmlMoe {
  std::vector<std::vector<uint8_t>> blocks;
  MoeWeights w;
  // panels: the panel types' matrices with their load-time panels (kernels::ggml::pack_panels),
  // over the lanes of `lanes` where given, as a GGUF model lays them.
  GgmlMoe(uint32_t type, int64_t H, int64_t I, int64_t E, int64_t k, int64_t shared_inter, bool panels = false,
          const std::shared_ptr<LaneBuffer>& lanes = nullptr) {
    std::mt19937 rng(type + 5);
    auto mat = [&](int64_t rows, int64_t cols, uint32_t t) {
      blocks.push_back(kernels::ggml::random_blocks(t, rows * cols / kernels::ggml::block_size(t), rng));
      kernels::MatRef m{blocks.back().data(), DType::kGgml, rows, cols, t};
      if (panels && kernels::ggml::can_pack_panels(t)) {
        if (lanes)
          m.set_panels(kernels::ggml::pack_panels(t, m.data, rows, cols, lanes));
        else
          m.panels = kernels::ggml::pack_panels(t, m.data, rows, cols);
      }
      return m;
    };
    auto add = [&](int64_t rows, int64_t cols) { return kernels::dense_linear(mat(rows, cols, type)); };
    blocks.reserve(3 * E + 5);
    w.router = mat(E, H, kernels::ggml::kQ8_0);
    w.top_k = k;
    w.norm_topk_prob = true;
    for (int64_t e = 0; e < E; ++e) {
      w.gate.push_back(add(I, H));
      w.up.push_back(add(I, H));
      w.down.push_back(add(H, I));
    }
    if (shared_inter > 0) {
      w.shared.gate = add(shared_inter, H);
      w.shared.up = add(shared_inter, H);
      w.shared.down = add(H, shared_inter);
      w.shared_gate = mat(1, H, kernels::ggml::kQ8_0);
    }
  }
};

TEST(MoeFfn, GgmlExpertsGroupedEqualTokenAtATime) {
  using namespace kernels::ggml;
  struct Case {
    uint32_t type;
    int64_t H, I, E, k, shared;
    bool panels = false;
  };
  const Case cases[] = {{kQ4_K, 512, 256, 7, 3, 0},       {kQ6_K, 256, 512, 5, 2, 256},
                        {kQ8_0, 96, 160, 6, 2, 0},        {kQ4_0, 160, 96, 9, 4, 32},
                        {kQ5_0, 64, 224, 4, 3, 0},        {kIQ4_XS, 256, 256, 6, 1, 0},
                        {kQ4_0, 160, 96, 9, 4, 32, true}, {kIQ4_NL, 96, 64, 5, 2, 0, true},
                        {kQ8_0, 96, 160, 6, 2, 0, true},  {kQ5_1, 64, 96, 4, 2, 0, true},
                        {kQ4_K, 512, 256, 7, 3, 0, true}};
  for (const Case& c : cases) {
    GgmlMoe moe(c.type, c.H, c.I, c.E, c.k, c.shared, c.panels);
    for (int64_t T : {5, 37}) {
      const auto x = random_vec(T * c.H, 70 + T);
      std::vector<float> one(T * c.H);
      MoeFfn single;
      single.set_schedule(MoeFfn::Schedule::kPerExpert);
      set_thread_num_threads(1);
      for (int64_t t = 0; t < T; ++t) single.forward(moe.w, x.data() + t * c.H, 1, c.H, one.data() + t * c.H, nullptr);
      set_thread_num_threads(2);  // the work items run in parallel (kAuto picks them) whatever the machine
      for (int variant = 0; variant < 4; ++variant) {
        MoeFfn ffn;
        ffn.set_schedule(variant == 0   ? MoeFfn::Schedule::kPerExpert
                         : variant == 3 ? MoeFfn::Schedule::kAuto
                                        : MoeFfn::Schedule::kWorkItems);
        if (variant == 2) ffn.set_chunk_tokens(8);
        std::vector<float> y(T * c.H, -1.0f);
        std::vector<uint64_t> counts(c.E, 0);
        ffn.forward(moe.w, x.data(), T, c.H, y.data(), counts.data());
        EXPECT_EQ(y, one) << "type " << c.type << (c.panels ? " (panels)" : "") << " T=" << T << " variant " << variant;
        uint64_t total = 0;
        for (auto n : counts) total += n;
        EXPECT_EQ(total, static_cast<uint64_t>(T * c.k));
      }
      set_thread_num_threads(0);
    }
  }
}

// A decode step on several threads whose experts are GGUF matrices with panels runs as two
// shared passes (MoeFfn::run_one_token_shared: every gate and up, then every down, through
// kernels::matvec_many): token by token, the same values bit for bit as the per-expert calls
// on one thread and as the work items on two, with a shared expert (gated or not) or none, an expert
// of another rank dropped, panels in one run or over lanes, two and three threads.
TEST(MoeFfn, GgmlDecodeStepInSharedPassesEqualsPerExpertCalls) {
  if (!kernels::isa_available(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 path on this CPU (the panels are its)";
  using namespace kernels::ggml;
  struct Case {
    uint32_t type;
    int64_t H, I, E, k, shared;
    bool lanes;
  };
  const Case cases[] = {{kQ4_K, 512, 256, 7, 3, 0, true},  {kQ6_K, 256, 512, 5, 2, 256, true},
                        {kQ8_0, 96, 160, 6, 2, 32, true},  {kIQ4_XS, 256, 256, 6, 1, 0, true},
                        {kQ4_0, 160, 96, 5, 2, 32, false}, {kQ5_1, 64, 96, 4, 2, 0, true}};
  for (const Case& c : cases) {
    const auto lanes = c.lanes ? std::make_shared<LaneBuffer>(size_t{8} << 20) : nullptr;
    GgmlMoe moe(c.type, c.H, c.I, c.E, c.k, c.shared, true, lanes);
    if (c.type == kQ8_0) moe.w.shared_gate.data = nullptr;  // an ungated shared expert (DeepSeek's)
    // (panels in one run keep the work items: the same values either way)
    ASSERT_EQ(kernels::matvec_shares(moe.w.gate[0].dense), c.lanes) << "type " << c.type;
    ASSERT_EQ(kernels::matvec_shares(moe.w.down[0].dense), c.lanes) << "type " << c.type;
    for (bool dropped : {false, true}) {
      if (dropped) moe.w.drop_expert(1);
      const int64_t T = 6;
      const auto x = random_vec(T * c.H, 90 + c.type);
      std::vector<float> want(T * c.H), items(T * c.H);
      MoeFfn per_expert, work_items;
      per_expert.set_schedule(MoeFfn::Schedule::kPerExpert);
      work_items.set_schedule(MoeFfn::Schedule::kWorkItems);
      set_thread_num_threads(1);
      for (int64_t t = 0; t < T; ++t)
        per_expert.forward(moe.w, x.data() + t * c.H, 1, c.H, want.data() + t * c.H, nullptr);
      set_thread_num_threads(2);
      for (int64_t t = 0; t < T; ++t)
        work_items.forward(moe.w, x.data() + t * c.H, 1, c.H, items.data() + t * c.H, nullptr);
      EXPECT_EQ(items, want) << "type " << c.type;
      for (int threads : {2, 3}) {
        set_thread_num_threads(threads);
        MoeFfn ffn;  // kAuto
        std::vector<float> y(T * c.H, -1.0f);
        std::vector<uint64_t> counts(c.E, 0);
        for (int64_t t = 0; t < T; ++t)
          ffn.forward(moe.w, x.data() + t * c.H, 1, c.H, y.data() + t * c.H, counts.data());
        EXPECT_EQ(y, want) << "type " << c.type << (c.lanes ? " over lanes" : "")
                           << (dropped ? ", expert 1 dropped" : "") << ", " << threads << " threads";
        uint64_t total = 0;
        for (auto n : counts) total += n;
        EXPECT_EQ(total, static_cast<uint64_t>(T * c.k));  // dropped experts are counted too
      }
      set_thread_num_threads(0);
    }
  }
}

}  // namespace
}  // namespace infera
