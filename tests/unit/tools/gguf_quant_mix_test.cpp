// llama-quantize's per-tensor type choice (tools/gguf_quant_mix.h) on hand-made tensor lists:
// the rules that matter most, without llama.cpp (tests/conformance/gguf_quantize.mjs checks
// the whole choice, and the bytes, against llama.cpp itself).
#include "infera/tools/gguf_quant_mix.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace infera {
namespace {

using gguf::GgmlType;

// A llama-shaped model: `layers` blocks, hidden H, ffn F, untied unless `tied`.
std::vector<QuantMixTensor> llama_tensors(int layers, uint64_t H, uint64_t F, bool tied) {
  std::vector<QuantMixTensor> t;
  t.push_back({"token_embd.weight", {H, 512}});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    t.push_back({p + "attn_norm.weight", {H}});
    for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_output"}) t.push_back({p + n + ".weight", {H, H}});
    t.push_back({p + "ffn_gate.weight", {H, F}});
    t.push_back({p + "ffn_up.weight", {H, F}});
    t.push_back({p + "ffn_down.weight", {F, H}});
  }
  t.push_back({"output_norm.weight", {H}});
  if (!tied) t.push_back({"output.weight", {H, 512}});
  return t;
}

std::map<std::string, GgmlType> choose(QuantMix mix, const QuantMixModel& m, const std::vector<QuantMixTensor>& t) {
  const std::vector<GgmlType> types = choose_mix_types(mix, m, t);
  std::map<std::string, GgmlType> out;
  for (size_t i = 0; i < t.size(); ++i) out[t[i].name] = types[i];
  return out;
}

TEST(GgufQuantMix, Q4KMGivesMoreBitsToSomeLayersAndTheOutput) {
  const QuantMixModel m{false, 8, 4, 4, 0, false};
  const auto ty = choose(QuantMix::kQ4_K_M, m, llama_tensors(8, 256, 512, false));
  // use_more_bits over 8 layers: 0 (first eighth), 3 and 6 (every third), 7 (last eighth).
  for (int l = 0; l < 8; ++l) {
    const bool more = l == 0 || l == 3 || l == 6 || l == 7;
    const std::string p = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(ty.at(p + "attn_v.weight"), more ? GgmlType::kQ6_K : GgmlType::kQ4_K) << l;
    EXPECT_EQ(ty.at(p + "ffn_down.weight"), more ? GgmlType::kQ6_K : GgmlType::kQ4_K) << l;
    EXPECT_EQ(ty.at(p + "attn_q.weight"), GgmlType::kQ4_K);
    EXPECT_EQ(ty.at(p + "attn_norm.weight"), GgmlType::kF32);  // never quantized
  }
  EXPECT_EQ(ty.at("output.weight"), GgmlType::kQ6_K);
  EXPECT_EQ(ty.at("token_embd.weight"), GgmlType::kQ4_K);
}

TEST(GgufQuantMix, RowsNotWholeBlocksFallBack) {
  const QuantMixModel m{false, 2, 4, 1, 0, false};
  // H = 96: not 256-blocks (Q4_K -> Q5_0, tied output Q6_K -> Q8_0); F = 200: not even 32.
  const auto ty = choose(QuantMix::kQ4_K_M, m, llama_tensors(2, 96, 200, true));
  EXPECT_EQ(ty.at("blk.0.attn_q.weight"), GgmlType::kQ5_0);
  EXPECT_EQ(ty.at("blk.1.ffn_down.weight"), GgmlType::kF16);
  EXPECT_EQ(ty.at("token_embd.weight"), GgmlType::kQ8_0);  // tied: quantized as the output
  const auto xs = choose(QuantMix::kIQ4_XS, m, llama_tensors(2, 96, 256, true));
  EXPECT_EQ(xs.at("blk.1.attn_q.weight"), GgmlType::kIQ4_NL);
  EXPECT_EQ(xs.at("blk.1.ffn_down.weight"), GgmlType::kIQ4_XS);
  const auto k6 = choose(QuantMix::kQ6_K, m, llama_tensors(2, 96, 256, true));
  EXPECT_EQ(k6.at("blk.0.attn_k.weight"), GgmlType::kQ8_0);
}

TEST(GgufQuantMix, ExpertsRoutersAndGqa) {
  // 8 experts: attn_v / attn_k Q8_0, attn_output Q5_K; routers never quantized; ffn_down
  // of the experts takes its layer from the name.
  QuantMixModel m{false, 8, 8, 2, 8, false};
  std::vector<QuantMixTensor> t;
  for (int l = 0; l < 8; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    t.push_back({p + "attn_v.weight", {256, 128}});
    t.push_back({p + "attn_k.weight", {256, 128}});
    t.push_back({p + "attn_output.weight", {256, 256}});
    t.push_back({p + "ffn_gate_inp.weight", {256, 8}});
    t.push_back({p + "ffn_down_exps.weight", {256, 256, 8}});
  }
  const auto ty = choose(QuantMix::kQ4_K_M, m, t);
  EXPECT_EQ(ty.at("blk.2.attn_v.weight"), GgmlType::kQ8_0);
  EXPECT_EQ(ty.at("blk.2.attn_k.weight"), GgmlType::kQ8_0);
  EXPECT_EQ(ty.at("blk.2.attn_output.weight"), GgmlType::kQ5_K);
  EXPECT_EQ(ty.at("blk.2.ffn_gate_inp.weight"), GgmlType::kF32);
  EXPECT_EQ(ty.at("blk.3.ffn_down_exps.weight"), GgmlType::kQ6_K);
  EXPECT_EQ(ty.at("blk.4.ffn_down_exps.weight"), GgmlType::kQ4_K);
  // IQ4_XS with 4 query heads per KV head: attn_v Q5_K (without experts); the first eighth
  // of ffn_down Q5_K, but not with an importance matrix.
  m = {false, 8, 8, 2, 0, false};
  const auto iq = choose(QuantMix::kIQ4_XS, m, llama_tensors(8, 256, 256, false));
  EXPECT_EQ(iq.at("blk.5.attn_v.weight"), GgmlType::kQ5_K);
  EXPECT_EQ(iq.at("blk.0.ffn_down.weight"), GgmlType::kQ5_K);
  EXPECT_EQ(iq.at("blk.1.ffn_down.weight"), GgmlType::kIQ4_XS);
  m.has_imatrix = true;
  EXPECT_EQ(choose(QuantMix::kIQ4_XS, m, llama_tensors(8, 256, 256, false)).at("blk.0.ffn_down.weight"),
            GgmlType::kIQ4_XS);
}

TEST(GgufQuantMix, Llama70bGivesAttnVQ5K) {
  // Q4_K_S: attn_v Q5_K in the first 4 layers; in llama.cpp's 70B type in every layer.
  const auto t = llama_tensors(80, 256, 256, false);
  EXPECT_EQ(choose(QuantMix::kQ4_K_S, {false, 80, 64, 8, 0, false}, t).at("blk.9.attn_v.weight"), GgmlType::kQ4_K);
  EXPECT_EQ(choose(QuantMix::kQ4_K_S, {true, 80, 64, 8, 0, false}, t).at("blk.9.attn_v.weight"), GgmlType::kQ5_K);
  EXPECT_EQ(choose(QuantMix::kQ4_K_S, {true, 80, 64, 8, 0, false}, t).at("blk.2.attn_v.weight"), GgmlType::kQ5_K);
}

TEST(GgufQuantMix, NamesAndWhatIsQuantized) {
  EXPECT_EQ(parse_quant_mix("q4_k_m"), QuantMix::kQ4_K_M);
  EXPECT_EQ(parse_quant_mix("iq4_xs"), QuantMix::kIQ4_XS);
  EXPECT_FALSE(parse_quant_mix("q3_k_m").has_value());
  EXPECT_FALSE(mix_quantizes({"blk.0.ssm_conv1d.weight", {4, 256}}));
  EXPECT_FALSE(mix_quantizes({"blk.0.attn_norm.weight", {256, 1}}));
  EXPECT_FALSE(mix_quantizes({"rope_freqs.weight", {32}}));
  EXPECT_FALSE(mix_quantizes({"blk.0.attn_q.bias", {256, 256}}));
  EXPECT_TRUE(mix_quantizes({"blk.0.attn_k_b.weight", {32, 64, 4}}));
}

}  // namespace
}  // namespace infera
