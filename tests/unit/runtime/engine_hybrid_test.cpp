// The engine on a hybrid (Gated DeltaNet) model: every running sequence gets its own
// recurrent-state slot, so batched, staggered and preempted (recomputed from position 0)
// greedy runs give exactly the tokens of a lone SequenceRunner. The model is a tiny random
// qwen3_5_moe from tools/gen_model.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>

#include "../test_support.h"
#include "greedy_reference.h"
#include "infera/runtime/engine.h"
#include "infera/runtime/sequence_runner.h"

using namespace infera;

namespace {

namespace fs = std::filesystem;

Model& hybrid() {
  static std::unique_ptr<Model> model = [] {
    const fs::path dir = fs::temp_directory_path() / ("infera_engine_hybrid_" + std::to_string(::getpid()));
    auto m = load_model(test::generate_model(dir, test::kTinyHybridArgs));
    std::error_code ec;
    fs::remove_all(dir, ec);  // the mapping stays valid after the files are unlinked
    return m;
  }();
  return *model;
}

std::vector<int32_t> prompt_of(std::mt19937& rng, int32_t n) {
  std::uniform_int_distribution<int32_t> d(3, 290);
  std::vector<int32_t> p;
  while (static_cast<int32_t>(p.size()) < n) p.push_back(d(rng));
  return p;
}

std::vector<int32_t> solo_greedy(const std::vector<int32_t>& prompt, int32_t n) {
  return testing_support::greedy_alone(hybrid(), prompt, n);
}

}  // namespace

TEST(EngineHybrid, BatchedAndPreemptedGreedyEqualSolo) {
  std::mt19937 rng(7);
  const std::vector<int32_t> lengths = {3, 70, 20, 45, 9};
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t n : lengths) prompts.push_back(prompt_of(rng, n));
  const int32_t gen = 24;
  std::vector<std::vector<int32_t>> expect;
  for (const auto& p : prompts) expect.push_back(solo_greedy(p, gen));

  for (bool tight : {false, true}) {
    EngineConfig c;
    c.block_size = 16;
    c.max_batch_tokens = 64;
    c.max_num_seqs = 4;
    c.prefill_chunk = 32;
    const int64_t block_bytes = hybrid().kv_shape(16).num_layers * 2 * 16 * 2 * 32 * 4;
    c.kv_cache_bytes = tight ? 12 * block_bytes : 64 * block_bytes;
    EngineCore core(hybrid(), c);
    std::map<RequestId, std::vector<int32_t>> tokens;
    std::vector<RequestId> ids;
    auto add = [&](size_t i) {
      Request r;
      r.prompt_ids = prompts[i];
      r.max_tokens = gen;
      ids.push_back(core.add_request(r, [&](const Event& e) {
        if (!e.is_final()) tokens[e.id].push_back(e.token);
      }));
    };
    for (size_t i = 0; i < 3; ++i) add(i);
    size_t next = 3;
    int steps = 0;
    while (core.has_work()) {
      core.step();
      if (next < prompts.size() && ++steps % 2 == 0) add(next++);
    }
    ASSERT_EQ(ids.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(tokens[ids[i]], expect[i]) << "prompt " << i << (tight ? " (tight KV)" : "");
    }
    if (tight) {
      EXPECT_GT(core.stats().preemptions, 0);
    }
  }
}
