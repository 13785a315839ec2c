#include "infera/tools/gguf_export.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/io/safetensors.h"
#include "infera/model/config.h"
#include "infera/model/tensor_table.h"
#include "infera/tensor/dtype.h"

namespace infera {
namespace {

namespace fs = std::filesystem;
using gguf::GgmlType;

const std::string kModels = test::shared_models_dir();
const std::string kStoriesDir = kModels + "/stories260K";
const std::string kStoriesGguf = kModels + "/stories260K.gguf";

class TempDir : public test::TempDir {
 public:
  TempDir() : test::TempDir("infera_gguf_export") {}
  // A writable copy of the stories260K model directory.
  std::string copy_stories(const std::string& name) const {
    const fs::path dst = path() / name;
    fs::create_directories(dst);
    for (const auto& entry : fs::directory_iterator(kStoriesDir))
      fs::copy_file(entry.path(), dst / entry.path().filename());
    return dst.string();
  }
};

std::vector<float> as_f32(const gguf::Tensor& t) {
  std::vector<float> out(t.n_elements());
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h;
    switch (t.type) {
      case GgmlType::kF32: std::memcpy(&out[i], t.data + 4 * i, 4); break;
      case GgmlType::kF16:
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = f16_to_f32(h);
        break;
      case GgmlType::kBF16:
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = bf16_to_f32(h);
        break;
      default: ADD_FAILURE() << "unexpected type"; return out;
    }
  }
  return out;
}

void edit_json(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j;
  {
    std::ifstream f(path);
    j = nlohmann::json::parse(f);
  }
  edit(j);
  std::ofstream f(path);
  f << j.dump(2);
}

using test::error_of;

// The heart of the converter: the HF stories260K directory must give llama.cpp's own GGUF
// back, tensor for tensor and bit for bit (including the q/k row permutation), with the
// same metadata values.
TEST(GgufExport, Stories260KF32IsBitIdenticalToTheReferenceGguf) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  INFERA_REQUIRE_FIXTURE(kStoriesGguf);
  TempDir dir;
  const std::string out = dir.file("stories.gguf");
  GgufExportOptions options;
  options.out_type = GgufOutType::kF32;
  const GgufExportResult result = export_gguf(kStoriesDir, out, options);
  EXPECT_EQ(result.n_tensors, 47u);

  const gguf::Reader ref(kStoriesGguf);
  const gguf::Reader got(out);
  ASSERT_EQ(got.tensors().size(), ref.tensors().size());
  for (size_t i = 0; i < ref.tensors().size(); ++i) {
    const gguf::Tensor& r = ref.tensors()[i];
    const gguf::Tensor& g = got.tensors()[i];
    EXPECT_EQ(g.name, r.name) << "tensor #" << i;
    EXPECT_EQ(g.ne, r.ne) << r.name;
    EXPECT_EQ(g.type, r.type) << r.name;
    ASSERT_EQ(g.nbytes, r.nbytes) << r.name;
    EXPECT_EQ(std::memcmp(g.data, r.data, r.nbytes), 0) << r.name << " differs";
  }
  // Every key of the reference but general.license (an HF directory does not carry one).
  for (const auto& [key, value] : ref.metadata()) {
    if (key == "general.license") continue;
    const gguf::Value* mine = got.find(key);
    ASSERT_NE(mine, nullptr) << "missing key " << key;
    EXPECT_EQ(*mine, value) << key << ": got " << mine->describe() << ", want " << value.describe();
  }
  EXPECT_EQ(got.find("tokenizer.chat_template"), nullptr);
  EXPECT_EQ(got.find("tokenizer.ggml.padding_token_id"), nullptr);
}

TEST(GgufExport, HalfTypesRoundTheSourceAndKeepNormsF32) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  INFERA_REQUIRE_FIXTURE(kStoriesGguf);
  const gguf::Reader ref(kStoriesGguf);
  for (GgufOutType type : {GgufOutType::kF16, GgufOutType::kBF16}) {
    TempDir dir;
    const std::string out = dir.file("half.gguf");
    GgufExportOptions options;
    options.out_type = type;
    options.name = "custom name";
    export_gguf(kStoriesDir, out, options);
    const gguf::Reader got(out);
    const bool f16 = type == GgufOutType::kF16;
    EXPECT_EQ(got.get("general.file_type").to_u64(), f16 ? 1u : 32u);
    EXPECT_EQ(got.get("general.name").str(), "custom name");
    // f16 has 11 significant bits, bf16 has 8: relative error of round-to-nearest.
    const double rel = f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    ASSERT_EQ(got.tensors().size(), ref.tensors().size());
    for (const gguf::Tensor& r : ref.tensors()) {
      const gguf::Tensor& g = got.tensor(r.name);
      EXPECT_EQ(g.ne, r.ne);
      if (r.ne.size() == 1) {
        EXPECT_EQ(g.type, GgmlType::kF32) << r.name;
        EXPECT_EQ(std::memcmp(g.data, r.data, r.nbytes), 0) << r.name;
        continue;
      }
      EXPECT_EQ(g.type, f16 ? GgmlType::kF16 : GgmlType::kBF16) << r.name;
      const std::vector<float> want = as_f32(r), have = as_f32(g);
      ASSERT_EQ(want.size(), have.size());
      for (size_t i = 0; i < want.size(); ++i) {
        // f16 subnormals below 2^-14 have an absolute step of 2^-24.
        const double tol = rel * std::fabs(want[i]) + (f16 ? std::ldexp(1.0, -25) : 0.0);
        ASSERT_LE(std::fabs(static_cast<double>(have[i]) - want[i]), tol) << r.name << "[" << i << "]";
      }
    }
  }
}

// GGUF names come from the architecture's tensor table (model/tensor_table.h), per config.
TEST(GgufExport, TensorNameTable) {
  auto config = [](const char* model_type, bool attention_bias) {
    nlohmann::json j = {{"model_type", model_type}, {"hidden_size", 64},
                        {"intermediate_size", 128}, {"num_hidden_layers", 13},
                        {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                        {"vocab_size", 256},        {"attention_bias", attention_bias}};
    return parse_model_config(j, "config.json");
  };
  const ModelConfig llama = config("llama", false), qwen3 = config("qwen3", false), biased = config("llama", true);
  EXPECT_EQ(gguf_tensor_name(llama, "model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "lm_head.weight"), "output.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "model.layers.12.self_attn.o_proj.weight"), "blk.12.attn_output.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "model.layers.0.post_attention_layernorm.weight"), "blk.0.ffn_norm.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "model.layers.3.mlp.down_proj.weight"), "blk.3.ffn_down.weight");
  EXPECT_EQ(gguf_tensor_name(qwen3, "model.layers.1.self_attn.k_norm.weight"), "blk.1.attn_k_norm.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "model.layers.1.self_attn.k_norm.weight"), "");  // no q/k norm in llama
  EXPECT_EQ(gguf_tensor_name(llama, "model.layers.1.self_attn.q_proj.bias"), "");
  EXPECT_EQ(gguf_tensor_name(biased, "model.layers.1.self_attn.q_proj.bias"), "");  // in the table, no GGUF name
  EXPECT_EQ(gguf_tensor_name(llama, "model.layers.13.mlp.up_proj.weight"), "");  // past the last layer
  EXPECT_EQ(gguf_tensor_name(llama, "model.layers.x.mlp.up_proj.weight"), "");
}

TEST(GgufExport, Llama3RopeFactorsMatchTheReferenceConverter) {
  // Llama 3.1's rope_scaling; expected values from convert_hf_to_gguf.py's formula
  // evaluated independently in numpy.
  ModelConfig c;
  c.head_dim = 128;
  c.rope.rotary_dim = 128;
  c.rope.theta = 500000.0f;
  c.rope.scaling = RopeScaling::kLlama3;
  c.rope.factor = 8.0f;
  c.rope.low_freq_factor = 1.0f;
  c.rope.high_freq_factor = 4.0f;
  c.rope.original_max_position = 8192;
  const std::vector<float> f = llama3_rope_factors(c);
  ASSERT_EQ(f.size(), 64u);
  for (int i = 0; i < 29; ++i) EXPECT_EQ(f[i], 1.0f) << i;
  const float smooth[] = {1.207484f, 1.553415f, 2.026313f, 2.69453f, 3.684253f, 5.257327f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(f[29 + i], smooth[i], 2e-5f) << 29 + i;
  for (int i = 35; i < 64; ++i) EXPECT_EQ(f[i], 8.0f) << i;
}

TEST(GgufExport, LlamaRopeScalingAndQwenStyleTokenizerKeys) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  TempDir dir;
  const std::string model = dir.copy_stories("scaled");
  edit_json(model + "/config.json", [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  });
  edit_json(model + "/tokenizer_config.json", [](nlohmann::json& j) {
    j["chat_template"] = "{{ messages[0]['content'] }}";
    j["pad_token"] = "<unk>";
  });
  const std::string out = dir.file("scaled.gguf");
  export_gguf(model, out);
  const gguf::Reader r(out);
  EXPECT_EQ(r.tensors()[0].name, "rope_freqs.weight");
  EXPECT_EQ(r.tensors()[0].type, GgmlType::kF32);
  EXPECT_EQ(r.tensors()[0].ne, (std::vector<uint64_t>{4}));  // head_dim 8 -> 4 pairs
  EXPECT_EQ(r.get("tokenizer.chat_template").str(), "{{ messages[0]['content'] }}");
  EXPECT_EQ(r.get("tokenizer.ggml.padding_token_id").to_u64(), 0u);
  EXPECT_EQ(r.find("llama.rope.scaling.type"), nullptr);  // llama3 is carried by rope_freqs

  const std::string linear = dir.copy_stories("linear");
  edit_json(linear + "/config.json", [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  });
  export_gguf(linear, dir.file("linear.gguf"));
  const gguf::Reader l(dir.file("linear.gguf"));
  EXPECT_EQ(l.get("llama.rope.scaling.type").str(), "linear");
  EXPECT_EQ(l.get("llama.rope.scaling.factor").to_f64(), 2.0);
  EXPECT_EQ(l.find_tensor("rope_freqs.weight"), nullptr);
}

// DeepSeek-V3.2 goes out as llama.cpp's deepseek32: deepseek2's MLA layout plus the
// lightning indexer's three keys and five tensors per layer, stored as the checkpoint has them.
TEST(GgufExport, DeepseekV32WritesTheIndexer) {
  TempDir dir;
  const std::string model =
      test::generate_model(dir.path() / "v32",
                           "--arch deepseek_v32 --hidden 64 --layers 2 --heads 2 --q-lora-rank 24 --kv-lora-rank 32"
                           " --qk-nope-dim 16 --qk-rope-dim 8 --v-head-dim 16 --experts 4 --experts-per-tok 2"
                           " --moe-ffn 32 --first-dense 1 --index-heads 3 --index-head-dim 64 --index-topk 16"
                           " --vocab 300 --dtype f32 --no-mtp --seed 7");
  const std::string out = dir.file("v32.gguf");
  GgufExportOptions options;
  options.out_type = GgufOutType::kF32;
  export_gguf(model, out, options);
  const gguf::Reader r(out);
  EXPECT_EQ(r.get("general.architecture").str(), "deepseek32");
  EXPECT_EQ(r.get("deepseek32.attention.indexer.head_count").to_u64(), 3u);
  EXPECT_EQ(r.get("deepseek32.attention.indexer.key_length").to_u64(), 64u);
  EXPECT_EQ(r.get("deepseek32.attention.indexer.top_k").to_u64(), 16u);
  EXPECT_EQ(r.get("deepseek32.attention.kv_lora_rank").to_u64(), 32u);
  EXPECT_EQ(r.get("deepseek32.rope.dimension_count").to_u64(), 8u);
  const WeightStore src = WeightStore::open(model);
  struct Expect {
    const char* gguf;
    const char* hf;
    std::vector<uint64_t> ne;
  };
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".", p = "model.layers." + std::to_string(l) + ".self_attn.";
    for (const Expect& e : {Expect{"indexer.attn_q_b.weight", "indexer.wq_b.weight", {24, 3 * 64}},
                            Expect{"indexer.attn_k.weight", "indexer.wk.weight", {64, 64}},
                            Expect{"indexer.k_norm.weight", "indexer.k_norm.weight", {64}},
                            Expect{"indexer.k_norm.bias", "indexer.k_norm.bias", {64}},
                            Expect{"indexer.proj.weight", "indexer.weights_proj.weight", {64, 3}}}) {
      const gguf::Tensor& t = r.tensor(b + e.gguf);
      EXPECT_EQ(t.ne, e.ne) << t.name;
      ASSERT_EQ(t.type, GgmlType::kF32) << t.name;
      const TensorInfo& s = src.get(p + e.hf);
      ASSERT_EQ(t.nbytes, s.nbytes) << t.name;
      EXPECT_EQ(std::memcmp(t.data, s.data, t.nbytes), 0) << t.name << " differs from " << p + e.hf;
    }
  }
  EXPECT_NE(r.find_tensor("blk.1.attn_k_b.weight"), nullptr);
  // llama.cpp's deepseek32 rotates indexer keys by a Hadamard matrix it has for 64, 128, ...
  edit_json(model + "/config.json", [](nlohmann::json& j) { j["index_head_dim"] = 48; });
  EXPECT_NE(error_of([&] { export_gguf(model, dir.file("bad.gguf")); }).find("power of two"), std::string::npos);
}

TEST(GgufExport, UntiedWithoutLmHeadIsAnError) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  TempDir dir;
  const std::string model = dir.copy_stories("untied");
  edit_json(model + "/config.json", [](nlohmann::json& j) { j["tie_word_embeddings"] = false; });
  EXPECT_NE(error_of([&] { export_gguf(model, dir.file("x.gguf")); }).find("lm_head.weight"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
}

TEST(GgufExport, ClearErrors) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  TempDir dir;
  EXPECT_FALSE(error_of([&] { export_gguf(dir.file("nope"), dir.file("a.gguf")); }).empty());

  const std::string model = dir.copy_stories("bad");
  edit_json(model + "/config.json", [](nlohmann::json& j) { j["model_type"] = "qwen3_moe"; });
  EXPECT_FALSE(error_of([&] { export_gguf(model, dir.file("b.gguf")); }).empty());

  const std::string no_tok = dir.copy_stories("notok");
  fs::remove(no_tok + "/tokenizer.json");
  EXPECT_NE(error_of([&] { export_gguf(no_tok, dir.file("c.gguf")); }).find("tokenizer.json"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir.file("c.gguf")));

  EXPECT_THROW(parse_gguf_out_type("q4"), Error);
  EXPECT_EQ(parse_gguf_out_type("bf16"), GgufOutType::kBF16);
}

}  // namespace
}  // namespace infera
