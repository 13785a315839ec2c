// `infera run --json --logprobs N` on the stories260K fixture: every generated token comes
// with its raw log-probability and the N most likely alternatives, the same from the plain
// and the speculative (engine) paths, and consistent with the greedy choice.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"

namespace {

using json = nlohmann::json;

const std::string kInfera = std::string(INFERA_BINARY_DIR) + "/infera";
const std::string kStories = infera::test::stories_dir();

using infera::test::shell;

json run(const std::string& extra) {
  const auto [rc, out] =
      shell(kInfera + " run -m " + kStories + " --prompt-ids '[1, 403, 407]' -n 12 --json " + extra + " 2>/dev/null");
  EXPECT_EQ(rc, 0) << extra;
  // --json prints one JSON object as the last line.
  const size_t end = out.find_last_not_of('\n');
  const size_t begin = end == std::string::npos ? 0 : out.rfind('\n', end);
  return json::parse(out.substr(begin == std::string::npos ? 0 : begin + 1));
}

TEST(RunLogprobs, GreedyTokensCarryTheirLogprobsAndTopAlternatives) {
  INFERA_REQUIRE_FIXTURE(kStories);
  const json j = run("--temp 0 --logprobs 3");
  const auto& ids = j.at("ids");
  const auto& lps = j.at("logprobs");
  ASSERT_EQ(ids.size(), 12u);
  ASSERT_EQ(lps.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const json& lp = lps[i];
    EXPECT_EQ(lp.at("id"), ids[i]);
    const double sampled = lp.at("logprob");
    EXPECT_LE(sampled, 0.0);
    const auto& top = lp.at("top_logprobs");
    ASSERT_EQ(top.size(), 3u);
    // Greedy: the sampled token is the most likely one.
    EXPECT_EQ(top[0].at("id"), ids[i]);
    EXPECT_EQ(top[0].at("logprob").get<double>(), sampled);
    double mass = 0.0;
    for (size_t t = 0; t < top.size(); ++t) {
      if (t > 0) {
        EXPECT_LE(top[t].at("logprob").get<double>(), top[t - 1].at("logprob").get<double>());
      }
      mass += std::exp(top[t].at("logprob").get<double>());
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
}

TEST(RunLogprobs, SpeculativePathGivesTheSameNumbers) {
  INFERA_REQUIRE_FIXTURE(kStories);
  const json plain = run("--temp 0 --logprobs 2");
  const json spec = run("--temp 0 --logprobs 2 --speculative ngram");
  ASSERT_EQ(plain.at("ids"), spec.at("ids"));
  const auto& a = plain.at("logprobs");
  const auto& b = spec.at("logprobs");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i].at("logprob").get<double>(), b[i].at("logprob").get<double>(), 1e-4) << "token " << i;
    for (size_t t = 0; t < 2; ++t) EXPECT_EQ(a[i].at("top_logprobs")[t].at("id"), b[i].at("top_logprobs")[t].at("id"));
  }
}

TEST(RunLogprobs, SampledTokensAreScoredUnderTheRawDistribution) {
  INFERA_REQUIRE_FIXTURE(kStories);
  // Temperature 1.5 with a seed: the sampled token need not be the most likely, and its
  // logprob is the raw model's (not the tempered one), so never above the top alternative's,
  // and the first position (same prompt) has exactly the greedy run's distribution.
  const json j = run("--temp 1.5 --top-k 0 --top-p 1 --min-p 0 --seed 7 --logprobs 1");
  const json greedy = run("--temp 0 --logprobs 1");
  const auto& lps = j.at("logprobs");
  ASSERT_EQ(lps.size(), j.at("ids").size());
  ASSERT_FALSE(lps.empty());
  EXPECT_EQ(lps[0].at("top_logprobs")[0], greedy.at("logprobs")[0].at("top_logprobs")[0]);
  for (const json& lp : lps) {
    EXPECT_LE(lp.at("logprob").get<double>(), lp.at("top_logprobs")[0].at("logprob").get<double>() + 1e-6);
  }
}

TEST(RunLogprobs, NeedsJsonAndAtMostTwenty) {
  INFERA_REQUIRE_FIXTURE(kStories);
  EXPECT_NE(shell(kInfera + " run -m " + kStories + " -n 2 --logprobs 2 2>/dev/null").first, 0);
  EXPECT_NE(shell(kInfera + " run -m " + kStories + " -n 2 --json --logprobs 21 2>/dev/null").first, 0);
}

}  // namespace
