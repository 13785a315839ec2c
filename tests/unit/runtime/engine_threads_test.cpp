// Per-engine kernel threads: two engines in one process, configured with different
// EngineConfig::threads, each run their forwards with their own OpenMP team size.
#include <gtest/gtest.h>

#include <omp.h>

#include <mutex>
#include <set>
#include <thread>

#include "infera/base/threads.h"
#include "infera/runtime/engine.h"
#include "probe_model.h"

using namespace infera;
using infera::testing::ProbeModel;

namespace {

// ProbeModel whose forward first runs a parallel region sized the way every kernel in
// src/infera sizes its own (`#pragma omp parallel ... num_threads(num_threads())`) and
// records the team size OpenMP actually gave it.
class TeamSizeModel : public ProbeModel {
 public:
  void forward(const ForwardBatch& batch, KvPool& kv, float* logits) override {
    int team = 0;
#pragma omp parallel num_threads(num_threads())
    {
#pragma omp single
      team = omp_get_num_threads();
    }
    {
      std::lock_guard lock(mutex_);
      team_sizes_.insert(team);
    }
    ProbeModel::forward(batch, kv, logits);
  }
  std::set<int> team_sizes() const {
    std::lock_guard lock(mutex_);
    return team_sizes_;
  }

 private:
  mutable std::mutex mutex_;
  std::set<int> team_sizes_;
};

EngineConfig config_with_threads(int32_t threads) {
  EngineConfig c;
  c.block_size = 4;
  c.kv_cache_bytes = int64_t{1} << 20;
  c.max_batch_tokens = 32;
  c.max_num_seqs = 4;
  c.prefill_chunk = 8;
  c.threads = threads;
  return c;
}

void generate(Engine& engine, int32_t first_token) {
  Request r;
  r.prompt_ids = {first_token, 2, 3};
  r.max_tokens = 12;
  RequestHandle h = engine.submit(std::move(r));
  const std::vector<Event> events = h.stream->drain();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().finish, FinishReason::kLength);
}

}  // namespace

TEST(EngineThreads, EachEngineRunsItsKernelsWithItsOwnThreadCount) {
  const int process_wide = num_threads();
  TeamSizeModel one_model, three_model;
  {
    Engine one(one_model, config_with_threads(1));
    Engine three(three_model, config_with_threads(3));
    // Both engines generate at the same time, from two client threads.
    std::thread a([&] {
      for (int i = 0; i < 3; ++i) generate(one, 1 + i);
    });
    std::thread b([&] {
      for (int i = 0; i < 3; ++i) generate(three, 1 + i);
    });
    a.join();
    b.join();
  }
  EXPECT_EQ(one_model.team_sizes(), std::set<int>{1});
  EXPECT_EQ(three_model.team_sizes(), std::set<int>{3});
  // The override belongs to the engine threads: this thread's count is unchanged.
  EXPECT_EQ(num_threads(), process_wide);
}

TEST(EngineThreads, ZeroMeansTheProcessWideCount) {
  const int saved = num_threads();
  set_num_threads(2);
  TeamSizeModel model;
  {
    Engine engine(model, config_with_threads(0));
    generate(engine, 5);
  }
  EXPECT_EQ(model.team_sizes(), std::set<int>{2});
  set_num_threads(saved);
}

TEST(EngineThreads, ThreadOverrideIsPerThreadAndClears) {
  const int saved = num_threads();
  set_num_threads(2);
  int other_thread_count = 0;
  set_thread_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  std::thread([&] { other_thread_count = num_threads(); }).join();
  EXPECT_EQ(other_thread_count, 2);  // another thread sees the process-wide count
  set_thread_num_threads(0);
  EXPECT_EQ(num_threads(), 2);
  set_num_threads(saved);
}

TEST(EngineThreads, NegativeThreadsIsAConfigError) {
  TeamSizeModel model;
  EXPECT_THROW(Engine(model, config_with_threads(-1)), Error);
}
