// Speculative decoding building blocks: prompt-lookup drafting and the acceptance rule.
// The rule is checked statistically: tokens it emits must follow the target distribution p
// whatever the draft distribution q (chi-square on a tiny vocabulary).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "infera/runtime/speculative.h"

using namespace infera;

namespace {

// Pearson chi-square of observed counts against expected probabilities (cells with p == 0
// must stay empty: any count there fails the test outright).
double chi_square(const std::vector<int64_t>& counts, const std::vector<float>& p, int64_t n) {
  double x2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      if (counts[i] != 0) return 1e30;
      continue;
    }
    const double e = static_cast<double>(n) * p[i];
    x2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x2;
}

int32_t draw(const std::vector<float>& q, double u) {
  double cum = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    cum += q[i];
    if (u < cum) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(q.size()) - 1;
}

}  // namespace

TEST(NgramDraft, ProposesWhatFollowedTheMostRecentMatch) {
  std::vector<int32_t> out;
  // Tail "2 3" occurs at 1 and at 5; the most recent (5) is followed by 9 8.
  // "2 3" (2 tokens) matched: at most 2 drafts follow it.
  ngram_draft(std::vector<int32_t>{1, 2, 3, 4, 1, 2, 3, 9, 8, 2, 3}, 1, 3, 4, out);
  EXPECT_EQ(out, (std::vector<int32_t>{9, 8}));
  // Limited by max_draft.
  ngram_draft(std::vector<int32_t>{1, 2, 3, 4, 1, 2, 3, 9, 8, 2, 3}, 1, 3, 1, out);
  EXPECT_EQ(out, (std::vector<int32_t>{9}));
  // A 3-token match allows 3 drafts, a 4-gram limit 4.
  ngram_draft(std::vector<int32_t>{4, 1, 2, 3, 7, 8, 9, 6, 4, 1, 2, 3}, 1, 3, 8, out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 8, 9}));
  ngram_draft(std::vector<int32_t>{4, 1, 2, 3, 7, 8, 9, 6, 4, 1, 2, 3}, 1, 4, 8, out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 8, 9, 6}));
  // Limited by the end of the history.
  ngram_draft(std::vector<int32_t>{5, 6, 7, 1, 5, 6, 7}, 1, 3, 4, out);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 5, 6}));
  ngram_draft(std::vector<int32_t>{5, 6, 5, 6}, 1, 3, 4, out);
  EXPECT_EQ(out, (std::vector<int32_t>{5, 6}));
}

TEST(NgramDraft, LongerNgramWinsOverAMoreRecentShorterOne) {
  std::vector<int32_t> out;
  // "7 8 9" matches at 0 (followed by 1); the 1-gram "9" matches more recently at 5 (followed by 2).
  ngram_draft(std::vector<int32_t>{7, 8, 9, 1, 4, 9, 2, 7, 8, 9}, 1, 3, 1, out);
  EXPECT_EQ(out, (std::vector<int32_t>{1}));
  // With only 1-grams allowed, the most recent 9 wins.
  ngram_draft(std::vector<int32_t>{7, 8, 9, 1, 4, 9, 2, 7, 8, 9}, 1, 1, 1, out);
  EXPECT_EQ(out, (std::vector<int32_t>{2}));
}

TEST(NgramDraft, NothingWhenNoMatch) {
  std::vector<int32_t> out = {42};
  ngram_draft(std::vector<int32_t>{1, 2, 3, 4}, 1, 3, 4, out);
  EXPECT_TRUE(out.empty());
  ngram_draft(std::vector<int32_t>{1}, 1, 3, 4, out);
  EXPECT_TRUE(out.empty());
  ngram_draft(std::vector<int32_t>{}, 1, 3, 4, out);
  EXPECT_TRUE(out.empty());
  // min_ngram 2: a lone repeated token is not enough.
  ngram_draft(std::vector<int32_t>{3, 1, 2, 3}, 2, 3, 4, out);
  EXPECT_TRUE(out.empty());
}

TEST(SpeculativeAccept, EmittedTokensFollowTheTargetWhateverTheDraft) {
  // q puts mass where p has none (token 5) and misses tokens p likes (0): the residual
  // path carries the difference.
  const std::vector<float> p = {0.30f, 0.05f, 0.25f, 0.15f, 0.25f, 0.00f};
  const std::vector<float> q = {0.00f, 0.40f, 0.10f, 0.15f, 0.05f, 0.30f};
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int64_t n = 200000;
  std::vector<int64_t> counts(p.size(), 0);
  int64_t accepted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t d = draw(q, u(rng));
    const DraftVerdict v = speculative_accept(p, q, d, u(rng), u(rng));
    ASSERT_GE(v.token, 0);
    ASSERT_LT(v.token, 6);
    if (v.accepted) {
      ASSERT_EQ(v.token, d);
      ++accepted;
    }
    ++counts[v.token];
  }
  // 5 degrees of freedom: P(chi2 > 25) ~ 1.4e-4 for a correct rule; a wrong one (e.g.
  // emitting accepted drafts and p-samples) lands in the thousands here.
  EXPECT_LT(chi_square(counts, p, n), 25.0);
  // Acceptance probability is sum_x min(p, q) = 0 + .05 + .10 + .15 + .05 + 0 = 0.35.
  EXPECT_NEAR(static_cast<double>(accepted) / n, 0.35, 0.005);
}

TEST(SpeculativeAccept, DeterministicDraftsKeepTheTargetDistribution) {
  // n-gram drafts: q is one-hot at the draft, whichever token that is.
  const std::vector<float> p = {0.10f, 0.40f, 0.20f, 0.30f};
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int32_t d = 0; d < 4; ++d) {
    const int64_t n = 100000;
    std::vector<int64_t> counts(p.size(), 0);
    int64_t accepted = 0;
    for (int64_t i = 0; i < n; ++i) {
      const DraftVerdict v = speculative_accept(p, {}, d, u(rng), u(rng));
      accepted += v.accepted;
      ++counts[v.token];
    }
    EXPECT_LT(chi_square(counts, p, n), 22.0) << "draft " << d;  // 3 dof: P(> 22) ~ 6e-5
    EXPECT_NEAR(static_cast<double>(accepted) / n, p[d], 0.01) << "draft " << d;
  }
}

TEST(SpeculativeAccept, ThresholdTradesFidelityForAcceptance) {
  const std::vector<float> p = {0.45f, 0.55f};
  const std::vector<float> q = {1.0f, 0.0f};
  // Exact: accepted with p(0)/q(0) = 0.45. Threshold 0.4: always accepted (p(0) >= 0.4),
  // so the output is no longer distributed as p: that is the documented trade.
  int64_t exact = 0, relaxed = 0;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < 20000; ++i) {
    exact += speculative_accept(p, q, 0, u(rng), u(rng)).accepted;
    relaxed += speculative_accept(p, q, 0, u(rng), u(rng), 0.4f).accepted;
  }
  EXPECT_NEAR(exact / 20000.0, 0.45, 0.02);
  EXPECT_EQ(relaxed, 20000);
}

TEST(VerifyDraft, GreedyMatchesTheSamplersArgmaxWithPenalties) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.repetition_penalty = 3.0f;
  Sampler sampler(sp, 5);
  Sampler reference(sp, 5);
  std::vector<float> scratch(5);
  const std::vector<int32_t> history = {1, 1, 2};
  // Token 1 has the largest logit, but the penalty (seen in the history) demotes it below 3.
  std::vector<float> a = {0.1f, 2.0f, 0.5f, 1.0f, -1.0f};
  std::vector<float> b = a;
  const int32_t expect = reference.sample(b.data(), history);
  EXPECT_EQ(expect, 3);
  DraftVerdict v = verify_draft(sampler, a.data(), history, 3, nullptr, 0.0f, scratch);
  EXPECT_TRUE(v.accepted);
  EXPECT_EQ(v.token, 3);
  a = {0.1f, 2.0f, 0.5f, 1.0f, -1.0f};
  v = verify_draft(sampler, a.data(), history, 1, nullptr, 0.0f, scratch);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 3);  // the correction is the greedy token
}

TEST(VerifyDraft, SampledVerificationFollowsTheTransformedTarget) {
  // Temperature, top-k and the sampler's own stream: the emitted token of a verify with a
  // fixed n-gram draft must follow the sampler's candidate distribution.
  SamplingParams sp;
  sp.temperature = 0.7f;
  sp.top_k = 3;
  sp.seed = 11;
  Sampler sampler(sp, 6);
  const std::vector<float> logits = {1.0f, 0.2f, 1.5f, -0.5f, 0.9f, 0.0f};
  std::vector<float> p(6, 0.0f);
  {
    Sampler s(sp, 6);
    std::vector<float> l = logits;
    for (const auto& [t, prob] : s.candidates(l.data())) p[t] = prob;
  }
  std::vector<float> scratch(6);
  const int64_t n = 60000;
  std::vector<int64_t> counts(6, 0);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    const DraftVerdict v = verify_draft(sampler, l.data(), {}, /*draft=*/1, nullptr, 0.0f, scratch);
    ++counts[v.token];
  }
  // Token 1 is outside the top 3: never accepted. 2 dof among {0, 2, 4}.
  EXPECT_EQ(counts[1], 0);
  EXPECT_LT(chi_square(counts, p, n), 20.0);
}
