// `infera quantize` on a generated deepseek_v3 checkpoint: the family's default recipe
// (attention w8a8, routed experts w4a8, MTP experts w8a8, router and kv_b_proj float)
// says what went where in its per-layer table, loads, and stays close to the float model;
// --recipe uniform puts every layer in --scheme.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/model/model.h"
#include "infera/model/quantized_weights.h"
#include "infera/quant/quantize_model.h"

namespace infera::quant {
namespace {

namespace fs = std::filesystem;

const fs::path kWork = test::process_scratch_dir("infera_quant_deepseek_test");

std::vector<float> all_logits(const std::string& dir, const std::vector<int32_t>& tokens) {
  return test::model_logits(dir, tokens, true);
}

const LayerReport* find(const QuantizeReport& r, const std::string& name) {
  for (const LayerReport& l : r.layers) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

TEST(QuantDeepseek, RecipeByLayerKindAndCloseToFloat) {
  const std::string dir =
      test::generate_model(kWork / "ds",
                           "--arch deepseek_v3 --layers 2 --experts 8 --n-group 4 --topk-group 2 --vocab 300 --seed 8");
  const fs::path out = kWork / "ds_recipe";
  QuantizeOptions o;  // --scheme w8a8, --recipe auto
  const QuantizeReport r = quantize_model(dir, out.string(), o);
  ASSERT_NE(find(r, "model.layers.1.mlp.experts.3.up_proj.weight"), nullptr);
  EXPECT_EQ(find(r, "model.layers.1.mlp.experts.3.up_proj.weight")->label, "w4a8 g32");
  EXPECT_EQ(find(r, "model.layers.1.self_attn.q_b_proj.weight")->label, "w8a8");
  EXPECT_EQ(find(r, "model.layers.1.mlp.shared_experts.down_proj.weight")->label, "w8a8");
  EXPECT_EQ(find(r, "model.layers.0.mlp.gate_proj.weight")->label, "w8a8");  // the dense first layer
  EXPECT_EQ(find(r, "model.layers.2.mlp.experts.0.gate_proj.weight")->label, "w8a8");  // MTP experts
  EXPECT_EQ(find(r, "model.layers.1.self_attn.kv_b_proj.weight"), nullptr);  // float role: copied
  EXPECT_EQ(find(r, "model.layers.1.mlp.gate.weight"), nullptr);  // the router
  EXPECT_NE(find(r, "model.layers.1.mlp.experts.3.up_proj.weight")->reason.find("recipe"), std::string::npos);
  const QuantizationConfig qc = read_quantization_config(out.string());
  EXPECT_EQ(qc.layer("model.layers.1.mlp.experts.3.down_proj.weight").scheme, kernels::QuantScheme::kW4A8);

  const std::vector<int32_t> tokens = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38};
  const std::vector<float> f = all_logits(dir, tokens), q = all_logits(out.string(), tokens);
  ASSERT_EQ(f.size(), q.size());
  const int64_t V = 300, T = static_cast<int64_t>(tokens.size());
  int same = 0;
  double err = 0.0, norm = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const float* a = f.data() + t * V;
    const float* b = q.data() + t * V;
    same += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
    for (int64_t i = 0; i < V; ++i) {
      err += (a[i] - b[i]) * (a[i] - b[i]);
      norm += a[i] * a[i];
    }
  }
  EXPECT_LT(std::sqrt(err / norm), 0.1);  // relative RMS error of the logits
  EXPECT_GE(same, T - 2);

  QuantizeOptions u;
  u.recipe = QuantRecipe::kUniform;
  const QuantizeReport ru = quantize_model(dir, (kWork / "ds_uniform").string(), u);
  EXPECT_EQ(find(ru, "model.layers.1.mlp.experts.3.up_proj.weight")->label, "w8a8");
  EXPECT_THROW(parse_quant_recipe("ascend"), Error);
}

}  // namespace
}  // namespace infera::quant
