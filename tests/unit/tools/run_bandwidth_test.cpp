// `infera run` reports the achieved weight-read bandwidth beside tokens/s: the text summary
// ends with "GB/s", and --json adds generated_gb_per_s and weight_bytes_per_token (the
// existing fields keep their names and meaning).
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"

namespace {

using json = nlohmann::json;
using infera::test::shell;

const std::string kInfera = std::string(INFERA_BINARY_DIR) + "/infera";
const std::string kStories = std::string(INFERA_SOURCE_DIR) + "/../shared/models/stories260K";

json last_json_line(const std::string& out) {
  const size_t end = out.find_last_not_of('\n');
  const size_t begin = end == std::string::npos ? 0 : out.rfind('\n', end);
  return json::parse(out.substr(begin == std::string::npos ? 0 : begin + 1));
}

class RunBandwidth : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kStories + "/config.json")) GTEST_SKIP() << "fixture missing: " << kStories;
  }
};

TEST_F(RunBandwidth, JsonCarriesGigabytesPerSecondBesideTokensPerSecond) {
  for (const std::string extra : {"", "--speculative ngram"}) {
    const auto [rc, out] = shell(kInfera + " run -m " + kStories +
                                 " --prompt-ids '[1, 403, 407]' -n 16 --temp 0 --json " + extra + " 2>/dev/null");
    ASSERT_EQ(rc, 0) << extra;
    const json j = last_json_line(out);
    for (const char* field :
         {"ids", "prompt_tokens", "prompt_tokens_per_s", "generated_tokens", "generated_tokens_per_s"}) {
      EXPECT_TRUE(j.contains(field)) << field << " " << extra;
    }
    // Tokens per second of the process's CPU time (the plain run; the speculative one reports
    // wall time only).
    if (extra.empty()) {
      EXPECT_GT(j.at("prompt_cpu_tokens_per_s").get<double>(), 0.0);
      EXPECT_GT(j.at("generated_cpu_tokens_per_s").get<double>(), 0.0);
    }
    const int64_t bytes = j.at("weight_bytes_per_token").get<int64_t>();
    const double gbs = j.at("generated_gb_per_s").get<double>();
    EXPECT_GT(bytes, 0) << extra;
    EXPECT_GT(gbs, 0.0) << extra;
    if (extra.empty()) {
      // One decode step per generated token after the first.
      const double tps = j.at("generated_tokens_per_s").get<double>();
      EXPECT_NEAR(gbs, bytes * tps / 1e9, 1e-9 * bytes * tps / 1e9 + 1e-12);
    }
  }
}

TEST_F(RunBandwidth, TextSummaryEndsWithGigabytesPerSecond) {
  const auto [rc, out] = shell(kInfera + " run -m " + kStories + " -p 'Once upon a time' -n 8 --temp 0 2>/dev/null");
  ASSERT_EQ(rc, 0);
  const size_t line = out.rfind("generated:");
  ASSERT_NE(line, std::string::npos) << out;
  const std::string summary = out.substr(line);
  EXPECT_NE(summary.find("tokens/s, "), std::string::npos) << summary;
  EXPECT_NE(summary.find(" GB/s"), std::string::npos) << summary;
}

}  // namespace
