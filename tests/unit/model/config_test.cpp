#include "infera/model/config.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/model/arch_registry.h"

namespace infera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kStoriesDir = test::stories_dir();

// stories260K's config.json as published (a small llama: GQA, tied embeddings).
json stories_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 5,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8, "hidden_act": "silu",
    "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "rope_scaling": null, "attention_bias": false, "attention_dropout": 0.0, "mlp_bias": false,
    "initializer_range": 0.02, "pretraining_tp": 1, "tie_word_embeddings": true,
    "bos_token_id": 1, "eos_token_id": 2, "use_cache": true, "torch_dtype": "float32"
  })");
}

using test::error_of;

// Qwen3-32B's config.json (the fields transformers reads; numbers as published).
json qwen3_32b() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
    "intermediate_size": 25600, "max_position_embeddings": 40960, "max_window_layers": 64,
    "num_attention_heads": 64, "num_hidden_layers": 64, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

json qwen3_30b_a3b() {
  json j = qwen3_32b();
  j["model_type"] = "qwen3_moe";
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["hidden_size"] = 2048;
  j["num_hidden_layers"] = 48;
  j["num_attention_heads"] = 32;
  j["num_key_value_heads"] = 4;
  j["intermediate_size"] = 6144;
  j["num_experts"] = 128;
  j["num_experts_per_tok"] = 8;
  j["moe_intermediate_size"] = 768;
  j["norm_topk_prob"] = true;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = json::array();
  j["router_aux_loss_coef"] = 0.001;
  return j;
}

TEST(ModelConfig, Stories260K) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  const ModelConfig c = load_model_config(kStoriesDir);
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_STREQ(arch_name(c.arch), "llama");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope.theta, 10000.0f);
  EXPECT_EQ(c.rope.rotary_dim, 8);
  EXPECT_EQ(c.rope.scaling, RopeScaling::kNone);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(c.torch_dtype, "float32");
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_FALSE(c.is_moe_layer(0));
}

TEST(ModelConfig, Qwen3_32B) {
  const ModelConfig c = parse_model_config(qwen3_32b(), "qwen3/config.json");
  EXPECT_EQ(c.arch, Arch::kQwen3);
  EXPECT_STREQ(arch_name(c.arch), "qwen3");
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.num_layers, 64);
  EXPECT_EQ(c.num_heads, 64);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // explicit: 64 * 128 = 8192 != hidden 5120
  EXPECT_EQ(c.intermediate_size, 25600);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_FLOAT_EQ(c.rope.theta, 1e6f);
  EXPECT_EQ(c.rope.rotary_dim, 128);
  EXPECT_EQ(c.rope.scaling, RopeScaling::kNone);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{151645});
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfig, Defaults) {
  json j = qwen3_32b();
  for (const char* key : {"num_key_value_heads", "rope_theta", "rms_norm_eps", "tie_word_embeddings", "bos_token_id",
                          "eos_token_id", "max_position_embeddings", "head_dim"}) {
    j.erase(key);
  }
  ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.num_kv_heads, 64);  // = num_attention_heads
  EXPECT_FLOAT_EQ(c.rope.theta, 1e4f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.max_position_embeddings, 32768);  // Qwen3Config default
  EXPECT_EQ(c.head_dim, 128);  // Qwen3Config default

  j["model_type"] = "llama";
  c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.head_dim, 5120 / 64);  // llama: hidden / heads
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.qk_norm);

  j["partial_rotary_factor"] = 0.25;
  j["eos_token_id"] = {128001, 128008, 128009};
  j["tie_word_embeddings"] = true;
  j["unknown_future_field"] = {{"anything", 1}};
  c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.rope.rotary_dim, 80 / 4);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_TRUE(c.tie_word_embeddings);
}

TEST(ModelConfig, Qwen3Moe) {
  json j = qwen3_30b_a3b();
  ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.arch, Arch::kQwen3Moe);
  EXPECT_STREQ(arch_name(c.arch), "qwen3_moe");
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.qk_norm);
  for (int i = 0; i < 48; ++i) EXPECT_TRUE(c.is_moe_layer(i)) << i;

  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3, 5};
  c = parse_model_config(j, "config.json");
  // MoE iff not in mlp_only_layers and (i + 1) % step == 0.
  const std::vector<bool> expected = {false, true, false, false, false, false, false, true};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.is_moe_layer(i), expected[i]) << i;
  EXPECT_EQ(c.intermediate_size, 6144);

  // All layers MoE: the dense MLP size may be absent; with dense layers it is required.
  j = qwen3_30b_a3b();
  j.erase("intermediate_size");
  EXPECT_EQ(parse_model_config(j, "config.json").intermediate_size, 0);
  j["mlp_only_layers"] = {0};
  EXPECT_NE(error_of([&] { parse_model_config(j, "config.json"); }).find("'intermediate_size'"), std::string::npos);
}

// Qwen3-Next-80B-A3B's config.json as published (flat, no layer_types, no MTP key), and
// the Qwen3NextConfig defaults for fields a config leaves out.
TEST(ModelConfig, Qwen3NextPublishedAndDefaults) {
  json j = json::parse(R"({
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645,
    "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "moe_intermediate_size": 512, "norm_topk_prob": true,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
    "num_key_value_heads": 2, "output_router_logits": false, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 10000000, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
  ModelConfig c = parse_model_config(j, "next.json");
  EXPECT_EQ(c.arch, Arch::kQwen3Next);
  EXPECT_EQ(c.num_full_attention_layers(), 12);
  EXPECT_TRUE(c.is_linear_attention_layer(0));
  EXPECT_FALSE(c.is_linear_attention_layer(3));
  EXPECT_EQ(c.rope.rotary_dim, 64);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  EXPECT_EQ(c.mtp_num_hidden_layers, 0);  // the loader counts mtp.layers.* instead

  for (const char* key :
       {"partial_rotary_factor", "norm_topk_prob", "shared_expert_intermediate_size", "full_attention_interval"}) {
    j.erase(key);
  }
  j["shared_expert_intermediate_size"] = nullptr;
  c = parse_model_config(j, "next.json");
  EXPECT_EQ(c.rope.rotary_dim, 64);  // partial_rotary_factor defaults to 0.25
  EXPECT_TRUE(c.norm_topk_prob);  // Qwen3NextConfig default
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  EXPECT_EQ(c.num_full_attention_layers(), 12);  // full_attention_interval defaults to 4
  j["norm_topk_prob"] = false;
  EXPECT_FALSE(parse_model_config(j, "next.json").norm_topk_prob);
  // Plain Qwen3-MoE keeps transformers' false default and full-head rotary.
  json moe = j;
  moe["model_type"] = "qwen3_moe";
  moe.erase("norm_topk_prob");
  moe["head_dim"] = 128;
  const ModelConfig m = parse_model_config(moe, "moe.json");
  EXPECT_FALSE(m.norm_topk_prob);
  EXPECT_EQ(m.rope.rotary_dim, 128);
}

TEST(ModelConfig, RopeScalingLinearLlama3Yarn) {
  json j = qwen3_32b();
  j["model_type"] = "llama";
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.rope.scaling, RopeScaling::kLinear);
  EXPECT_FLOAT_EQ(c.rope.factor, 2.0f);

  // Llama 3.1's values.
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.rope.scaling, RopeScaling::kLlama3);
  EXPECT_FLOAT_EQ(c.rope.theta, 500000.0f);
  EXPECT_FLOAT_EQ(c.rope.factor, 8.0f);
  EXPECT_FLOAT_EQ(c.rope.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c.rope.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope.original_max_position, 8192);

  // Qwen3's documented YaRN setting: attention factor 0.1 ln 4 + 1.
  j = qwen3_32b();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.rope.scaling, RopeScaling::kYarn);
  EXPECT_FLOAT_EQ(c.rope.factor, 4.0f);
  EXPECT_EQ(c.rope.original_max_position, 32768);
  EXPECT_FLOAT_EQ(c.rope.beta_fast, 32.0f);
  EXPECT_FLOAT_EQ(c.rope.beta_slow, 1.0f);
  EXPECT_NEAR(c.rope.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-6);

  // Without original_max_position_embeddings yarn falls back to max_position_embeddings.
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.5}, {"beta_fast", 16}};
  c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.rope.original_max_position, 40960);
  EXPECT_FLOAT_EQ(c.rope.attention_factor, 1.5f);
  EXPECT_FLOAT_EQ(c.rope.beta_fast, 16.0f);

  // DeepSeek-style mscale / mscale_all_dim: ratio of the two mscales.
  j["rope_scaling"] = {{"type", "yarn"},
                       {"factor", 40},
                       {"mscale", 1.0},
                       {"mscale_all_dim", 0.707},
                       {"original_max_position_embeddings", 4096}};
  c = parse_model_config(j, "config.json");
  const double m = 0.1 * 1.0 * std::log(40.0) + 1.0, m_all = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.rope.attention_factor, m / m_all, 1e-6);
  EXPECT_FLOAT_EQ(c.rope.mscale_all_dim, 0.707f);

  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(parse_model_config(j, "config.json").rope.scaling, RopeScaling::kNone);

  // transformers 5 style: rope_parameters carries theta (and type).
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000000.0}, {"partial_rotary_factor", 0.5}};
  c = parse_model_config(j, "config.json");
  EXPECT_FLOAT_EQ(c.rope.theta, 5e6f);
  EXPECT_EQ(c.rope.rotary_dim, 64);
  EXPECT_EQ(c.rope.scaling, RopeScaling::kNone);
}

TEST(ModelConfig, TextConfigLookup) {
  // A multimodal wrapper keeps the language model's fields under text_config; fields
  // missing there (tie_word_embeddings here) come from the top level.
  json text = qwen3_32b();
  text.erase("tie_word_embeddings");
  text.erase("model_type");
  json j = {{"model_type", "qwen3"},
            {"tie_word_embeddings", true},
            {"text_config", text},
            {"vision_config", {{"depth", 27}}}};
  ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.num_layers, 64);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.arch, Arch::kQwen3);

  // text_config wins over the top level.
  j["hidden_size"] = 1;
  EXPECT_EQ(parse_model_config(j, "config.json").hidden_size, 5120);
}

struct BadConfig {
  const char* label;
  std::function<void(json&)> edit;
  std::vector<std::string> needles;
};

TEST(ModelConfig, BadConfigsNameTheField) {
  const std::vector<BadConfig> cases = {
      {"missing hidden_size", [](json& j) { j.erase("hidden_size"); }, {"required field 'hidden_size' is missing"}},
      {"missing num_hidden_layers", [](json& j) { j.erase("num_hidden_layers"); }, {"'num_hidden_layers' is missing"}},
      {"missing num_attention_heads",
       [](json& j) { j.erase("num_attention_heads"); },
       {"'num_attention_heads' is missing"}},
      {"missing intermediate_size", [](json& j) { j.erase("intermediate_size"); }, {"'intermediate_size' is missing"}},
      {"missing vocab_size", [](json& j) { j.erase("vocab_size"); }, {"'vocab_size' is missing"}},
      {"null vocab_size", [](json& j) { j["vocab_size"] = nullptr; }, {"'vocab_size' is missing"}},
      {"missing model_type",
       [](json& j) { j.erase("model_type"); },
       {"'model_type' is missing", "llama, qwen3, qwen3_moe"}},
      {"string hidden_size",
       [](json& j) { j["hidden_size"] = "64"; },
       {"field 'hidden_size' must be an integer", "\"64\""}},
      {"fractional head_dim", [](json& j) { j["head_dim"] = 8.5; }, {"field 'head_dim' must be an integer"}},
      {"bool vocab", [](json& j) { j["vocab_size"] = true; }, {"field 'vocab_size' must be an integer"}},
      {"string eps", [](json& j) { j["rms_norm_eps"] = "1e-5"; }, {"field 'rms_norm_eps' must be a number"}},
      {"string tie",
       [](json& j) { j["tie_word_embeddings"] = "true"; },
       {"field 'tie_word_embeddings' must be true or false"}},
      {"string eos", [](json& j) { j["eos_token_id"] = "2"; }, {"field 'eos_token_id'"}},
      {"eos list of strings", [](json& j) { j["eos_token_id"] = {"2"}; }, {"field 'eos_token_id'"}},
      {"unknown model_type",
       [](json& j) { j["model_type"] = "gpt2"; },
       {"unsupported model_type 'gpt2'", "llama, qwen3, qwen3_moe"}},
      {"zero hidden", [](json& j) { j["hidden_size"] = 0; }, {"field 'hidden_size' must be positive"}},
      {"negative layers", [](json& j) { j["num_hidden_layers"] = -3; }, {"field 'num_hidden_layers' must be positive"}},
      {"huge vocab", [](json& j) { j["vocab_size"] = 1ll << 40; }, {"field 'vocab_size' is out of range"}},
      {"heads not dividing hidden",
       [](json& j) {
         j["num_attention_heads"] = 7;
         j.erase("head_dim");
         j["num_key_value_heads"] = 7;
       },
       {"hidden_size (64) is not divisible by num_attention_heads (7)"}},
      {"kv heads not dividing heads",
       [](json& j) { j["num_key_value_heads"] = 3; },
       {"num_attention_heads (8) must be a multiple of num_key_value_heads (3)"}},
      {"bad eps", [](json& j) { j["rms_norm_eps"] = 0; }, {"'rms_norm_eps' must be in (0, 1)"}},
      {"bad rope theta", [](json& j) { j["rope_theta"] = -1; }, {"'rope_theta' must be positive"}},
      {"odd rotary dims",
       [](json& j) { j["partial_rotary_factor"] = 0.375; },
       {"partial_rotary_factor", "positive even"}},
      {"rope_scaling not object",
       [](json& j) { j["rope_scaling"] = "yarn"; },
       {"field 'rope_scaling' must be an object"}},
      {"rope_scaling without type",
       [](json& j) {
         j["rope_scaling"] = {{"factor", 2.0}};
       },
       {"'rope_scaling' has no 'rope_type'"}},
      {"unsupported rope type",
       [](json& j) {
         j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
       },
       {"unsupported rope type 'dynamic'", "default, linear, llama3, yarn"}},
      {"linear without factor",
       [](json& j) {
         j["rope_scaling"] = {{"type", "linear"}};
       },
       {"'rope_scaling.factor' is required"}},
      {"llama3 missing low_freq_factor",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 8.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192}};
       },
       {"'rope_scaling.low_freq_factor' is required for rope type 'llama3'"}},
      {"yarn string factor",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", "4"}};
       },
       {"'rope_scaling.factor' must be a number"}},
      {"gelu", [](json& j) { j["hidden_act"] = "gelu"; }, {"'hidden_act' is 'gelu'"}},
      {"sliding window", [](json& j) { j["use_sliding_window"] = true; }, {"'use_sliding_window'"}},
      {"not an object", [](json& j) { j = json::array(); }, {"expected a JSON object"}},
  };
  const json base = stories_config();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    json j = base;
    c.edit(j);
    const std::string msg = error_of([&] { parse_model_config(j, "dir/config.json"); });
    EXPECT_NE(msg.find("dir/config.json"), std::string::npos) << msg;
    for (const auto& n : c.needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg << "\nmissing: " << n;
  }
  // The unedited base parses (so every failure above comes from its edit).
  EXPECT_NO_THROW(parse_model_config(base, "dir/config.json"));
}

TEST(ModelConfig, BadMoeConfigs) {
  const std::vector<BadConfig> cases = {
      {"missing num_experts", [](json& j) { j.erase("num_experts"); }, {"'num_experts' is missing"}},
      {"missing moe size", [](json& j) { j.erase("moe_intermediate_size"); }, {"'moe_intermediate_size' is missing"}},
      {"top-k above experts",
       [](json& j) { j["num_experts_per_tok"] = 200; },
       {"num_experts_per_tok (200) exceeds num_experts (128)"}},
      {"mlp_only_layers out of range",
       [](json& j) { j["mlp_only_layers"] = {48}; },
       {"'mlp_only_layers' holds layer 48"}},
      {"mlp_only_layers not a list", [](json& j) { j["mlp_only_layers"] = 3; }, {"'mlp_only_layers' must be a list"}},
      {"zero sparse step", [](json& j) { j["decoder_sparse_step"] = 0; }, {"'decoder_sparse_step' must be positive"}},
      // Counts that would size the tensor table far beyond any checkpoint (a million layers
      // listed minutes and gigabytes of tensors before the first missing one was reported).
      {"a million layers",
       [](json& j) { j["num_hidden_layers"] = 1000000; },
       {"1000000 layers (1000000 + 0 MTP); Infera reads models of at most 1024 layers"}},
      {"experts in all",
       [](json& j) {
         j["num_hidden_layers"] = 1000;
         j["num_experts"] = 1000;
       },
       {"1000 layers x 1000 experts; Infera reads models of at most 262144 experts in all"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    json j = qwen3_30b_a3b();
    c.edit(j);
    const std::string msg = error_of([&] { parse_model_config(j, "moe/config.json"); });
    for (const auto& n : c.needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg << "\nmissing: " << n;
  }
}

TEST(ModelConfig, LoadErrors) {
  const fs::path dir = fs::temp_directory_path() / ("infera_config_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  EXPECT_NE(error_of([&] { load_model_config(dir.string()); }).find("model directory not found"), std::string::npos);
  fs::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  std::string msg = error_of([&] { load_model_config(dir.string()); });
  EXPECT_EQ(msg,
            path + ": cannot read it (a Hugging Face model directory needs config.json): No such file or directory");
  fs::create_directory(path);
  msg = error_of([&] { load_model_config(dir.string()); });
  EXPECT_NE(msg.find("needs config.json): it is a directory"), std::string::npos) << msg;
  fs::remove(path);

  std::ofstream(path) << "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 64,,\n}";
  msg = error_of([&] { load_model_config(dir.string()); });
  EXPECT_NE(msg.find(path + ": malformed JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("[json.exception"), std::string::npos) << msg;

  std::ofstream(path) << R"({"model_type": "llama", "hidden_size": 64})";
  msg = error_of([&] { load_model_config(dir.string()); });
  EXPECT_NE(msg.find(path + ": required field 'num_hidden_layers' is missing"), std::string::npos) << msg;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace infera
