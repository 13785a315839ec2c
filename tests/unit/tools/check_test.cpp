// infera check on good, truncated, missing-shard, tampered and mis-shaped model
// directories (a sharded random qwen3 model from tools/gen_model.py, copied per case).
#include "infera/tools/model_check.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "infera/io/manifest.h"
#include "infera/model/arch_registry.h"

#include "../test_support.h"

namespace infera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kSource = INFERA_SOURCE_DIR;
const std::string kInfera = std::string(INFERA_BINARY_DIR) + "/infera";

using infera::test::shell;

bool has_issue(const CheckReport& r, CheckSeverity s, const std::string& needle) {
  for (const CheckIssue& i : r.issues) {
    if (i.severity == s && i.message.find(needle) != std::string::npos) return true;
  }
  return false;
}

std::string dump(const CheckReport& r) { return r.to_text(); }

class CheckTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    base_ = fs::temp_directory_path() / ("infera_check_" + std::to_string(::getpid()));
    fs::remove_all(base_);
    fs::create_directories(base_);
    const auto [rc, out] = shell("/usr/bin/python3 " + kSource + "/tools/gen_model.py " + (base_ / "good").string() +
                                 " --arch qwen3 --max-shard-size 40KB > /dev/null 2>&1");
    ASSERT_EQ(rc, 0) << "gen_model.py failed";
  }
  static void TearDownTestSuite() { fs::remove_all(base_); }

  // A fresh copy of the good model.
  fs::path copy(const std::string& name) {
    const fs::path d = base_ / name;
    fs::remove_all(d);
    fs::copy(base_ / "good", d, fs::copy_options::recursive);
    return d;
  }

  static fs::path base_;
};
fs::path CheckTest::base_;

TEST_F(CheckTest, GoodModelIsClean) {
  const CheckReport r = check_model_dir(copy("good_copy").string());
  EXPECT_EQ(r.exit_code(), 0) << dump(r);
  EXPECT_EQ(r.arch, "qwen3");
  EXPECT_TRUE(r.arch_runnable);
  EXPECT_EQ(r.context_length, 512);
  EXPECT_GT(r.params_total, 100000);
  EXPECT_EQ(r.params_active, r.params_total);
  EXPECT_NE(r.dtypes.find("F32"), std::string::npos);
  int shards = 0;
  for (const CheckFile& f : r.files) shards += f.role == "weights" ? 1 : 0;
  EXPECT_GT(shards, 3);  // the test needs a sharded model
  EXPECT_TRUE(has_issue(r, CheckSeverity::kInfo, "chat template parses"));
}

TEST_F(CheckTest, ManifestRoundTripAndSha256sumFormat) {
  const fs::path d = copy("manifest");
  CheckOptions w;
  w.write_manifest = true;
  const CheckReport written = check_model_dir(d.string(), w);
  EXPECT_EQ(written.exit_code(), 0) << dump(written);
  EXPECT_GT(written.manifest_written, 10u);
  // coreutils accepts the file.
  const auto [rc, out] = shell("cd " + d.string() + " && sha256sum --quiet -c MANIFEST.sha256 2>&1");
  EXPECT_EQ(rc, 0) << out;
  CheckOptions v;
  v.verify_manifest = true;
  const CheckReport verified = check_model_dir(d.string(), v);
  EXPECT_EQ(verified.exit_code(), 0) << dump(verified);
  ASSERT_TRUE(verified.manifest.has_value());
  EXPECT_TRUE(verified.manifest->ok());
  EXPECT_EQ(verified.manifest->files_checked, written.manifest_written);
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_F(CheckTest, TamperedByteIsNamedByVerify) {
  const fs::path d = copy("tampered");
  write_manifest(d.string());
  const fs::path shard = d / "model-00005-of-00012.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);  // inside the data section: headers and sizes stay valid
    f.put('\x7f');
  }
  // Without --verify the structure is still fine.
  EXPECT_EQ(check_model_dir(d.string()).exit_code(), 0);
  CheckOptions v;
  v.verify_manifest = true;
  const CheckReport r = check_model_dir(d.string(), v);
  EXPECT_EQ(r.exit_code(), 2) << dump(r);
  EXPECT_TRUE(has_issue(r, CheckSeverity::kError, "model-00005-of-00012.safetensors: SHA-256 differs")) << dump(r);
  ASSERT_TRUE(r.manifest.has_value());
  ASSERT_EQ(r.manifest->problems.size(), 1u);
  EXPECT_EQ(r.manifest->problems[0].path, "model-00005-of-00012.safetensors");
  // An added file is reported (warning), a removed one is an error.
  std::ofstream(d / "extra.txt") << "x";
  fs::remove(d / "special_tokens_map.json");
  const CheckReport r2 = check_model_dir(d.string(), v);
  EXPECT_TRUE(has_issue(r2, CheckSeverity::kWarning, "extra.txt: present but not listed")) << dump(r2);
  EXPECT_TRUE(has_issue(r2, CheckSeverity::kError, "special_tokens_map.json: listed in MANIFEST.sha256 but missing"))
      << dump(r2);
}

// An unlisted file that changes what loads (a chat template, a shard index) fails --verify.
TEST_F(CheckTest, UnlistedFilesThatChangeWhatLoadsAreErrors) {
  const fs::path d = copy("unlisted");
  write_manifest(d.string());
  std::ofstream(d / "chat_template.jinja") << "{{ 'injected' }}";
  CheckOptions v;
  v.verify_manifest = true;
  const CheckReport r = check_model_dir(d.string(), v);
  EXPECT_EQ(r.exit_code(), 2) << dump(r);
  EXPECT_TRUE(has_issue(r, CheckSeverity::kError, "chat_template.jinja: present but not listed")) << dump(r);
  ASSERT_TRUE(r.manifest.has_value());
  EXPECT_FALSE(r.manifest->ok());
}

TEST_F(CheckTest, TruncatedShardIsAnError) {
  const fs::path d = copy("truncated");
  const fs::path shard = d / "model-00004-of-00012.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  const CheckReport r = check_model_dir(d.string());
  EXPECT_EQ(r.exit_code(), 2) << dump(r);
  bool named = false;
  for (const CheckIssue& i : r.issues) {
    named = named || (i.severity == CheckSeverity::kError && i.topic == "weights" &&
                      i.message.find("model-00004-of-00012.safetensors") != std::string::npos);
  }
  EXPECT_TRUE(named) << dump(r);
  // Trailing bytes after the data section: a warning.
  const fs::path d2 = copy("padded");
  std::ofstream(d2 / "model-00002-of-00012.safetensors", std::ios::app | std::ios::binary) << "garbage";
  const CheckReport r2 = check_model_dir(d2.string());
  EXPECT_EQ(r2.exit_code(), 1) << dump(r2);
  EXPECT_TRUE(has_issue(r2, CheckSeverity::kWarning, "7 bytes after the last tensor")) << dump(r2);
}

TEST_F(CheckTest, MissingShardIsNamed) {
  const fs::path d = copy("missing");
  fs::remove(d / "model-00003-of-00012.safetensors");
  const CheckReport r = check_model_dir(d.string());
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_TRUE(has_issue(r, CheckSeverity::kError, "model-00003-of-00012.safetensors: missing shard")) << dump(r);
  // Its tensors are then missing from the shape check too.
  EXPECT_TRUE(has_issue(r, CheckSeverity::kError, "missing")) << dump(r);
}

TEST_F(CheckTest, ShapesFollowTheConfig) {
  const fs::path d = copy("shapes");
  json cfg;
  std::ifstream(d / "config.json") >> cfg;
  cfg["intermediate_size"] = cfg["intermediate_size"].get<int>() * 2;
  cfg["some_new_field"] = 1;
  std::ofstream(d / "config.json") << cfg.dump(2);
  const CheckReport r = check_model_dir(d.string());
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_TRUE(has_issue(r, CheckSeverity::kError, "with the wrong shape")) << dump(r);
  EXPECT_TRUE(has_issue(r, CheckSeverity::kError, "mlp.down_proj.weight' has shape")) << dump(r);
  EXPECT_TRUE(has_issue(r, CheckSeverity::kWarning, "some_new_field")) << dump(r);
}

// A config.json with fewer layers than the checkpoint: the model would load and run
// truncated, so the layers left over are a warning, not just the info line that tensors
// outside the text model get.
TEST_F(CheckTest, FewerLayersThanTheCheckpointIsAWarning) {
  const fs::path d = copy("fewer_layers");
  json cfg;
  std::ifstream(d / "config.json") >> cfg;
  const int layers = cfg["num_hidden_layers"].get<int>();
  ASSERT_GE(layers, 2);
  EXPECT_FALSE(has_issue(check_model_dir(d.string()), CheckSeverity::kWarning, "past num_hidden_layers"));
  cfg["num_hidden_layers"] = layers - 1;
  std::ofstream(d / "config.json") << cfg.dump(2);
  const CheckReport r = check_model_dir(d.string());
  EXPECT_EQ(r.exit_code(), 1) << dump(r);
  EXPECT_TRUE(has_issue(r, CheckSeverity::kWarning,
                        "unused tensors of decoder layers past num_hidden_layers " + std::to_string(layers - 1) +
                            " (e.g. 'model.layers." + std::to_string(layers - 1) + "."))
      << dump(r);
}

TEST_F(CheckTest, MissingFilesAndBadTemplate) {
  const fs::path d = copy("files");
  fs::remove(d / "tokenizer.json");
  json tc;
  std::ifstream(d / "tokenizer_config.json") >> tc;
  tc["chat_template"] = "{% for m in messages %}{{ m.content ";
  std::ofstream(d / "tokenizer_config.json") << tc.dump();
  const CheckReport r = check_model_dir(d.string());
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_TRUE(has_issue(r, CheckSeverity::kError, "tokenizer.json: missing")) << dump(r);
  EXPECT_TRUE(has_issue(r, CheckSeverity::kError, "chat template")) << dump(r);
  EXPECT_EQ(check_model_dir((base_ / "nope").string()).exit_code(), 2);
}

TEST_F(CheckTest, RecognisedButNotRunnableIsAWarning) {
  // Every registered architecture has a model file today; a row without one (create ==
  // nullptr: recognised for check and plan only) is what a new architecture starts as. The
  // DeepSeek-V3.2 row stands in for one here: the check reads a copy of the registry whose
  // row has no create hook (the registry itself is left as it is).
  std::vector<ArchInfo> rows = arch_registry();
  for (ArchInfo& row : rows) {
    if (row.arch == Arch::kDeepseekV32) row.create = nullptr;
  }
  ASSERT_TRUE(arch_info(Arch::kDeepseekV32).runnable());
  const fs::path d = copy("hybrid");
  json cfg;
  std::ifstream(kSource + "/examples/configs/DeepSeek-V3.2.json") >> cfg;
  cfg.erase("quantization_config");
  std::ofstream(d / "config.json") << cfg.dump();
  CheckOptions options;
  options.arch_rows = &rows;
  const CheckReport r = check_model_dir(d.string(), options);
  EXPECT_TRUE(r.arch_recognised);
  EXPECT_FALSE(r.arch_runnable);
  EXPECT_TRUE(has_issue(r, CheckSeverity::kWarning, "cannot run it yet")) << dump(r);
  EXPECT_TRUE(has_issue(r, CheckSeverity::kWarning, "tensors missing")) << dump(r);  // warnings, not errors
  EXPECT_FALSE(has_issue(r, CheckSeverity::kError, "tensors missing")) << dump(r);
}

TEST_F(CheckTest, CliExitCodesAndJson) {
  ASSERT_TRUE(fs::exists(kInfera)) << "the infera binary is missing (it is built with the tests)";
  const fs::path d = copy("cli");
  auto [rc, out] = shell(kInfera + " check " + d.string() + " --write-manifest --json 2>/dev/null");
  EXPECT_EQ(rc, 0) << out;
  json j = json::parse(out);
  EXPECT_EQ(j["arch"], "qwen3");
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_GT(j["manifest_written"].get<int>(), 10);
  std::ofstream(d / "config.json", std::ios::app) << " ";  // changes the file's checksum
  std::tie(rc, out) = shell(kInfera + " check " + d.string() + " --verify --json 2>/dev/null");
  EXPECT_EQ(rc, 2) << out;
  j = json::parse(out);
  EXPECT_FALSE(j["manifest"]["verified"].get<bool>());
  EXPECT_EQ(j["manifest"]["problems"][0]["path"], "config.json");
  std::tie(rc, out) = shell(kInfera + " check " + d.string() + " 2>/dev/null");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("architecture qwen3 (supported)"), std::string::npos) << out;
}

}  // namespace
}  // namespace infera
