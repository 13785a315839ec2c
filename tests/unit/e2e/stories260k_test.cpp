// End-to-end on the real trained stories260K model: greedy decoding from BOS must
// reproduce the published llama2.c output token for token (GOLDEN.md), with every
// weight-loading mode and ISA path, and prefill in one batch must agree with feeding the
// same tokens one at a time.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../runtime/greedy_reference.h"
#include "../test_support.h"
#include "infera/base/threads.h"
#include "infera/model/model.h"
#include "infera/runtime/block_allocator.h"
#include "infera/runtime/sampler.h"
#include "infera/runtime/sequence_runner.h"
#include "infera/tokenizer/tokenizer.h"

using namespace infera;

namespace {

const std::string kModelDir = test::stories_dir();

std::vector<int32_t> golden_ids() {
  std::ifstream in(kModelDir + "/GOLDEN.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // The first fenced block holds the 60 ids.
  const auto open = text.find("```\n");
  const auto close = text.find("```", open + 4);
  std::istringstream ids(text.substr(open + 4, close - open - 4));
  std::vector<int32_t> out;
  for (int32_t v; ids >> v;) out.push_back(v);
  return out;
}

std::vector<int32_t> greedy(Model& model, const std::vector<int32_t>& prompt, int n, int chunk) {
  return testing_support::greedy_alone(model, prompt, n, chunk);
}

}  // namespace

TEST(Stories260K, GreedyFromBosMatchesGolden) {
  INFERA_REQUIRE_FIXTURE(kModelDir);
  const auto golden = golden_ids();
  ASSERT_EQ(golden.size(), 60u);
  for (bool in_memory : {false, true}) {
    LoadOptions opt;
    opt.load_into_memory = in_memory;
    auto model = load_model(kModelDir, opt);
    EXPECT_EQ(greedy(*model, {1}, 60, 512), golden) << "load_into_memory=" << in_memory;
  }
}

TEST(Stories260K, GoldenTextDecodes) {
  INFERA_REQUIRE_FIXTURE(kModelDir);
  auto tok = Tokenizer::load(kModelDir);
  const auto golden = golden_ids();
  const std::string text = tok.decode(golden);
  EXPECT_EQ(text.substr(0, 37), "Once upon a time, there was a little ");
  EXPECT_EQ(tok.encode(text), [&] {
    std::vector<int32_t> v = {1};
    v.insert(v.end(), golden.begin(), golden.end());
    return v;
  }());
}

TEST(Stories260K, BatchedPrefillEqualsTokenByToken) {
  INFERA_REQUIRE_FIXTURE(kModelDir);
  auto model = load_model(kModelDir);
  auto golden = golden_ids();
  std::vector<int32_t> prompt = {1};
  prompt.insert(prompt.end(), golden.begin(), golden.begin() + 40);
  // Prefill 41 tokens in one forward, in chunks of 7 (chunk boundaries inside KV
  // blocks), and one at a time: the continuation and the logits must agree.
  const auto a = greedy(*model, prompt, 20, 512);
  const auto b = greedy(*model, prompt, 20, 7);
  const auto c = greedy(*model, prompt, 20, 1);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  std::vector<int32_t> expected(golden.begin() + 40, golden.end());
  EXPECT_EQ(a, expected);
}
