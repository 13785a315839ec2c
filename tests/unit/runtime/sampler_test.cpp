#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "infera/runtime/sampler.h"

using namespace infera;

TEST(Sampler, GreedyPicksArgmax) {
  SamplingParams p;
  Sampler s(p, 5);
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
  EXPECT_EQ(s.sample(logits.data(), {}), 1);
}

TEST(Sampler, RepetitionPenaltyHfSemantics) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p, 4);
  std::vector<float> logits = {4.0f, -1.0f, 3.0f, 0.5f};
  std::vector<int32_t> hist = {0, 1, 0};
  s.apply_penalties(logits.data(), hist);
  EXPECT_FLOAT_EQ(logits[0], 2.0f);  // positive: divided (once, though seen twice)
  EXPECT_FLOAT_EQ(logits[1], -2.0f);  // negative: multiplied
  EXPECT_FLOAT_EQ(logits[2], 3.0f);
  // Greedy now picks token 2.
  std::vector<float> l2 = {4.0f, -1.0f, 3.0f, 0.5f};
  EXPECT_EQ(s.sample(l2.data(), hist), 2);
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, 3);
  std::vector<float> logits = {1.0f, 1.0f, 1.0f};
  std::vector<int32_t> hist = {0, 0, 0, 1};
  s.apply_penalties(logits.data(), hist);
  EXPECT_FLOAT_EQ(logits[0], 1.0f - 0.5f - 0.75f);
  EXPECT_FLOAT_EQ(logits[1], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[2], 1.0f);
}

TEST(Sampler, TopKTopPMinPTruncate) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 2;
    Sampler s(p, 4);
    auto c = s.candidates(logits.data());
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(c[0].first, 0);
    EXPECT_NEAR(c[0].second, 0.5f / 0.8f, 1e-6);
  }
  {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = 0.9f;  // 0.5 + 0.3 + 0.15 = 0.95 >= 0.9: three survive
    Sampler s(p, 4);
    EXPECT_EQ(s.candidates(logits.data()).size(), 3u);
  }
  {
    SamplingParams p;
    p.temperature = 1.0f;
    p.min_p = 0.5f;  // keep p >= 0.25
    Sampler s(p, 4);
    EXPECT_EQ(s.candidates(logits.data()).size(), 2u);
  }
}

TEST(Sampler, SeededSamplingIsReproducibleAndFollowsTheDistribution) {
  std::vector<float> base = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler a(p, 3), b(p, 3);
  std::map<int, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    auto la = base, lb = base;
    const int32_t ta = a.sample(la.data(), {});
    ASSERT_EQ(ta, b.sample(lb.data(), {}));
    ++counts[ta];
  }
  EXPECT_NEAR(counts[0] / double(n), 0.6, 0.02);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double(n), 0.1, 0.02);
  // A different seed gives a different stream.
  p.seed = 43;
  Sampler c(p, 3);
  Sampler d({.temperature = 1.0f, .seed = 42}, 3);
  int diff = 0;
  for (int i = 0; i < 200; ++i) {
    auto lc = base, ld = base;
    diff += c.sample(lc.data(), {}) != d.sample(ld.data(), {});
  }
  EXPECT_GT(diff, 10);
}

TEST(Sampler, LowTemperatureSharpens) {
  std::vector<float> logits = {1.0f, 0.0f};
  SamplingParams p;
  p.temperature = 0.1f;
  Sampler s(p, 2);
  auto c = s.candidates(logits.data());
  EXPECT_GT(c[0].second, 0.9999f);
}

// Checkpoints pad the output head past the tokenizer's vocabulary; those ids must never be
// picked (the detokenizer cannot turn them into text), greedy or sampled.
TEST(Sampler, NeverPicksIdsPastTheVocabLimit) {
  SamplingParams p;
  p.vocab_limit = 3;
  std::vector<float> logits = {0.0f, 1.0f, 0.5f, 50.0f, 60.0f};
  Sampler greedy(p, 5);
  EXPECT_EQ(greedy.sample(logits.data(), {}), 1);
  p.temperature = 1.0f;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    Sampler s(p, 5);
    std::vector<float> row = {0.0f, 1.0f, 0.5f, 50.0f, 60.0f};
    EXPECT_LT(s.sample(row.data(), {}), 3);
  }
}
