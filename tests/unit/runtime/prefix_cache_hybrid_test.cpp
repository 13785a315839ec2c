// Prefix caching on hybrid (Gated DeltaNet) models: the prefix cache keeps recurrent-state
// checkpoints beside the KV blocks, and a conversation's next turn resumes from the
// deepest cached prefix that has one. Greedy output must be identical with and without the
// cache, turn after turn: on the trained default (models/infera-default) and on generated
// qwen3_5_moe / qwen3_next models, with MTP and n-gram speculation, batched, and under
// preemption.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>

#include "../test_support.h"
#include "infera/base/threads.h"
#include "infera/runtime/engine.h"
#include "test_models.h"

using namespace infera;

namespace {

namespace fs = std::filesystem;

struct OneThread {  // the models are tiny: threads would only add start-up and spinning
  int saved = num_threads();
  OneThread() { set_num_threads(1); }
  ~OneThread() { set_num_threads(saved); }
};

Model& default_model() {
  static std::unique_ptr<Model> model = [] {
    LoadOptions o;
    o.max_batch_tokens = 512;
    return load_model(std::string(INFERA_SOURCE_DIR) + "/models/infera-default", o);
  }();
  return *model;
}

Model& next_model() {
  static std::unique_ptr<Model> model = [] {
    const fs::path dir = test::process_scratch_dir("infera_prefix_hybrid_next");
    LoadOptions o;
    o.max_batch_tokens = 512;
    return load_model(test::generate_model(dir, std::string(test::kTinyHybridArgs) + " --arch qwen3_next"), o);
  }();
  return *model;
}

struct Turn {
  std::vector<int32_t> tokens;
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;
};

struct Conversations {
  std::vector<std::vector<Turn>> turns;  // [conversation][turn]
  EngineStats stats;
};

// `convs` conversations of `n_turns` turns, all conversations' turn t submitted together
// (batched). Turn t's prompt: the previous prompt, the previous answer and a new message
// of random tokens (the same in every run); the ends of earlier messages are passed as
// checkpoint positions.
Conversations converse(Model& model, const EngineConfig& config, int convs, int n_turns, int32_t first_len,
                       int32_t msg_len, int32_t gen) {
  EngineCore core(model, config);
  const int32_t vocab = model.config().vocab_size;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> d(3, std::min(vocab, 300) - 1);
  Conversations out;
  out.turns.resize(static_cast<size_t>(convs));
  std::vector<std::vector<int32_t>> context(static_cast<size_t>(convs));
  std::vector<std::vector<int32_t>> boundaries(static_cast<size_t>(convs));
  for (int t = 0; t < n_turns; ++t) {
    std::map<RequestId, int> conv_of;
    std::map<RequestId, Turn> done;
    for (int c = 0; c < convs; ++c) {
      auto& ctx = context[static_cast<size_t>(c)];
      if (t > 0) boundaries[static_cast<size_t>(c)].push_back(static_cast<int32_t>(ctx.size()));
      for (int32_t i = 0; i < (t == 0 ? first_len + 7 * c : msg_len); ++i) ctx.push_back(d(rng));
      Request r;
      r.prompt_ids = ctx;
      r.max_tokens = gen;
      r.ignore_eos = true;
      r.checkpoint_positions = boundaries[static_cast<size_t>(c)];
      const RequestId id = core.add_request(r, [&](const Event& e) {
        Turn& turn = done[e.id];
        if (!e.is_final()) {
          turn.tokens.push_back(e.token);
        } else {
          turn.prompt_tokens = e.usage.prompt_tokens;
          turn.cached_tokens = e.usage.cached_tokens;
        }
      });
      conv_of[id] = c;
    }
    while (core.has_work()) core.step();
    for (auto& [id, turn] : done) {
      const int c = conv_of.at(id);
      auto& ctx = context[static_cast<size_t>(c)];
      ctx.insert(ctx.end(), turn.tokens.begin(), turn.tokens.end());
      out.turns[static_cast<size_t>(c)].push_back(turn);
    }
  }
  out.stats = core.stats();
  return out;
}

EngineConfig base_config() {
  EngineConfig c;
  c.block_size = 16;
  c.max_batch_tokens = 128;
  c.max_num_seqs = 4;
  c.prefill_chunk = 48;
  c.kv_cache_bytes = 64 << 20;
  c.prefix_checkpoint_interval = 32;
  return c;
}

constexpr int kTurns = 4;
constexpr int32_t kFirst = 70, kMsg = 21, kGen = 10;

// Runs the conversations with the cache off (the reference) and with `cached`, and checks
// the tokens turn by turn and that later turns resumed from the cache.
void expect_same_with_cache(Model& model, const EngineConfig& cached, int convs, const std::string& what,
                            bool expect_full_hits = true) {
  OneThread one;
  EngineConfig off = base_config();
  off.enable_prefix_cache = false;
  const Conversations ref = converse(model, off, convs, kTurns, kFirst, kMsg, kGen);
  const Conversations got = converse(model, cached, convs, kTurns, kFirst, kMsg, kGen);
  ASSERT_EQ(got.turns.size(), ref.turns.size());
  for (size_t c = 0; c < ref.turns.size(); ++c) {
    for (int t = 0; t < kTurns; ++t) {
      const Turn& a = got.turns[c][static_cast<size_t>(t)];
      const Turn& b = ref.turns[c][static_cast<size_t>(t)];
      EXPECT_EQ(a.tokens, b.tokens) << what << ": conversation " << c << " turn " << t;
      EXPECT_EQ(b.cached_tokens, 0);
      if (t == 0) continue;
      if (expect_full_hits) {
        // At least the previous turn's prompt (down to a block) comes from the cache.
        const int32_t prev_prompt = got.turns[c][static_cast<size_t>(t - 1)].prompt_tokens;
        EXPECT_GE(a.cached_tokens, prev_prompt / 16 * 16) << what << ": conversation " << c << " turn " << t;
      }
    }
  }
  EXPECT_GT(got.stats.checkpoint_hits, 0) << what;
  EXPECT_GT(got.stats.checkpoints_stored, 0) << what;
  EXPECT_LT(got.stats.prompt_tokens_computed, ref.stats.prompt_tokens_computed) << what;
}

}  // namespace

TEST(PrefixCacheHybrid, TrainedDefaultSameTokensOverTurns) {
  Model& model = default_model();
  ASSERT_GT(model.state_shape().floats(), 0);
  expect_same_with_cache(model, base_config(), 1, "infera-default");
}

TEST(PrefixCacheHybrid, TrainedDefaultBatchedWithMtp) {
  Model& model = default_model();
  ASSERT_NE(model.mtp_head(), nullptr);
  EngineConfig c = base_config();
  c.speculative.method = SpeculativeMethod::kMtp;
  c.speculative.num_draft_tokens = 2;
  expect_same_with_cache(model, c, 3, "infera-default, MTP");
}

TEST(PrefixCacheHybrid, GeneratedQwen35MoeBatchedPlainMtpAndNgram) {
  Model& model = testing_support::hybrid_model();
  expect_same_with_cache(model, base_config(), 3, "qwen3_5_moe");
  EngineConfig mtp = base_config();
  mtp.speculative.method = SpeculativeMethod::kMtp;
  mtp.speculative.num_draft_tokens = 3;
  expect_same_with_cache(model, mtp, 2, "qwen3_5_moe, MTP");
  EngineConfig ngram = base_config();
  ngram.speculative.method = SpeculativeMethod::kNgram;
  ngram.speculative.num_draft_tokens = 3;
  expect_same_with_cache(model, ngram, 2, "qwen3_5_moe, n-gram");
}

TEST(PrefixCacheHybrid, GeneratedQwen3NextBatched) {
  Model& model = next_model();
  ASSERT_GT(model.state_shape().floats(), 0);
  expect_same_with_cache(model, base_config(), 2, "qwen3_next");
}

TEST(PrefixCacheHybrid, UnderPreemptionAndEviction) {
  // A cache of a few blocks more than one conversation needs: sequences are preempted
  // (and resume from their own checkpoints), blocks and checkpoints are evicted.
  Model& model = testing_support::hybrid_model();
  EngineConfig c = base_config();
  const int64_t block = model.kv_shape(16).bytes_per_block();
  c.kv_cache_bytes = 14 * block;
  c.prefill_chunk = 32;
  OneThread one;
  EngineConfig off = base_config();
  off.enable_prefix_cache = false;
  const Conversations ref = converse(model, off, 3, kTurns, kFirst, kMsg, kGen);
  const Conversations got = converse(model, c, 3, kTurns, kFirst, kMsg, kGen);
  for (size_t i = 0; i < ref.turns.size(); ++i) {
    for (int t = 0; t < kTurns; ++t) {
      EXPECT_EQ(got.turns[i][static_cast<size_t>(t)].tokens, ref.turns[i][static_cast<size_t>(t)].tokens)
          << "conversation " << i << " turn " << t;
    }
  }
  EXPECT_GT(got.stats.preemptions, 0);
  EXPECT_GT(got.stats.prefix_evictions + got.stats.checkpoint_evictions, 0);
  EXPECT_GT(got.stats.checkpoint_hits, 0);
}

TEST(PrefixCacheHybrid, PromptScoringComputesItsRows) {
  // A request that scores its prompt gets every row even when a checkpoint covers part of
  // it, and the same log-probabilities as without the cache.
  OneThread one;
  Model& model = testing_support::hybrid_model();
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 60; ++i) prompt.push_back(5 + (i * 37) % 250);
  auto run = [&](bool cache) {
    EngineConfig c = base_config();
    c.enable_prefix_cache = cache;
    EngineCore core(model, c);
    std::vector<Event> events;
    for (int i = 0; i < 2; ++i) {
      Request r;
      r.prompt_ids = prompt;
      r.max_tokens = 4;
      r.prompt_logprobs = i == 0 ? -1 : 1;  // the first fills the cache, the second scores
      core.add_request(r, [&](const Event& e) { events.push_back(e); });
      while (core.has_work()) core.step();
    }
    return events;
  };
  const auto with = run(true), without = run(false);
  ASSERT_EQ(with.size(), without.size());
  for (size_t i = 0; i < with.size(); ++i) {
    EXPECT_EQ(with[i].token, without[i].token);
    ASSERT_EQ(with[i].prompt_logprobs.has_value(), without[i].prompt_logprobs.has_value());
    if (!with[i].prompt_logprobs) continue;
    ASSERT_EQ(with[i].prompt_logprobs->size(), without[i].prompt_logprobs->size());
    for (size_t j = 0; j < with[i].prompt_logprobs->size(); ++j) {
      EXPECT_NEAR((*with[i].prompt_logprobs)[j].sampled.logprob, (*without[i].prompt_logprobs)[j].sampled.logprob,
                  1e-4);
    }
  }
}

TEST(PrefixCacheHybrid, CheckpointsCountInTheBudget) {
  OneThread one;
  Model& model = testing_support::hybrid_model();
  EngineCore core(model, base_config());
  Request r;
  for (int32_t i = 0; i < 100; ++i) r.prompt_ids.push_back(4 + i);
  r.max_tokens = 20;
  r.ignore_eos = true;
  core.add_request(r, nullptr);
  while (core.has_work()) core.step();
  const EngineStats s = core.stats();
  // Checkpoints at 32 and 64 (interval), 96 (end of prompt), and the deepest while decoding (112).
  EXPECT_EQ(s.checkpoints_cached, 4);
  EXPECT_EQ(s.checkpoint_bytes, 4 * model.state_shape().bytes());
  EXPECT_EQ(s.kv_blocks_reserved, (s.checkpoint_bytes + s.kv_bytes_per_block - 1) / s.kv_bytes_per_block);
  EXPECT_EQ(s.kv_blocks_used, 0);
}

TEST(PrefixCacheHybrid, BlockAlignedPromptSentAgainResumesBeforeItsLastBlock) {
  // A prompt of exactly 3 blocks sent twice: the second resumes from the checkpoint at the
  // last block boundary before the end (the one at the end is out of reach: the last token
  // is always computed for its logits), recomputes the last block, and answers the same.
  OneThread one;
  Model& model = testing_support::hybrid_model();
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 48; ++i) prompt.push_back(7 + (i * 29) % 250);
  auto run = [&](bool cache) {
    EngineConfig c = base_config();
    c.enable_prefix_cache = cache;
    c.prefix_checkpoint_interval = 0;  // only the prompt's own checkpoints
    EngineCore core(model, c);
    std::vector<Turn> turns;
    for (int i = 0; i < 2; ++i) {
      Request r;
      r.prompt_ids = prompt;
      r.max_tokens = 8;
      r.ignore_eos = true;
      Turn turn;
      core.add_request(r, [&](const Event& e) {
        if (!e.is_final()) {
          turn.tokens.push_back(e.token);
        } else {
          turn.cached_tokens = e.usage.cached_tokens;
        }
      });
      while (core.has_work()) core.step();
      turns.push_back(turn);
    }
    return std::make_pair(turns, core.stats());
  };
  const auto [with, stats] = run(true);
  const auto [without, unused] = run(false);
  ASSERT_EQ(with.size(), 2u);
  EXPECT_EQ(with[0].tokens, without[0].tokens);
  EXPECT_EQ(with[1].tokens, without[1].tokens);
  EXPECT_EQ(with[1].tokens, with[0].tokens);
  EXPECT_EQ(with[0].cached_tokens, 0);
  EXPECT_EQ(with[1].cached_tokens, 32);
  EXPECT_EQ(stats.checkpoint_hits, 1);
}
