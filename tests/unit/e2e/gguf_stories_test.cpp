// Running llama.cpp's own GGUF of stories260K (model/gguf_loader.h): the same model as the
// Hugging Face directory beside it, so the GGUF must give the same logits (its q/k rows are
// in llama.cpp's adjacent-pair order and are put back at load), the published greedy text,
// and a tokenizer (SentencePiece BPE from tokenizer.ggml.*) that encodes and decodes as the
// directory's tokenizer.json does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "../runtime/greedy_reference.h"
#include "../test_support.h"
#include "infera/chat/chat_template.h"
#include "infera/io/manifest.h"
#include "infera/io/model_ref.h"
#include "infera/model/gguf_loader.h"
#include "infera/model/model.h"
#include "infera/runtime/block_allocator.h"
#include "infera/runtime/sequence_runner.h"
#include "infera/tokenizer/tokenizer.h"

using namespace infera;

namespace {

const std::string kDir = test::stories_dir();
const std::string kGguf = test::stories_gguf();

// Logits of every position of `prompt`, [n, vocab].
std::vector<float> all_logits(Model& model, const std::vector<int32_t>& prompt) {
  KvPoolShape shape = model.kv_shape(16);
  shape.num_blocks = 16;
  KvPool kv(shape);
  BlockAllocator blocks(16);
  SequenceRunner runner(model, kv, blocks, 512);
  const float* logits = runner.feed(prompt, true);
  return {logits, logits + prompt.size() * static_cast<size_t>(model.config().vocab_size)};
}

TEST(GgufStories, ConfigMatchesTheDirectory) {
  INFERA_REQUIRE_FIXTURE(kGguf);
  INFERA_REQUIRE_FIXTURE(kDir);
  ASSERT_TRUE(is_gguf_path(kGguf));
  EXPECT_FALSE(is_gguf_path(kDir));
  const ModelConfig g = load_model_config(kGguf);
  const ModelConfig h = load_model_config(kDir);
  EXPECT_EQ(g.arch, h.arch);
  EXPECT_EQ(g.hidden_size, h.hidden_size);
  EXPECT_EQ(g.intermediate_size, h.intermediate_size);
  EXPECT_EQ(g.num_layers, h.num_layers);
  EXPECT_EQ(g.num_heads, h.num_heads);
  EXPECT_EQ(g.num_kv_heads, h.num_kv_heads);
  EXPECT_EQ(g.head_dim, h.head_dim);
  EXPECT_EQ(g.vocab_size, h.vocab_size);
  EXPECT_EQ(g.max_position_embeddings, h.max_position_embeddings);
  EXPECT_FLOAT_EQ(g.rms_norm_eps, h.rms_norm_eps);
  EXPECT_FLOAT_EQ(g.rope.theta, h.rope.theta);
  EXPECT_EQ(g.rope.rotary_dim, h.rope.rotary_dim);
  EXPECT_EQ(g.tie_word_embeddings, h.tie_word_embeddings);
  EXPECT_EQ(g.bos_token_id, 1);
  EXPECT_EQ(g.eos_token_ids, std::vector<int>{2});
}

TEST(GgufStories, LogitsEqualTheDirectoryAndGreedyMatchesGolden) {
  INFERA_REQUIRE_FIXTURE(kGguf);
  INFERA_REQUIRE_FIXTURE(kDir);
  auto hf = load_model(kDir);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 13, 300, 42, 77, 410, 500, 1};
  const std::vector<float> want = all_logits(*hf, prompt);
  for (bool in_memory : {false, true}) {
    LoadOptions opt;
    opt.load_into_memory = in_memory;
    auto model = load_model(kGguf, opt);
    EXPECT_EQ(model->num_parameters(), hf->num_parameters());
    const std::vector<float> got = all_logits(*model, prompt);
    ASSERT_EQ(got.size(), want.size());
    float max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
    // The same f32 weights through the same kernels: only q/k row order differs on disk.
    EXPECT_LE(max_diff, 1e-5f) << "load_into_memory=" << in_memory;
    EXPECT_EQ(testing_support::greedy_alone(*model, {1}, 40), testing_support::greedy_alone(*hf, {1}, 40));
  }
}

// The same file as Ollama keeps it: a blob named by its SHA-256, no .gguf in its name,
// reached through the store's manifest (`-m ollama:stories:260k`), gives the same model,
// tokenizer and greedy text.
TEST(GgufStories, OllamaBlobRunsAsTheFile) {
  INFERA_REQUIRE_FIXTURE(kGguf);
  namespace fs = std::filesystem;
  test::TempDir store("infera_ollama_store");
  const std::string hex = sha256_file(kGguf);
  const fs::path blob = store.path() / "blobs" / ("sha256-" + hex);
  fs::create_directories(blob.parent_path());
  fs::copy_file(kGguf, blob);
  const fs::path manifest = store.path() / "manifests/registry.ollama.ai/library/stories/260k";
  fs::create_directories(manifest.parent_path());
  std::ofstream(manifest) << R"({"schemaVersion":2,"layers":[{"mediaType":"application/vnd.ollama.image.model",)"
                          << R"("digest":"sha256:)" << hex << R"(","size":)" << fs::file_size(blob) << "}]}";
  test::ScopedEnv env("OLLAMA_MODELS", store.path().c_str());
  const std::string path = model_path_of("ollama:stories:260k");
  ASSERT_EQ(path, blob.string());
  ASSERT_TRUE(is_gguf_path(path));
  auto from_blob = load_model(path);
  auto from_file = load_model(kGguf);
  EXPECT_EQ(testing_support::greedy_alone(*from_blob, {1}, 40), testing_support::greedy_alone(*from_file, {1}, 40));
  EXPECT_EQ(Tokenizer::load(path).encode("Once upon a time"), Tokenizer::load(kGguf).encode("Once upon a time"));
}

TEST(GgufStories, TokenizerEqualsTheDirectoryTokenizer) {
  INFERA_REQUIRE_FIXTURE(kGguf);
  INFERA_REQUIRE_FIXTURE(kDir);
  const Tokenizer g = Tokenizer::load(kGguf);
  const Tokenizer h = Tokenizer::load(kDir);
  EXPECT_EQ(g.kind(), Tokenizer::Kind::kSentencePieceBpe);
  EXPECT_EQ(g.vocab_size(), h.vocab_size());
  EXPECT_EQ(g.bos_id(), 1);
  EXPECT_EQ(g.eos_id(), 2);
  EXPECT_TRUE(g.add_bos());
  EXPECT_FALSE(g.add_eos());
  EXPECT_EQ(g.encode(""), std::vector<int32_t>{1});
  EXPECT_EQ(g.encode("Once upon a time"), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  const std::vector<std::string> texts = {
      "Lily and Tom went to the park.",
      "  two leading spaces, and  double  ones ",
      "Numbers 12345 and punctuation!?;:",
      "tab\tand\nnewline",
      "caf\xC3\xA9 \xE2\x80\x9Cquoted\xE2\x80\x9D \xE2\x80\x94 dash",
      "emoji \xF0\x9F\x98\x80 and CJK \xE4\xBD\xA0\xE5\xA5\xBD",
      "<s> in the middle </s> of text",
      "The little dog said \"Hi!\" to the big cat.",
  };
  for (const std::string& s : texts) {
    for (bool special : {true, false}) {
      const std::vector<int32_t> ids = g.encode(s, special);
      EXPECT_EQ(ids, h.encode(s, special)) << s << " special=" << special;
      EXPECT_EQ(g.decode(ids), h.decode(ids)) << s;
      EXPECT_EQ(g.decode(ids, false), h.decode(ids, false)) << s;
    }
  }
  for (int32_t id = 0; id < g.vocab_size(); ++id) {
    EXPECT_EQ(g.token_text(id), h.token_text(id)) << id;
    EXPECT_EQ(g.is_special(id), h.is_special(id)) << id;
  }
}

TEST(GgufStories, ClearErrors) {
  test::TempDir dir("infera_gguf_input");
  const std::string bad = dir.file("bad.gguf");
  {
    std::ofstream f(bad);
    f << "not a gguf file at all";
  }
  EXPECT_NE(test::error_of([&] { load_model(bad); }).find("not a GGUF file"), std::string::npos);
  EXPECT_NE(test::error_of([&] { Tokenizer::load(bad); }).find("not a GGUF file"), std::string::npos);
  // A split file with a missing part names it.
  const std::string part = dir.file("m-00001-of-00002.gguf");
  {
    std::ofstream f(part);
    f << "GGUF";
  }
  EXPECT_NE(test::error_of([&] { load_model_config(part); }).find("m-00002-of-00002.gguf"), std::string::npos);
}

}  // namespace
