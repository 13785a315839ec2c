// EngineCore and Engine on ProbeModel: scheduling, preemption, prefix caching,
// cancellation, admission errors, resident memory. (Real-model runs: engine_model_test.cpp.)
#include <gtest/gtest.h>

#include <unistd.h>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <thread>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/runtime/engine.h"
#include "probe_model.h"

using namespace infera;
using infera::testing::probe_generate;
using infera::testing::ProbeModel;

namespace {

constexpr int32_t kVocab = 64;

std::vector<int32_t> random_prompt(std::mt19937& rng, int32_t n) {
  std::uniform_int_distribution<int32_t> d(0, kVocab - 1);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = d(rng);
  return p;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::optional<Event> final_event;
};

// Drives an EngineCore and collects each request's events.
struct Harness {
  Harness(Model& model, const EngineConfig& config) : core(model, config) {}
  RequestId add(std::vector<int32_t> prompt, int32_t max_tokens, std::vector<int32_t> stop = {}) {
    Request r;
    r.prompt_ids = std::move(prompt);
    r.max_tokens = max_tokens;
    r.stop_token_ids = std::move(stop);
    return core.add_request(std::move(r), [this](const Event& e) {
      EXPECT_FALSE(out[e.id].final_event.has_value()) << "event after the final one";
      if (e.is_final())
        out[e.id].final_event = e;
      else
        out[e.id].tokens.push_back(e.token);
    });
  }
  int run(int max_steps = 100000) {
    int steps = 0;
    while (core.has_work() && steps < max_steps) {
      core.step();
      ++steps;
    }
    return steps;
  }
  EngineCore core;
  std::map<RequestId, Collected> out;
};

EngineConfig small_config() {
  EngineConfig c;
  c.block_size = 4;
  c.kv_cache_bytes = int64_t{1} << 20;
  c.max_batch_tokens = 32;
  c.max_num_seqs = 8;
  c.prefill_chunk = 8;
  return c;
}

}  // namespace

TEST(EngineCore, BatchedSequencesMatchTheirSoloContinuation) {
  ProbeModel model(kVocab);
  Harness h(model, small_config());
  std::mt19937 rng(1);
  std::map<RequestId, std::vector<int32_t>> expected;
  std::vector<std::pair<std::vector<int32_t>, int32_t>> later;
  for (int i = 0; i < 12; ++i) {
    // Very different lengths: 1 token up to several prefill chunks.
    const int32_t len = i % 3 == 0 ? 1 + i : 20 + 7 * i;
    later.emplace_back(random_prompt(rng, len), 5 + i);
  }
  // Half arrive before the first step, the rest one per step while others decode.
  size_t next = 0;
  for (; next < 6; ++next) {
    const RequestId id = h.add(later[next].first, later[next].second);
    expected[id] = probe_generate(later[next].first, later[next].second, kVocab);
  }
  while (h.core.has_work()) {
    h.core.step();
    if (next < later.size()) {
      const RequestId id = h.add(later[next].first, later[next].second);
      expected[id] = probe_generate(later[next].first, later[next].second, kVocab);
      ++next;
    }
  }
  ASSERT_EQ(h.out.size(), expected.size());
  for (const auto& [id, want] : expected) {
    ASSERT_TRUE(h.out[id].final_event) << id;
    EXPECT_EQ(h.out[id].tokens, want) << "request " << id;
    EXPECT_EQ(h.out[id].final_event->finish, FinishReason::kLength);
    EXPECT_EQ(h.out[id].final_event->usage.completion_tokens, static_cast<int32_t>(want.size()));
  }
  const EngineStats s = h.core.stats();
  EXPECT_EQ(s.preemptions, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.running + s.waiting, 0);
  EXPECT_LE(model.max_chunk_tokens, 8);  // prefill_chunk honoured
  EXPECT_EQ(s.tokens_computed, model.tokens_fed);
  // Continuous batching really batched: far fewer forwards than tokens.
  EXPECT_LT(model.num_forwards * 3, model.tokens_fed);
}

TEST(EngineCore, StepPacksDecodesAndPrefillChunksWithinLimits) {
  ProbeModel model(kVocab);
  EngineConfig c = small_config();
  c.enable_prefix_cache = false;
  Harness h(model, c);
  std::mt19937 rng(2);
  for (int i = 0; i < 3; ++i) h.add(random_prompt(rng, 3), 50);
  h.core.step();  // three 3-token prefills
  EXPECT_EQ(model.tokens_fed, 9);
  h.add(random_prompt(rng, 100), 2);
  h.core.step();  // three decodes + an 8-token chunk of the long prompt
  EXPECT_EQ(model.tokens_fed, 9 + 3 + 8);
  for (int i = 0; i < 8; ++i) h.add(random_prompt(rng, 3), 2);
  h.core.step();
  // Capped by max_num_seqs (8): 4 of the new ones join, 4 wait.
  EXPECT_EQ(h.core.stats().running, 8);
  EXPECT_EQ(h.core.stats().waiting, 4);
  EXPECT_EQ(model.tokens_fed, 20 + 3 + 8 + 4 * 3);
  for (int i = 0; i < 8; ++i) h.add(random_prompt(rng, 40), 2);
  for (int i = 0; i < 5; ++i) {
    const int64_t before = model.tokens_fed;
    h.core.step();
    EXPECT_LE(model.tokens_fed - before, 32);  // max_batch_tokens
    EXPECT_LE(h.core.stats().running, 8);
  }
}

TEST(EngineCore, PreemptsNewestWhenBlocksRunOutAndOutputsStayIdentical) {
  ProbeModel model(kVocab);
  EngineConfig c = small_config();
  c.kv_cache_bytes = 24 * ProbeModel(kVocab).kv_shape(4).num_layers * 2 * 4 * 2 * 4;  // 24 blocks = 96 tokens
  for (bool prefix_cache : {false, true}) {
    c.enable_prefix_cache = prefix_cache;
    Harness h(model, c);
    ASSERT_EQ(h.core.stats().kv_blocks_total, 24);
    std::mt19937 rng(3);
    std::map<RequestId, std::vector<int32_t>> expected;
    for (int i = 0; i < 6; ++i) {
      auto p = random_prompt(rng, 10 + 3 * i);
      const int32_t n = 40;  // 6 x ~60 tokens >> 96 tokens of KV
      const RequestId id = h.add(p, n);
      expected[id] = probe_generate(p, n, kVocab);
    }
    h.run();
    for (const auto& [id, want] : expected) {
      ASSERT_TRUE(h.out[id].final_event);
      EXPECT_EQ(h.out[id].tokens, want) << "request " << id << " prefix cache " << prefix_cache;
    }
    const EngineStats s = h.core.stats();
    EXPECT_GT(s.preemptions, 0);
    EXPECT_GT(s.recomputed_tokens, 0);
    EXPECT_EQ(s.kv_blocks_used, 0);
  }
}

TEST(EngineCore, SharedPrefixReusesCachedBlocks) {
  ProbeModel model(kVocab);
  EngineConfig c = small_config();
  std::mt19937 rng(4);
  const auto shared = random_prompt(rng, 50);  // 12 full blocks of 4 + 2 tokens
  auto a = shared, b = shared;
  for (int32_t t : random_prompt(rng, 7)) a.push_back(t);
  for (int32_t t : random_prompt(rng, 9)) b.push_back(t);

  std::vector<int32_t> out_cached, out_plain;
  for (bool prefix_cache : {true, false}) {
    c.enable_prefix_cache = prefix_cache;
    Harness h(model, c);
    h.add(a, 6);
    h.run();
    const int64_t computed_a = h.core.stats().prompt_tokens_computed;
    EXPECT_EQ(computed_a, static_cast<int64_t>(a.size()));
    const RequestId idb = h.add(b, 6);
    h.run();
    const EngineStats s = h.core.stats();
    const int64_t computed_b = s.prompt_tokens_computed - computed_a;
    ASSERT_TRUE(h.out[idb].final_event);
    if (prefix_cache) {
      EXPECT_EQ(computed_b, static_cast<int64_t>(b.size()) - 48);
      EXPECT_EQ(h.out[idb].final_event->usage.cached_tokens, 48);
      EXPECT_GE(s.prefix_hit_blocks, 12);
      EXPECT_GT(s.kv_blocks_cached, 0);  // kept after both finished
      out_cached = h.out[idb].tokens;
    } else {
      EXPECT_EQ(computed_b, static_cast<int64_t>(b.size()));
      EXPECT_EQ(h.out[idb].final_event->usage.cached_tokens, 0);
      EXPECT_EQ(s.prefix_hit_blocks, 0);
      out_plain = h.out[idb].tokens;
    }
    EXPECT_EQ(s.kv_blocks_used, 0);
  }
  EXPECT_EQ(out_cached, out_plain);
  EXPECT_EQ(out_cached, probe_generate(b, 6, kVocab));
}

TEST(EngineCore, IdenticalPromptsKeepTheLastTokenToCompute) {
  ProbeModel model(kVocab);
  Harness h(model, small_config());
  std::mt19937 rng(5);
  const auto p = random_prompt(rng, 16);  // exactly 4 full blocks
  h.add(p, 3);
  h.run();
  const RequestId id = h.add(p, 3);
  h.run();
  EXPECT_EQ(h.out[id].tokens, probe_generate(p, 3, kVocab));
  EXPECT_EQ(h.out[id].final_event->usage.cached_tokens, 12);  // 3 blocks: the 4th holds the last token
}

TEST(EngineCore, ConcurrentSequencesShareBlocksSafely) {
  ProbeModel model(kVocab);
  Harness h(model, small_config());
  std::mt19937 rng(6);
  const auto system = random_prompt(rng, 33);
  h.add(system, 2);
  h.run();  // caches the system prompt
  std::map<RequestId, std::vector<int32_t>> expected;
  for (int i = 0; i < 6; ++i) {
    auto p = system;
    for (int32_t t : random_prompt(rng, 1 + i)) p.push_back(t);
    const RequestId id = h.add(p, 20);
    expected[id] = probe_generate(p, 20, kVocab);
  }
  h.run();
  for (const auto& [id, want] : expected) EXPECT_EQ(h.out[id].tokens, want);
  EXPECT_GE(h.core.stats().prefix_hit_blocks, 6 * 8);
}

TEST(EngineCore, CancelFreesEveryBlock) {
  ProbeModel model(kVocab);
  Harness h(model, small_config());
  std::mt19937 rng(7);
  const RequestId a = h.add(random_prompt(rng, 30), 100);
  const RequestId b = h.add(random_prompt(rng, 30), 100);
  for (int i = 0; i < 10; ++i) h.core.step();
  EXPECT_GT(h.core.stats().kv_blocks_used, 0);
  EXPECT_TRUE(h.core.cancel(a));
  EXPECT_FALSE(h.core.cancel(a));
  EXPECT_TRUE(h.core.cancel(b));
  EXPECT_FALSE(h.core.cancel(12345));
  EXPECT_EQ(h.core.stats().kv_blocks_used, 0);
  EXPECT_FALSE(h.core.has_work());
  ASSERT_TRUE(h.out[a].final_event);
  EXPECT_EQ(h.out[a].final_event->finish, FinishReason::kCancelled);
  EXPECT_GT(h.out[a].final_event->usage.completion_tokens, 0);
  // A waiting request can be cancelled too.
  const RequestId c = h.add(random_prompt(rng, 5), 5);
  EXPECT_TRUE(h.core.cancel(c));
  EXPECT_EQ(h.out[c].final_event->finish, FinishReason::kCancelled);
}

TEST(EngineCore, StopTokensAndMinTokens) {
  ProbeModel model(kVocab);
  Harness h(model, small_config());
  std::mt19937 rng(8);
  const auto p = random_prompt(rng, 9);
  const auto full = probe_generate(p, 30, kVocab);
  const int32_t stop = full[4];
  const size_t first = std::find(full.begin(), full.end(), stop) - full.begin();
  const RequestId id = h.add(p, 30, {stop});
  h.run();
  ASSERT_TRUE(h.out[id].final_event);
  EXPECT_EQ(h.out[id].final_event->finish, FinishReason::kStop);
  EXPECT_EQ(h.out[id].final_event->stop_token, stop);
  EXPECT_EQ(h.out[id].tokens, std::vector<int32_t>(full.begin(), full.begin() + first));
  EXPECT_EQ(h.out[id].final_event->usage.completion_tokens, static_cast<int32_t>(first) + 1);

  Request r;
  r.prompt_ids = p;
  r.max_tokens = 30;
  r.stop_token_ids = {stop};
  r.min_tokens = static_cast<int32_t>(first) + 1;
  std::vector<int32_t> got;
  h.core.add_request(r, [&](const Event& e) {
    if (!e.is_final()) got.push_back(e.token);
  });
  h.run();
  EXPECT_GT(got.size(), first);  // the early stop token was passed over
}

TEST(EngineCore, RejectsRequestsThatCanNeverFit) {
  ProbeModel model(kVocab, /*max_positions=*/200);
  EngineConfig c = small_config();
  c.kv_cache_bytes = 10 * 2 * 2 * 4 * 2 * 4;  // 10 blocks of 4 = 40 tokens
  Harness h(model, c);
  auto expect_error = [&](Request r, const std::string& fragment) {
    try {
      h.core.add_request(std::move(r), nullptr);
      ADD_FAILURE() << "accepted; expected: " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  Request r;
  r.prompt_ids = std::vector<int32_t>(30, 1);
  r.max_tokens = 20;
  expect_error(r, "lower max_tokens to at most 10");
  r.prompt_ids = std::vector<int32_t>(40, 1);
  r.max_tokens = -1;
  expect_error(r, "--kv-cache-memory");
  r.prompt_ids = {};
  expect_error(r, "empty");
  r.prompt_ids = {1, kVocab};
  expect_error(r, "outside the model's vocabulary");
  r.prompt_ids = {1};
  r.sampling.top_p = 0;
  expect_error(r, "top_p");
  EXPECT_FALSE(h.core.has_work());
  // -1 resolves to the room left.
  r.sampling.top_p = 1;
  r.prompt_ids = std::vector<int32_t>(30, 1);
  std::optional<Event> fin;
  h.core.add_request(r, [&](const Event& e) {
    if (e.is_final()) fin = e;
  });
  h.run();
  ASSERT_TRUE(fin);
  EXPECT_EQ(fin->finish, FinishReason::kLength);
  EXPECT_EQ(fin->usage.completion_tokens, 10);

  // Context beyond the model's positions needs the explicit option.
  EngineConfig big = small_config();
  big.max_context = 1000;
  EXPECT_THROW(EngineCore(model, big), Error);
  big.allow_context_beyond_model = true;
  EngineCore ok(model, big);
  EXPECT_EQ(ok.max_context(), 1000);
  EngineConfig tiny = small_config();
  tiny.kv_cache_bytes = 10;
  EXPECT_THROW(EngineCore(model, tiny), Error);
}

TEST(EngineCore, ResidentMemoryFollowsUsedTokensNotTheBudget) {
  // 1 KiB of KV per token; a budget for 128K tokens (128 MiB) reserved, 16K used.
  ProbeModel model(kVocab, 1 << 17, /*num_layers=*/2, /*n_kv_heads=*/4, /*head_dim=*/16);
  EngineConfig c;
  c.block_size = 16;
  c.max_batch_tokens = 4096;
  c.prefill_chunk = 4096;
  c.max_context = 1 << 17;
  c.kv_cache_bytes = int64_t{1024} << 17;
  const int64_t before = test::resident_bytes();
  Harness h(model, c);
  EXPECT_EQ(h.core.kv_capacity_tokens(), 1 << 17);
  const int64_t reserved = h.core.kv_pool().reserved_bytes();
  EXPECT_EQ(reserved, int64_t{128} << 20);
  std::mt19937 rng(9);
  const int32_t used = 16 * 1024;
  const auto p = random_prompt(rng, used - 4);
  const RequestId id = h.add(p, 4);
  h.run();
  EXPECT_EQ(h.out[id].tokens, probe_generate(p, 4, kVocab));
  const int64_t growth = (test::resident_bytes() - before) / test::kResidentBytesPerByte;
  const int64_t used_bytes = int64_t{used} * 1024;
  EXPECT_GT(growth, used_bytes / 2);
  EXPECT_LT(growth, used_bytes * 2);
  EXPECT_LT(growth, reserved / 4);
}

TEST(EngineCore, LongContext112K) {
  // A 112K-token sequence through paged blocks (7K block-table entries), every position
  // checked on read back. Tiny KV rows keep it fast.
  ProbeModel model(kVocab, 1 << 17, 1, 1, 2);
  EngineConfig c;
  c.block_size = 16;
  c.max_batch_tokens = 8192;
  c.prefill_chunk = 8192;
  c.kv_cache_bytes = int64_t{16} << 17;  // 128K tokens
  Harness h(model, c);
  std::mt19937 rng(10);
  const auto p = random_prompt(rng, 112 * 1024);
  const RequestId id = h.add(p, 3);
  h.run();
  EXPECT_EQ(h.out[id].tokens, probe_generate(p, 3, kVocab));
  EXPECT_EQ(h.out[id].final_event->usage.prompt_tokens, 112 * 1024);
}

TEST(Engine, ThreadedSubmitStreamsAndCancel) {
  ProbeModel model(kVocab);
  EngineConfig c = small_config();
  Engine engine(model, c);
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(random_prompt(rng, 5 + 9 * i));
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      Request r;
      r.prompt_ids = prompts[i];
      r.max_tokens = 12;
      RequestHandle hd = engine.submit(r);
      for (const Event& e : hd.stream->drain()) {
        EXPECT_EQ(e.id, hd.id);
        if (!e.is_final())
          got[i].push_back(e.token);
        else
          EXPECT_EQ(e.finish, FinishReason::kLength);
      }
    });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], probe_generate(prompts[i], 12, kVocab));

  // Cancel from another thread mid-generation. The engine thread is held inside the
  // first token's callback until the cancel has been issued, so the request can not run
  // to its length limit first, however the threads are scheduled.
  Request r;
  r.prompt_ids = random_prompt(rng, 10);
  r.max_tokens = 200;
  std::promise<void> first_token, cancelled;
  std::shared_future<void> cancelled_f = cancelled.get_future().share();
  std::promise<Event> final_event;
  bool first = true;
  const RequestId id = engine.submit(r, [&](const Event& ev) {
    if (ev.is_final()) {
      final_event.set_value(ev);
    } else if (first) {
      first = false;
      first_token.set_value();
      cancelled_f.wait();
    }
  });
  first_token.get_future().wait();  // generation has started
  EXPECT_TRUE(engine.cancel(id));
  cancelled.set_value();
  const Event e = final_event.get_future().get();
  EXPECT_EQ(e.finish, FinishReason::kCancelled);
  engine.wait_idle();
  EXPECT_FALSE(engine.cancel(id));
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.running + s.waiting, 0);
  EXPECT_EQ(s.requests_finished, 9);

  // Bad requests are refused synchronously.
  r.prompt_ids = {};
  EXPECT_THROW(engine.submit(r), Error);
}

TEST(Engine, DestructorCancelsUnfinishedRequests) {
  ProbeModel model(kVocab);
  std::vector<Event> finals;
  std::mutex m;
  {
    Engine engine(model, small_config());
    for (int i = 0; i < 4; ++i) {
      Request r;
      r.prompt_ids = {1, 2, 3};
      r.max_tokens = 1000;
      // Each token takes a millisecond to consume, so 1000 tokens can not finish before
      // the destructor cancels, however the threads are scheduled.
      engine.submit(r, [&](const Event& e) {
        if (e.is_final()) {
          std::lock_guard lock(m);
          finals.push_back(e);
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      });
    }
  }
  ASSERT_EQ(finals.size(), 4u);
  for (const Event& e : finals) EXPECT_EQ(e.finish, FinishReason::kCancelled);
}
