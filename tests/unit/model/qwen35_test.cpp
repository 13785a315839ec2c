// Hybrid (Qwen3.5) and Qwen3-MoE models on tiny random checkpoints from tools/gen_model.py:
// batched sequences (own recurrent states) equal lone runs, a prefill split into
// chunks or fed token by token equals one chunk (chunked delta rule vs recurrence inside
// the model), expert counters add up, MTP drafting runs on its own KV layer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/model/model.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

const fs::path kScratch = test::process_scratch_dir("infera_qwen35_test");

// Generates (once per process) a model directory with tools/gen_model.py.
std::string generated_model(const std::string& name, const std::string& args) {
  return test::generate_model(kScratch / name, args);
}

const char* kHybridArgs =
    "--arch qwen3_5_moe --hidden 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 "
    "--lin-dk 16 --lin-dv 16 --experts 8 --experts-per-tok 2 --moe-ffn 32 --shared-ffn 48 --vocab 300 --seed 3";

constexpr int64_t kBlock = 16;

// A model with 16 KV blocks and its sequences' recurrent states.
using Runner = test::ModelRunner;

SeqChunk chunk(int32_t begin, int32_t n, int32_t pos0, const std::vector<int32_t>& blocks, float* state) {
  SeqChunk s;
  s.token_begin = begin;
  s.n_tokens = n;
  s.pos0 = pos0;
  s.block_table = blocks.data();
  s.n_blocks = static_cast<int32_t>(blocks.size());
  s.state = state;
  return s;
}

// Feeds `tokens` to one sequence in chunks of the given sizes; returns the last logits.
std::vector<float> run_alone(Runner& r, const std::vector<int32_t>& tokens, const std::vector<int>& chunks,
                             const std::vector<int32_t>& blocks, int32_t slot) {
  std::vector<float> logits(r.vocab());
  int32_t pos = 0;
  for (int n : chunks) {
    ForwardBatch b;
    b.tokens.assign(tokens.begin() + pos, tokens.begin() + pos + n);
    b.seqs.push_back(chunk(0, n, pos, blocks, r.state(slot)));
    r.model->forward(b, *r.kv, logits.data());
    pos += n;
  }
  EXPECT_EQ(pos, static_cast<int32_t>(tokens.size()));
  return logits;
}

float max_diff(const std::vector<float>& a, const float* b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

const std::vector<int32_t> kPromptA = {5, 17, 99, 3, 250, 42, 7, 7, 180, 64, 12, 33, 91, 200, 150, 8, 77, 21, 4, 130};
const std::vector<int32_t> kPromptB = {260, 1, 2, 3, 44, 45, 46};

TEST(Qwen35Model, SplitPrefillAndTokenByTokenEqualOneChunk) {
  Runner r(generated_model("hybrid", kHybridArgs));
  const std::vector<int32_t> blocks = {0, 1};
  const auto whole = run_alone(r, kPromptA, {20}, blocks, 0);
  const auto split = run_alone(r, kPromptA, {7, 1, 12}, blocks, 0);
  const auto by_token = run_alone(r, kPromptA, std::vector<int>(20, 1), blocks, 0);
  EXPECT_LT(max_diff(whole, split.data()), 1e-4f);
  EXPECT_LT(max_diff(whole, by_token.data()), 1e-4f);
  // A restart at position 0 resets the slot: the same logits again.
  const auto again = run_alone(r, kPromptA, {20}, blocks, 0);
  EXPECT_LT(max_diff(whole, again.data()), 1e-6f);
}

TEST(Qwen35Model, BatchedSequencesEqualLoneRuns) {
  Runner r(generated_model("hybrid", kHybridArgs));
  const std::vector<int32_t> blocks_a = {0, 1}, blocks_b = {2, 3};
  const auto alone_a = run_alone(r, kPromptA, {12, 8}, blocks_a, 0);
  const auto alone_b = run_alone(r, kPromptB, {4, 3}, blocks_b, 0);

  const StateShape state = r.model->state_shape();
  EXPECT_EQ(state.num_layers, 3);  // the GDN layers of the four
  EXPECT_GT(state.bytes(), 0);
  const int32_t V = r.vocab();
  // Step 1: A's first 12 tokens and B's first 4 in one batch (slots 2 and 1).
  // Step 2: A's last 8 and B's last 3.
  std::vector<float> logits(2 * V);
  int32_t pa = 0, pb = 0;
  for (auto [na, nb] : {std::pair{12, 4}, std::pair{8, 3}}) {
    ForwardBatch b;
    b.tokens.assign(kPromptB.begin() + pb, kPromptB.begin() + pb + nb);
    b.tokens.insert(b.tokens.end(), kPromptA.begin() + pa, kPromptA.begin() + pa + na);
    b.seqs.push_back(chunk(0, nb, pb, blocks_b, r.state(1)));
    b.seqs.push_back(chunk(nb, na, pa, blocks_a, r.state(2)));
    r.model->forward(b, *r.kv, logits.data());
    pa += na;
    pb += nb;
  }
  EXPECT_LT(max_diff(alone_b, logits.data()), 1e-4f);
  EXPECT_LT(max_diff(alone_a, logits.data() + V), 1e-4f);

  ForwardBatch bad;
  bad.tokens = {1};
  bad.seqs.push_back(chunk(0, 1, 0, blocks_a, nullptr));  // no recurrent state
  EXPECT_THROW(r.model->forward(bad, *r.kv, logits.data()), Error);
}

TEST(Qwen35Model, ExpertCountsAddUpPerLayer) {
  Runner r(generated_model("hybrid", kHybridArgs));
  r.model->reset_expert_counts();
  run_alone(r, kPromptA, {20}, {0, 1}, 0);
  const auto counts = r.model->expert_counts();
  const auto& c = r.model->config();
  ASSERT_EQ(counts.size(), static_cast<size_t>(c.num_layers * c.num_experts));
  for (int l = 0; l < c.num_layers; ++l) {
    const uint64_t sum =
        std::accumulate(counts.begin() + l * c.num_experts, counts.begin() + (l + 1) * c.num_experts, uint64_t{0});
    EXPECT_EQ(sum, 20u * c.num_experts_per_tok) << "layer " << l;
  }
}

TEST(Qwen35Model, MtpDraftUsesItsOwnKvLayerAndIsDeterministic) {
  Runner r(generated_model("hybrid", kHybridArgs));
  MtpHead* head = r.model->mtp_head();
  ASSERT_NE(head, nullptr);
  const auto& c = r.model->config();
  EXPECT_EQ(r.model->kv_shape(kBlock).num_layers, 1 + 1);  // one full-attention layer + MTP
  const std::vector<int32_t> blocks = {0, 1};
  const int32_t V = r.vocab(), H = c.hidden_size, T = 10;
  // Trunk over T tokens with every row's logits, keeping the post-norm hidden states.
  ForwardBatch trunk;
  trunk.tokens.assign(kPromptA.begin(), kPromptA.begin() + T);
  trunk.seqs.push_back(chunk(0, T, 0, blocks, r.state(0)));
  trunk.seqs[0].all_logits = true;
  std::vector<float> logits(T * V);
  r.model->forward(trunk, *r.kv, logits.data());
  const std::vector<float> hidden(head->last_hidden(), head->last_hidden() + T * H);
  // Drafts for trunk positions 0..T-2 (token p+1 with hidden p), all rows; then again, one
  // at a time.
  ForwardBatch d;
  d.tokens.assign(kPromptA.begin() + 1, kPromptA.begin() + T);
  d.seqs.push_back(chunk(0, T - 1, 0, blocks, nullptr));
  d.seqs[0].all_logits = true;
  std::vector<float> draft_all((T - 1) * V);
  head->draft(d, hidden.data(), *r.kv, draft_all.data());
  for (float x : draft_all) ASSERT_TRUE(std::isfinite(x));
  std::vector<float> one(V);
  for (int32_t p = 1; p < T; ++p) {
    ForwardBatch s;
    s.tokens = {kPromptA[p]};
    s.seqs.push_back(chunk(0, 1, p - 1, blocks, nullptr));
    head->draft(s, hidden.data() + (p - 1) * H, *r.kv, one.data());
    std::vector<float> expect(draft_all.begin() + (p - 1) * V, draft_all.begin() + p * V);
    EXPECT_LT(max_diff(expect, one.data()), 1e-4f) << "position " << p;
  }
}

TEST(Qwen3MoeModel, DenseLayersFromMlpOnlyLayersAndCounts) {
  Runner r(generated_model("moe",
                           "--arch qwen3_moe --hidden 48 --layers 3 --heads 2 --kv-heads 1 --head-dim 24 "
                           "--experts 6 --experts-per-tok 3 --moe-ffn 16 --mlp-only-layers 1 --vocab 300 "
                           "--seed 4"));
  const auto& c = r.model->config();
  EXPECT_FALSE(c.is_moe_layer(1));
  const auto whole = run_alone(r, kPromptA, {20}, {0, 1}, 0);
  const auto by_token = run_alone(r, kPromptA, std::vector<int>(20, 1), {0, 1}, 0);
  EXPECT_LT(max_diff(whole, by_token.data()), 1e-4f);
  const auto counts = r.model->expert_counts();
  ASSERT_EQ(counts.size(), static_cast<size_t>(3 * 6));
  for (int l = 0; l < 3; ++l) {
    const uint64_t sum = std::accumulate(counts.begin() + l * 6, counts.begin() + (l + 1) * 6, uint64_t{0});
    EXPECT_EQ(sum, l == 1 ? 0u : 2u * 20u * 3u) << "layer " << l;
  }
}

}  // namespace
}  // namespace infera
