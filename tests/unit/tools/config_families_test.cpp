// config.json of the hybrid (Qwen3-Next / Qwen3.5) and MLA (DeepSeek-V3) families, read from
// the published configs shipped in examples/configs.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/model/arch_registry.h"
#include "infera/model/config.h"

namespace infera {
namespace {

using json = nlohmann::json;

json read_json(const std::string& name) {
  const std::string path = std::string(INFERA_SOURCE_DIR) + "/examples/configs/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

ModelConfig parse_example(const std::string& name) { return parse_model_config(read_json(name), name); }

TEST(ConfigFamilies, Qwen35MoeNestedTextConfig) {
  const ModelConfig c = parse_example("Qwen3.5-35B-A3B.json");
  EXPECT_EQ(c.arch, Arch::kQwen35Moe);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_layers, 40);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rope.rotary_dim, 64);
  EXPECT_FLOAT_EQ(c.partial_rotary_factor, 0.25f);
  EXPECT_FLOAT_EQ(c.rope.theta, 1e7f);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_EQ(c.num_full_attention_layers(), 10);
  EXPECT_TRUE(c.is_linear_attention_layer(0));
  EXPECT_FALSE(c.is_linear_attention_layer(3));
  EXPECT_EQ(c.linear_num_key_heads, 16);
  EXPECT_EQ(c.linear_num_value_heads, 32);
  EXPECT_EQ(c.linear_key_head_dim, 128);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 512);
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_EQ(c.num_mtp_layers(), 1);
  EXPECT_EQ(c.mamba_ssm_dtype, "float32");
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.kv_values_per_token_per_layer(), 2 * 2 * 256);
  for (int i = 0; i < c.num_layers; ++i) EXPECT_TRUE(c.is_moe_layer(i)) << i;
}

TEST(ConfigFamilies, Qwen35DenseAndInterval) {
  json j = read_json("Qwen3.5-27B.json");
  ModelConfig c = parse_model_config(j, "27B");
  EXPECT_EQ(c.arch, Arch::kQwen35);
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_EQ(c.intermediate_size, 17408);
  EXPECT_EQ(c.linear_num_value_heads, 48);
  EXPECT_EQ(c.num_full_attention_layers(), 16);
  // Without layer_types, full_attention_interval decides.
  j["text_config"].erase("layer_types");
  j["text_config"]["full_attention_interval"] = 2;
  c = parse_model_config(j, "27B");
  EXPECT_EQ(c.full_attention_interval, 2);
  EXPECT_EQ(c.num_full_attention_layers(), 32);
  EXPECT_TRUE(c.is_linear_attention_layer(0));
  EXPECT_FALSE(c.is_linear_attention_layer(1));
}

TEST(ConfigFamilies, Qwen3NextFlat) {
  json j = read_json("Qwen3.5-35B-A3B.json")["text_config"];
  j["model_type"] = "qwen3_next";
  j.erase("mtp_num_hidden_layers");
  j.erase("layer_types");
  j["rope_theta"] = 1e7;
  const ModelConfig c = parse_model_config(j, "next");
  EXPECT_EQ(c.arch, Arch::kQwen3Next);
  EXPECT_EQ(c.full_attention_interval, 4);
  EXPECT_EQ(c.num_full_attention_layers(), 10);
  EXPECT_EQ(c.mtp_num_hidden_layers, 0);
}

TEST(ConfigFamilies, HybridErrors) {
  json j = read_json("Qwen3.5-27B.json");
  j["text_config"]["layer_types"].erase(0);
  try {
    parse_model_config(j, "x.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'layer_types' lists 63 layers but num_hidden_layers is 64"),
              std::string::npos)
        << e.what();
  }
  j = read_json("Qwen3.5-27B.json");
  j["text_config"]["layer_types"][0] = "sliding_attention";
  EXPECT_THROW(parse_model_config(j, "x.json"), Error);
}

TEST(ConfigFamilies, DeepseekV3Mla) {
  const ModelConfig c = parse_example("DeepSeek-V3.json");
  EXPECT_EQ(c.arch, Arch::kDeepseekV3);
  EXPECT_TRUE(c.mla);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.head_dim, 192);
  EXPECT_EQ(c.rope.rotary_dim, 64);
  EXPECT_EQ(c.rope.scaling, RopeScaling::kYarn);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.intermediate_size, 18432);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.5f);
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.kv_values_per_token_per_layer(), 576);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(60));
}

TEST(ConfigFamilies, DenseFamiliesUnchanged) {
  const ModelConfig llama = parse_example("DeepSeek-R1-Distill-Llama-70B.json");
  EXPECT_EQ(llama.arch, Arch::kLlama);
  EXPECT_EQ(llama.head_dim, 128);
  EXPECT_EQ(llama.num_full_attention_layers(), 80);
  EXPECT_EQ(llama.kv_values_per_token_per_layer(), 2 * 8 * 128);
  const ModelConfig moe = parse_example("Qwen3-30B-A3B.json");
  EXPECT_EQ(moe.arch, Arch::kQwen3Moe);
  EXPECT_EQ(moe.num_full_attention_layers(), 48);
  EXPECT_EQ(moe.shared_expert_intermediate_size, 0);
}

}  // namespace
}  // namespace infera
