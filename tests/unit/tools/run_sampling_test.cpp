// `infera run` samples with its flags, and the model's own defaults (generation_config.json,
// as `serve` and vLLM take them: --generation-config auto) for the flags not given; --json
// reports what the sampler used.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using infera::test::shell;

const std::string kInfera = std::string(INFERA_BINARY_DIR) + "/infera";

// The "sampling" object of `infera run -m DIR ... --json EXTRA`.
json sampling_of(const std::string& dir, const std::string& extra) {
  const auto [rc, out] =
      shell(kInfera + " run -m " + dir + " --prompt-ids '[1, 403, 407]' -n 2 --json " + extra + " 2>/dev/null");
  EXPECT_EQ(rc, 0) << extra;
  const size_t end = out.find_last_not_of('\n');
  const size_t begin = end == std::string::npos ? 0 : out.rfind('\n', end);
  return json::parse(out.substr(begin == std::string::npos ? 0 : begin + 1)).at("sampling");
}

TEST(RunSampling, TheModelsDefaultsFillTheFlagsNotGiven) {
  INFERA_REQUIRE_FIXTURE(infera::test::stories_dir());
  infera::test::TempDir dir("infera_run_sampling");
  const fs::path model = dir.path() / "model";
  fs::copy(infera::test::stories_dir(), model, fs::copy_options::recursive);
  std::ofstream(model / "generation_config.json", std::ios::trunc)
      << R"({"temperature": 0.3, "top_k": 5, "repetition_penalty": 1.3, "max_new_tokens": 9})";
  std::ofstream(dir.file("other.json")) << R"({"top_p": 0.5})";

  json s = sampling_of(model.string(), "--seed 7");
  EXPECT_EQ(s.at("temperature"), 0.3);
  EXPECT_EQ(s.at("top_k"), 5);
  EXPECT_EQ(s.at("repetition_penalty"), 1.3);
  EXPECT_EQ(s.at("top_p"), 0.95) << "not in the model's file: run's own default";
  EXPECT_EQ(s.at("min_p"), 0.05);
  EXPECT_EQ(s.at("seed"), 7);

  s = sampling_of(model.string(), "--temp 0.9 --repeat-penalty 1");
  EXPECT_EQ(s.at("temperature"), 0.9) << "a flag given wins";
  EXPECT_EQ(s.at("repetition_penalty"), 1.0) << "a flag given wins, at run's default value too";
  EXPECT_EQ(s.at("top_k"), 5);

  s = sampling_of(model.string(), "--generation-config none");
  EXPECT_EQ(s.at("temperature"), 0.8);
  EXPECT_EQ(s.at("top_k"), 40);
  EXPECT_EQ(s.at("repetition_penalty"), 1.0);

  s = sampling_of(model.string(), "--generation-config " + dir.file("other.json"));
  EXPECT_EQ(s.at("top_p"), 0.5) << "a named file instead of the model's";
  EXPECT_EQ(s.at("temperature"), 0.8);

  // The log names what was taken: not a value whose flag was given.
  const auto [logged_rc, log] = shell(kInfera + " run -m " + model.string() + " -p Hi -n 1 --temp 0 2>&1");
  EXPECT_EQ(logged_rc, 0) << log;
  EXPECT_NE(log.find("for the flags not given, from " + (model / "generation_config.json").string() +
                     ": top_k 5, repetition_penalty 1.3"),
            std::string::npos)
      << log;
  const auto [rc, out] = shell(kInfera + " run -m " + model.string() + " -p Hi -n 1 --generation-config " +
                               dir.file("missing.json") + " 2>&1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("is neither auto, none nor a generation_config.json"), std::string::npos) << out;
  EXPECT_EQ(out.find("loaded"), std::string::npos) << "a bad --generation-config fails before the load: " << out;
}

}  // namespace
