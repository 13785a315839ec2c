// The engine on the real trained stories260K: batched, preempted and prefix-cached runs
// must give exactly the greedy tokens of a lone SequenceRunner (an independent path:
// no scheduler, one sequence, its own block table).
#include <gtest/gtest.h>

#include <unistd.h>
#include <fstream>
#include <map>
#include <random>

#include "../test_support.h"
#include "greedy_reference.h"
#include "infera/base/timer.h"
#include "infera/runtime/engine.h"
#include "infera/runtime/sequence_runner.h"

using namespace infera;

namespace {

const std::string kModelDir = test::stories_dir();

Model& stories() {
  static std::unique_ptr<Model> model = [] {
    LoadOptions o;
    o.max_batch_tokens = 2048;
    return load_model(kModelDir, o);
  }();
  return *model;
}

// BOS followed by random ordinary pieces.
std::vector<int32_t> prompt_of(std::mt19937& rng, int32_t n) {
  std::uniform_int_distribution<int32_t> d(259, 511);
  std::vector<int32_t> p{1};
  while (static_cast<int32_t>(p.size()) < n) p.push_back(d(rng));
  return p;
}

std::vector<int32_t> solo_greedy(const std::vector<int32_t>& prompt, int32_t n) {
  return testing_support::greedy_alone(stories(), prompt, n);
}

struct Outputs {
  std::map<RequestId, std::vector<int32_t>> tokens;
  std::map<RequestId, Event> finals;
};

EngineConfig base_config() {
  EngineConfig c;
  c.kv_cache_bytes = 64 << 20;
  c.block_size = 16;
  c.max_batch_tokens = 256;
  c.max_num_seqs = 16;
  c.prefill_chunk = 64;
  return c;
}

}  // namespace

TEST(EngineStories, BatchedGreedyEqualsSoloWithStaggeredArrivals) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  std::mt19937 rng(21);
  const std::vector<int32_t> lengths = {1, 5, 40, 130, 150, 17, 64, 90};
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t n : lengths) prompts.push_back(prompt_of(rng, n));
  const int32_t gen = 32;
  EngineCore core(stories(), base_config());
  Outputs run;
  auto add = [&](size_t i) {
    Request r;
    r.prompt_ids = prompts[i];
    r.max_tokens = gen;
    return core.add_request(r, [&](const Event& e) {
      if (e.is_final())
        run.finals[e.id] = e;
      else
        run.tokens[e.id].push_back(e.token);
    });
  };
  std::vector<RequestId> ids;
  for (size_t i = 0; i < 4; ++i) ids.push_back(add(i));
  size_t next = 4;
  int steps = 0;
  while (core.has_work()) {
    core.step();
    if (next < prompts.size() && ++steps % 3 == 0) ids.push_back(add(next++));
  }
  ASSERT_EQ(next, prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(run.tokens[ids[i]], solo_greedy(prompts[i], gen)) << "prompt " << i << " of " << lengths[i] << " tokens";
    EXPECT_EQ(run.finals[ids[i]].finish, FinishReason::kLength);
  }
  EXPECT_EQ(core.stats().kv_blocks_used, 0);
}

TEST(EngineStories, TightKvBudgetPreemptsAndStillMatches) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  EngineConfig c = base_config();
  const int64_t block_bytes = stories().kv_shape(16).num_layers * 2 * 16 * 4 * 8 * 4;
  c.kv_cache_bytes = 16 * block_bytes;  // 256 tokens for ~4 x 125
  c.enable_prefix_cache = false;
  EngineCore core(stories(), c);
  ASSERT_EQ(core.stats().kv_blocks_total, 16);
  std::mt19937 rng(22);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(prompt_of(rng, 60 + 10 * i));
  Outputs run;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    Request r;
    r.prompt_ids = p;
    r.max_tokens = 50;
    ids.push_back(core.add_request(r, [&](const Event& e) {
      if (e.is_final())
        run.finals[e.id] = e;
      else
        run.tokens[e.id].push_back(e.token);
    }));
  }
  while (core.has_work()) core.step();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(run.tokens[ids[i]], solo_greedy(prompts[i], 50)) << "prompt " << i;
  }
  EXPECT_GT(core.stats().preemptions, 0);
  EXPECT_EQ(core.stats().kv_blocks_used, 0);
}

TEST(EngineStories, SharedPrefixSkipsCachedTokensWithSameOutput) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  std::mt19937 rng(23);
  const auto shared = prompt_of(rng, 200);
  auto a = shared, b = shared;
  for (int i = 0; i < 10; ++i) a.push_back(300 + i);
  for (int i = 0; i < 25; ++i) b.push_back(400 + i);
  EngineCore core(stories(), base_config());
  Outputs run;
  auto add = [&](const std::vector<int32_t>& p) {
    Request r;
    r.prompt_ids = p;
    r.max_tokens = 30;
    return core.add_request(r, [&](const Event& e) {
      if (e.is_final())
        run.finals[e.id] = e;
      else
        run.tokens[e.id].push_back(e.token);
    });
  };
  add(a);
  while (core.has_work()) core.step();
  const int64_t computed_a = core.stats().prompt_tokens_computed;
  const RequestId idb = add(b);
  while (core.has_work()) core.step();
  const int64_t computed_b = core.stats().prompt_tokens_computed - computed_a;
  const int32_t cached = 200 / 16 * 16;  // 192: whole blocks of the shared part
  EXPECT_EQ(run.finals[idb].usage.cached_tokens, cached);
  EXPECT_EQ(computed_b, static_cast<int64_t>(b.size()) - cached);
  EXPECT_EQ(core.stats().prefix_hit_blocks, cached / 16);
  EXPECT_EQ(run.tokens[idb], solo_greedy(b, 30));
}

TEST(EngineStories, CancelMidGenerationFreesEveryBlock) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  Engine engine(stories(), base_config());
  std::mt19937 rng(24);
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.prompt_ids = prompt_of(rng, 50 + 20 * i);
    r.max_tokens = 400;
    handles.push_back(engine.submit(r));
  }
  for (auto& h : handles) h.stream->next();  // each has produced a token
  EXPECT_GT(engine.stats().kv_blocks_used, 0);
  for (auto& h : handles) EXPECT_TRUE(engine.cancel(h.id));
  for (auto& h : handles) {
    Event e;
    do e = h.stream->next();
    while (!e.is_final());
    EXPECT_EQ(e.finish, FinishReason::kCancelled);
    EXPECT_LT(e.usage.completion_tokens, 400);
  }
  engine.wait_idle();
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  EXPECT_EQ(engine.stats().running, 0);
}

TEST(EngineStories, LongContextMemoryFollowsUsedTokens) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  // KV reserved for 128K tokens (160 MiB for this model), 4K used: resident memory must
  // grow by about 4K tokens' worth (5 MiB). Positions past the model's 512 extrapolate RoPE,
  // which is fine for a memory test but needs the explicit option.
  EngineConfig c = base_config();
  c.max_context = 128 * 1024;
  c.allow_context_beyond_model = true;
  c.max_batch_tokens = 1024;
  c.prefill_chunk = 1024;
  const int64_t per_token = stories().kv_shape(16).num_layers * 2 * 4 * 8 * 4;
  c.kv_cache_bytes = per_token * 128 * 1024;
  const int64_t before = test::resident_bytes();
  EngineCore core(stories(), c);
  EXPECT_EQ(core.kv_capacity_tokens(), 128 * 1024);
  std::mt19937 rng(25);
  const int32_t used = 4 * 1024;
  Request r;
  r.prompt_ids = prompt_of(rng, used - 8);
  r.max_tokens = 8;
  std::optional<Event> fin;
  core.add_request(r, [&](const Event& e) {
    if (e.is_final()) fin = e;
  });
  Timer t;
  while (core.has_work()) core.step();
  ASSERT_TRUE(fin);
  EXPECT_EQ(fin->usage.completion_tokens, 8);
  const int64_t growth = (test::resident_bytes() - before) / test::kResidentBytesPerByte;
  const int64_t used_bytes = used * per_token;
  RecordProperty("prefill_seconds", std::to_string(t.seconds()));
  EXPECT_GT(growth, used_bytes / 2);
  EXPECT_LT(growth, used_bytes * 3);
  EXPECT_LT(growth, core.kv_pool().reserved_bytes() / 4);
}
