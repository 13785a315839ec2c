// --kv-dtype end to end on the trained stories260K: bf16 and int8 KV caches against f32,
// and the engine's batching, preemption, prefix caching and speculative rollback over an
// int8 cache against a lone sequence on the same cache type.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <span>

#include "infera/runtime/engine.h"
#include "infera/runtime/sampler.h"
#include "infera/runtime/sequence_runner.h"
#include "test_models.h"

using namespace infera;

namespace {

Model& stories() { return testing_support::stories_model(); }

// A lone sequence on a cache of `dtype`.
struct Solo {
  std::unique_ptr<KvPool> kv;
  std::unique_ptr<BlockAllocator> blocks;
  std::unique_ptr<SequenceRunner> runner;
  Solo(DType dtype, int32_t chunk = 512) {
    KvPoolShape shape = stories().kv_shape(16);
    shape.num_blocks = 64;
    shape.dtype = dtype;
    kv = std::make_unique<KvPool>(shape);
    blocks = std::make_unique<BlockAllocator>(64);
    runner = std::make_unique<SequenceRunner>(stories(), *kv, *blocks, chunk);
  }
};

std::vector<int32_t> greedy(DType dtype, const std::vector<int32_t>& prompt, int32_t n) {
  Solo s(dtype);
  const int32_t vocab = stories().config().vocab_size;
  std::vector<int32_t> out;
  const float* logits = s.runner->feed(prompt);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t t = argmax(logits, vocab);
    out.push_back(t);
    if (i + 1 < n) logits = s.runner->feed(std::span<const int32_t>(&t, 1));
  }
  return out;
}

// Logits of every position of `tokens`, fed one token at a time (the decode path, split-K
// attention over the cache) or as one prefill chunk. [n, vocab]
std::vector<float> logits_of(DType dtype, const std::vector<int32_t>& tokens, bool decode) {
  Solo s(dtype);
  const int64_t vocab = stories().config().vocab_size;
  std::vector<float> all(tokens.size() * vocab);
  if (decode) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const float* l = s.runner->feed(std::span<const int32_t>(&tokens[i], 1));
      std::copy(l, l + vocab, all.begin() + i * vocab);
    }
  } else {
    const float* l = s.runner->feed(tokens, /*all_logits=*/true);
    std::copy(l, l + all.size(), all.begin());
  }
  return all;
}

struct Agreement {
  double top1 = 0;  // share of positions whose argmax equals f32's
  float max_abs_diff = 0;  // largest |logit - f32 logit|
  double mean_abs_diff = 0;  // mean |logit - f32 logit| over positions and vocabulary
  float max_logit_range = 0;  // largest max - min of f32 logits at one position
};

Agreement compare(const std::vector<float>& got, const std::vector<float>& want) {
  const int64_t vocab = stories().config().vocab_size;
  const int64_t n = static_cast<int64_t>(want.size()) / vocab;
  Agreement a;
  int64_t same = 0;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* g = got.data() + i * vocab;
    const float* w = want.data() + i * vocab;
    same += argmax(g, static_cast<int32_t>(vocab)) == argmax(w, static_cast<int32_t>(vocab));
    for (int64_t j = 0; j < vocab; ++j) {
      a.max_abs_diff = std::max(a.max_abs_diff, std::fabs(g[j] - w[j]));
      sum += std::fabs(g[j] - w[j]);
    }
    const auto [lo, hi] = std::minmax_element(w, w + vocab);
    a.max_logit_range = std::max(a.max_logit_range, *hi - *lo);
  }
  a.top1 = static_cast<double>(same) / n;
  a.mean_abs_diff = sum / (n * vocab);
  return a;
}

}  // namespace

// The golden prompt (BOS) of shared/models/stories260K/GOLDEN.md: greedy with a bf16 cache
// gives the same 200 tokens as f32 (the golden's smallest top-2 gap, 0.133, is far above
// the measured bf16 logit error).
TEST(KvDtypeStories, Bf16GreedyEqualsF32OnTheGoldenPrompt) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  const std::vector<int32_t> bos = {1};
  const std::vector<int32_t> f32 = greedy(DType::kF32, bos, 200);
  EXPECT_EQ(greedy(DType::kBF16, bos, 200), f32);
}

// Teacher-forced over the f32 greedy continuation (201 positions), so both caches see the
// same tokens: top-1 agreement and logit differences, through decode and prefill.
// Measured (scalar, AVX2 and AVX-512 alike): bf16 top-1 1.0, |dlogit| max 0.152, mean
// 0.018; int8 top-1 0.985 (3 of 201 positions, near-ties), |dlogit| max 1.08, mean 0.098;
// logit range ~37. stories260K is the hard case for int8: head_dim 8, so one scale covers
// only 8 values. Asserted with about 2x margin.
TEST(KvDtypeStories, LogitErrorOfBf16AndInt8CachesIsBounded) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  std::vector<int32_t> tokens = {1};
  const std::vector<int32_t> gen = greedy(DType::kF32, tokens, 200);
  tokens.insert(tokens.end(), gen.begin(), gen.end());
  for (bool decode : {true, false}) {
    const std::vector<float> want = logits_of(DType::kF32, tokens, decode);
    const Agreement bf16 = compare(logits_of(DType::kBF16, tokens, decode), want);
    const Agreement int8 = compare(logits_of(DType::kI8, tokens, decode), want);
    const char* path = decode ? "decode" : "prefill";
    std::printf(
        "[ measure  ] %s: bf16 top-1 %.4f |dlogit| max %.4f mean %.5f; int8 top-1 %.4f |dlogit| max %.4f mean "
        "%.5f; logit range %.2f\n",
        path, bf16.top1, bf16.max_abs_diff, bf16.mean_abs_diff, int8.top1, int8.max_abs_diff, int8.mean_abs_diff,
        bf16.max_logit_range);
    EXPECT_GE(bf16.top1, 0.99) << path;
    EXPECT_LE(bf16.max_abs_diff, 0.3f) << path;
    EXPECT_LE(bf16.mean_abs_diff, 0.04) << path;
    EXPECT_GE(int8.top1, 0.97) << path;
    EXPECT_LE(int8.max_abs_diff, 2.0f) << path;
    EXPECT_LE(int8.mean_abs_diff, 0.2) << path;
    // Quantization must be real (the int8 path does not silently run f32).
    EXPECT_GT(int8.max_abs_diff, 0.0f) << path;
    EXPECT_GT(int8.max_abs_diff, bf16.max_abs_diff) << path;
  }
}

// int8 rows are quantized per token, so a row never depends on what else is in the cache:
// batched, preempted and prefix-cached runs over an int8 cache give exactly the tokens of a
// lone int8 sequence, and n-gram speculation (rollback of rejected drafts) changes nothing.
TEST(KvDtypeStories, Int8EngineEqualsLoneInt8Sequence) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  std::mt19937 rng(31);
  std::uniform_int_distribution<int32_t> piece(259, 511);
  const std::vector<int32_t> shared_prefix = [&] {
    std::vector<int32_t> p{1};
    while (p.size() < 40) p.push_back(piece(rng));
    return p;
  }();
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t extra : {0, 3, 20, 50, 7}) {
    std::vector<int32_t> p = shared_prefix;
    for (int32_t i = 0; i < extra; ++i) p.push_back(piece(rng));
    prompts.push_back(p);
  }
  const int32_t gen = 40;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(greedy(DType::kI8, p, gen));

  KvPoolShape shape = stories().kv_shape(16);
  shape.dtype = DType::kI8;
  for (SpeculativeMethod method : {SpeculativeMethod::kNone, SpeculativeMethod::kNgram}) {
    EngineConfig c;
    c.kv_dtype = DType::kI8;
    c.kv_cache_bytes = 16 * shape.bytes_per_block();  // 256 tokens for 5 x ~110: preempts
    c.max_batch_tokens = 128;
    c.max_num_seqs = 8;
    c.prefill_chunk = 32;
    c.speculative.method = method;
    EngineCore core(stories(), c);
    ASSERT_EQ(core.stats().kv_blocks_total, 16);
    std::map<RequestId, std::vector<int32_t>> out;
    std::vector<RequestId> ids;
    for (const auto& p : prompts) {
      Request r;
      r.prompt_ids = p;
      r.max_tokens = gen;
      r.ignore_eos = true;
      ids.push_back(core.add_request(r, [&](const Event& e) {
        if (!e.is_final()) out[e.id].push_back(e.token);
      }));
    }
    while (core.has_work()) core.step();
    const char* what = speculative_method_name(method);
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(out[ids[i]], want[i]) << what << ": prompt " << i;
    const EngineStats st = core.stats();
    EXPECT_GT(st.preemptions, 0) << what;
    EXPECT_GT(st.prefix_hit_blocks, 0) << what;
    EXPECT_EQ(st.kv_blocks_used, 0) << what;
    if (method == SpeculativeMethod::kNgram) {
      EXPECT_GT(st.spec_drafted, 0);
    }
  }
}

// The same --kv-cache-memory holds 2x the tokens in bf16 and 4 hd / (hd + 4) x in int8
// (the f32 scale per token and head: 2.67x at stories260K's head_dim 8, 3.76x at 64).
TEST(KvDtypeStories, BudgetHoldsMoreBlocksWithSmallerDtypes) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  const KvPoolShape shape = stories().kv_shape(16);
  auto blocks_for = [&](DType dtype) {
    EngineConfig c;
    c.kv_cache_bytes = 8 << 20;
    c.kv_dtype = dtype;
    EngineCore core(stories(), c);
    return static_cast<double>(core.stats().kv_blocks_total);
  };
  const double f32 = blocks_for(DType::kF32), bf16 = blocks_for(DType::kBF16), int8 = blocks_for(DType::kI8);
  EXPECT_NEAR(bf16 / f32, 2.0, 0.01);
  const double hd = static_cast<double>(shape.head_dim);
  EXPECT_NEAR(int8 / f32, 4 * hd / (hd + 4), 0.01);
}
