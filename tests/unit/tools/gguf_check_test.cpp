// `infera check` and `infera plan` on GGUF files: stories260K.gguf reads as the Llama model it
// is, a quantized GGUF reports its tensor types and the bytes it keeps in memory, and files
// Infera cannot run are errors naming the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../test_support.h"
#include "infera/io/manifest.h"
#include "infera/model/config.h"
#include "infera/model/gguf_loader.h"
#include "infera/tools/gguf_export.h"
#include "infera/tools/model_check.h"

namespace infera {
namespace {

TEST(GgufCheck, Stories260KGgufChecksClean) {
  INFERA_REQUIRE_FIXTURE(test::stories_gguf());
  const CheckReport r = check_model_dir(test::stories_gguf());
  EXPECT_EQ(r.errors(), 0) << r.to_text();
  EXPECT_EQ(r.arch, "llama");
  EXPECT_TRUE(r.arch_runnable);
  EXPECT_EQ(r.tensors, 47);
  EXPECT_EQ(r.params_total, 260032);
  EXPECT_EQ(r.dtypes, "F32 x 47");
  EXPECT_EQ(r.context_length, 512);
}

TEST(GgufCheck, QuantizedFileReportsItsTypesAndResidentBytes) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  test::TempDir dir("infera_gguf_check");
  GgufExportOptions o;
  o.out_type = GgufOutType::kQ8_0;
  const std::string file = dir.file("stories-q8_0.gguf");
  export_gguf(test::stories_dir(), file, o);
  const CheckReport r = check_model_dir(file);
  EXPECT_EQ(r.errors(), 0) << r.to_text();
  EXPECT_NE(r.dtypes.find("Q8_0 x "), std::string::npos) << r.dtypes;
  const GgufWeightsSummary w = inspect_gguf_weights(file, load_model_config(file));
  // Kept in their blocks: fewer bytes in memory than the f32 original (1 MiB), about the file.
  EXPECT_LT(w.resident_bytes, 600000);
  EXPECT_LE(w.resident_bytes, w.file_bytes);
}

// A GGUF file of an architecture Infera does not run (metadata only), at `file`.
void write_gemma3_gguf(const std::string& file) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::string("gemma3"));
  w.write(file);
}

TEST(GgufCheck, UnsupportedArchitectureIsAnError) {
  test::TempDir dir("infera_gguf_check");
  const std::string file = dir.file("gemma.gguf");
  write_gemma3_gguf(file);
  const CheckReport r = check_model_dir(file);
  ASSERT_GT(r.errors(), 0);
  EXPECT_NE(r.to_text().find("'gemma3' is not supported (supported: llama, qwen3"), std::string::npos) << r.to_text();
}

// --verify on a GGUF file: a plain file holds no checksum to check; one named by its SHA-256
// in Ollama's store (blobs/sha256-<hex>) is checked against that name, and a changed byte is
// an error naming both sums.
TEST(GgufCheck, VerifyChecksAStoreBlobAgainstItsName) {
  test::TempDir dir("infera_gguf_check");
  const std::string plain = dir.file("model.gguf");
  write_gemma3_gguf(plain);
  CheckOptions o;
  o.verify_manifest = true;
  CheckReport r = check_model_dir(plain, o);
  EXPECT_NE(r.to_text().find("nothing to verify it against"), std::string::npos) << r.to_text();
  EXPECT_FALSE(r.manifest.has_value());

  const std::string hex = sha256_file(plain);
  const std::string blob = dir.file("sha256-" + hex);
  std::filesystem::copy_file(plain, blob);
  r = check_model_dir(blob, o);
  ASSERT_TRUE(r.manifest.has_value()) << r.to_text();
  EXPECT_EQ(r.manifest->files_checked, 1u);
  EXPECT_TRUE(r.manifest->problems.empty());
  EXPECT_EQ(r.to_text().find("[manifest]"), std::string::npos) << r.to_text();
  EXPECT_NE(r.to_text().find("'gemma3' is not supported"), std::string::npos) << "a blob is read as a GGUF file";

  { std::ofstream(blob, std::ios::binary | std::ios::app) << "tail"; }
  r = check_model_dir(blob, o);
  ASSERT_TRUE(r.manifest.has_value());
  EXPECT_FALSE(r.manifest->ok());
  EXPECT_NE(r.to_text().find("SHA-256 differs from its store's name for it (expected " + hex), std::string::npos)
      << r.to_text();
}

// --verify on a Hugging Face cache snapshot, which has no MANIFEST.sha256: each file is a
// link to a blob named by its checksum (git's SHA-1 for small files, SHA-256 for large ones),
// and a link whose blob is gone is missing.
TEST(GgufCheck, VerifyChecksAHubSnapshotAgainstItsBlobNames) {
  namespace fs = std::filesystem;
  test::TempDir cache("infera_hub_verify");
  const fs::path repo = cache.path() / "models--o--n";
  const fs::path snap = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567";
  fs::create_directories(repo / "blobs");
  fs::create_directories(snap);
  const auto add = [&](const std::string& name, const std::string& text, bool large) {
    const fs::path tmp = cache.path() / "tmp";
    std::ofstream(tmp, std::ios::binary) << text;
    const fs::path blob = repo / "blobs" / (large ? sha256_file(tmp.string()) : git_blob_sha1_file(tmp.string()));
    fs::rename(tmp, blob);
    fs::create_symlink(fs::path("../../blobs") / blob.filename(), snap / name);
    return blob;
  };
  add("config.json", R"({"model_type": "llama"})", false);
  const fs::path weights = add("model.safetensors", "not really weights", true);
  CheckOptions o;
  o.verify_manifest = true;
  CheckReport r = check_model_dir(snap.string(), o);
  ASSERT_TRUE(r.manifest.has_value()) << r.to_text();
  EXPECT_EQ(r.manifest->files_checked, 2u) << r.to_text();
  EXPECT_TRUE(r.manifest->problems.empty()) << r.to_text();
  EXPECT_EQ(r.to_text().find("not found (write one"), std::string::npos) << "no manifest is asked for";

  fs::remove(weights);
  r = check_model_dir(snap.string(), o);
  ASSERT_TRUE(r.manifest.has_value());
  EXPECT_FALSE(r.manifest->ok());
  EXPECT_NE(r.to_text().find("model.safetensors: links to a blob that is missing"), std::string::npos) << r.to_text();
}

}  // namespace
}  // namespace infera
