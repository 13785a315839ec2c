// Whole checkpoints in GPTQ, AWQ and msModelSlim layouts, written by tools/prequant_write_gptq_awq_slim.py
// from the trained stories260K model and from a generated Qwen3-MoE: every quantized layer
// binds to the weights the writer says it stands for (its --dequant-dir), the logits stay
// within stated bounds of that dequantized f32 model and of the original, greedy output
// matches where the bound implies it, and broken files are refused with a clear message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../runtime/greedy_reference.h"
#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/model/model.h"
#include "infera/model/prequant.h"
#include "infera/model/quantized_weights.h"
#include "infera/model/tensor_table.h"
#include "infera/quant/quantize_model.h"
#include "infera/tools/eval.h"
#include "infera/tools/model_check.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

const fs::path kScratch = test::process_scratch_dir("infera_prequant_int_test");

// OUT (the checkpoint) and OUT-ref (its dequantized f32 twin), written once per process.
std::string write(const std::string& model, const std::string& name, const std::string& args) {
  const fs::path out = kScratch / name;
  if (!fs::exists(out / "config.json")) {
    const std::string cmd = "/usr/bin/python3 " + std::string(INFERA_SOURCE_DIR) +
                            "/tools/prequant_write_gptq_awq_slim.py " + model + " " + out.string() + " " + args +
                            " --dequant-dir " + out.string() + "-ref > /dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  return out.string();
}

std::string moe_model() {
  return test::generate_model(kScratch / "moe",
                              "--arch qwen3_moe --hidden 128 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 "
                              "--experts 4 --experts-per-tok 2 --moe-ffn 64 --vocab 300 --seed 7");
}

// Every quantized layer of `dir` dequantized (through the bound kernel weight) against the
// writer's reference, within rel (0: exactly). Returns the number of layers compared.
int compare_layers(const std::string& dir, float rel) {
  auto src = PrequantSource::open(dir);
  EXPECT_TRUE(src != nullptr) << dir;
  if (!src) return 0;
  const WeightStore ref = WeightStore::open(dir + "-ref");
  int compared = 0;
  for (const std::string& name : ref.names()) {
    const TensorInfo& r = ref.get(name);
    if (r.shape.size() != 2 || name.find("_proj") == std::string::npos || !name.ends_with(".weight")) continue;
    if (!src->format().quantizes(src->store(), name)) continue;
    TensorSpec t;
    t.name = name;
    t.shape = r.shape;
    const kernels::LinearWeight w = src->linear(t);
    EXPECT_TRUE(w.quantized) << name;
    std::vector<float> row(static_cast<size_t>(r.shape[1]));
    const auto* want = reinterpret_cast<const float*>(r.data);
    for (int64_t n = 0; n < r.shape[0]; ++n) {
      linear_row(w, n, row.data());
      for (int64_t k = 0; k < r.shape[1]; ++k) {
        const float e = want[n * r.shape[1] + k];
        if (std::fabs(row[k] - e) > rel * std::fabs(e)) {
          ADD_FAILURE() << dir << ": " << name << "[" << n << ", " << k << "] = " << row[k] << ", reference " << e;
          return compared;
        }
      }
    }
    ++compared;
  }
  return compared;
}

std::vector<float> last_logits(Model& model, const std::vector<int32_t>& prompt) {
  KvPoolShape shape = model.kv_shape(16);
  shape.num_blocks = 16;
  KvPool kv(shape);
  BlockAllocator blocks(16);
  SequenceRunner runner(model, kv, blocks, 512);
  const float* l = runner.feed(prompt);
  return std::vector<float>(l, l + model.config().vocab_size);
}
std::vector<float> last_logits(const std::string& dir, const std::vector<int32_t>& prompt) {
  return last_logits(*load_model(dir), prompt);
}

struct Diff {
  float max_abs = 0, max_ref = 0;
  float rel() const { return max_abs / max_ref; }
};
Diff diff(const std::vector<float>& a, const std::vector<float>& b) {
  Diff d;
  for (size_t i = 0; i < a.size(); ++i) {
    d.max_abs = std::max(d.max_abs, std::fabs(a[i] - b[i]));
    d.max_ref = std::max(d.max_ref, std::fabs(b[i]));
  }
  return d;
}

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 300, 285, 344, 365, 261, 430, 412};

struct FormatCase {
  const char* name;
  const char* args;
  float layer_rel;  // dequantized layer vs the writer's reference
  float vs_ref;  // logits: max |Δ| / max |logit| against the dequantized f32 model
  float vs_original;  // ... against the original model
};

class PrequantStories : public ::testing::TestWithParam<FormatCase> {};

// Bounds on stories260K (12-token prompt), from measured figures with a margin: the w4a16
// layouts differ from their dequantized twin by f32 rounding only (measured ~1.5e-6);
// w8a8 / w4a8 by the int8 rounding of the activations (per token, or static for W8A8: measured
// 2.7e-2 for W8A8_DYNAMIC, 8e-2 for static W8A8, 2e-2 for W4A8); against the original model the
// weights' own quantization error adds (int4 g32 on this 64-wide model: 0.22-0.36 of the logits'
// range, per-channel int4 0.47, W8A8 3e-2 dynamic, 8e-2 static).
INSTANTIATE_TEST_SUITE_P(
    Formats, PrequantStories,
    ::testing::Values(FormatCase{"gptq", "--format gptq --group-size 32", 0.0f, 1e-4f, 0.5f},
                      FormatCase{"gptq_act", "--format gptq --group-size 32 --desc-act --asym", 1e-6f, 1e-4f, 0.5f},
                      FormatCase{"gptq_v2", "--format gptq --group-size 64 --asym --v2", 1e-6f, 1e-4f, 0.5f},
                      FormatCase{"awq", "--format awq --group-size 32", 1e-6f, 1e-4f, 0.5f},
                      FormatCase{"slim_w8a8_dynamic", "--format slim-w8a8-dynamic", 0.0f, 0.05f, 0.1f},
                      FormatCase{"slim_w8a8", "--format slim-w8a8", 0.0f, 0.15f, 0.15f},
                      FormatCase{"slim_w8a8_i64", "--format slim-w8a8 --deq-int64", 0.0f, 0.15f, 0.15f},
                      FormatCase{"slim_w4a8", "--format slim-w4a8", 1e-3f, 0.05f, 0.75f}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_P(PrequantStories, LayersAndLogitsWithinBounds) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  const FormatCase c = GetParam();
  const std::string dir = write(test::stories_dir(), std::string("stories_") + c.name, c.args);
  EXPECT_GT(compare_layers(dir, c.layer_rel), 0);
  static const std::unique_ptr<Model> original = load_model(test::stories_dir());
  const std::unique_ptr<Model> model = load_model(dir), ref = load_model(dir + "-ref");
  const auto got = last_logits(*model, kPrompt);
  const Diff to_ref = diff(got, last_logits(*ref, kPrompt));
  const Diff to_orig = diff(got, last_logits(*original, kPrompt));
  EXPECT_LT(to_ref.rel(), c.vs_ref) << "max |Δlogit| " << to_ref.max_abs << " of " << to_ref.max_ref;
  EXPECT_LT(to_orig.rel(), c.vs_original) << "max |Δlogit| " << to_orig.max_abs << " of " << to_orig.max_ref;
  std::printf("%s: logits vs dequantized model %.2e, vs original %.2e (relative to max |logit|)\n", c.name,
              to_ref.rel(), to_orig.rel());
  if (c.vs_ref <= 1e-4f) {
    // Within 1e-4 of the dequantized model: the same greedy tokens.
    EXPECT_EQ(testing_support::greedy_alone(*model, kPrompt, 24), testing_support::greedy_alone(*ref, kPrompt, 24));
  }
}

TEST(PrequantStories, GptqAsW4A8) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  const std::string dir =
      write(test::stories_dir(), "stories_gptq_act", "--format gptq --group-size 32 --desc-act --asym");
  test::ScopedEnv env("INFERA_PREQUANT_SCHEME", "w4a8");
  EXPECT_EQ(prequant_target_from_options(), PrequantTarget::kW4A8);
  EXPECT_EQ(compare_layers(dir, 1e-6f), 20);  // still exact: int8 activations change only the arithmetic
  const Diff d = diff(last_logits(dir, kPrompt), last_logits(dir + "-ref", kPrompt));
  EXPECT_LT(d.rel(), 0.05f) << d.max_abs;  // int8 activations per token
}

// What `infera eval --ref` reports (tools::evaluate): KL from the original stories260K and top-1
// agreement over its own greedy continuation, for a GPTQ act-order and an msModelSlim
// W8A8_DYNAMIC checkpoint. Measured: GPTQ KL 5.9e-2, top-1 0.905; W8A8_DYNAMIC 1.2e-3, 1.000
// (int4 g32 on this 64-wide model moves it far more than int8); bounded with a margin.
TEST(PrequantStories, EvalAgainstTheFloatModel) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  std::unique_ptr<Model> original = load_model(test::stories_dir());
  std::vector<int32_t> tokens = kPrompt;
  const std::vector<int32_t> more = testing_support::greedy_alone(*original, kPrompt, 52);
  tokens.insert(tokens.end(), more.begin(), more.end());
  struct Case {
    const char *name, *args;
    double kl_bound, top1_min;
  };
  for (const Case& c : {Case{"gptq_act", "--format gptq --group-size 32 --desc-act --asym", 0.15, 0.8},
                        Case{"slim_w8a8_dynamic", "--format slim-w8a8-dynamic", 5e-3, 0.95}}) {
    const std::string dir = write(test::stories_dir(), std::string("stories_") + c.name, c.args);
    std::unique_ptr<Model> m = load_model(dir);
    const tools::EvalResult r = tools::evaluate(*m, original.get(), tokens, 64);
    std::printf("%s: KL vs stories260K mean %.3e p99 %.3e, top-1 %.3f (%lld predictions)\n", c.name, r.kl_mean,
                r.kl_p99, r.top1_agreement, static_cast<long long>(r.tokens));
    EXPECT_TRUE(r.has_ref);
    EXPECT_LT(r.kl_mean, c.kl_bound) << c.name;
    EXPECT_GE(r.top1_agreement, c.top1_min) << c.name;
  }
}

TEST(PrequantMoe, ExpertsInEveryFormat) {
  const std::string base = moe_model();
  const std::vector<int32_t> prompt = {5, 17, 99, 3, 250, 42, 7, 7, 180, 64};
  for (const char* args : {"--format gptq --group-size 64 --asym", "--format awq --group-size 64",
                           "--format slim-w8a8-dynamic", "--format slim-w4a8"}) {
    std::string name = std::regex_replace(std::string(args), std::regex("[^a-z0-9]+"), "_");
    const std::string dir = write(base, "moe" + name, args);
    const bool int4_16 = std::string(args).find("slim") == std::string::npos;
    EXPECT_GT(compare_layers(dir, int4_16 ? 1e-6f : 1e-3f), 4) << args;
    const Diff d = diff(last_logits(dir, prompt), last_logits(dir + "-ref", prompt));
    EXPECT_LT(d.rel(), int4_16 ? 1e-4f : 0.05f) << args << ": " << d.max_abs << " of " << d.max_ref;
  }
}

// DeepSeek-V3 (MLA with q_lora: q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj; a dense
// layer, then MoE experts and a shared expert; the MTP layer) in each integer format: every
// projection binds to the writer's reference (kv_a_proj_with_mqa and kv_b_proj among them:
// the model takes kv_b_proj dequantized to f32 and splits it for the absorbed attention, so a
// wrong reading would move the logits), and the logits are the dequantized model's within the
// bounds above (the w4a16 layouts: f32 rounding, measured 8e-6 of 9.2; int8 activations:
// their rounding, measured 0.18-0.21 of 8, 2.3-2.5%).
// DeepSeek-V3 (arch deepseek_v3) or V3.2 (deepseek_v32: the lightning indexer's wq_b and wk
// quantized, weights_proj kept float as DeepSeek's V3.2 release keeps it) in every format.
void deepseek_in_every_format(const std::string& arch) {
  const bool v32 = arch == "deepseek_v32";
  const std::string base =
      test::generate_model(kScratch / arch, "--arch " + arch +
                                                " --hidden 128 --layers 3 --heads 4 --vocab 300 "
                                                "--experts 8 --experts-per-tok 2 --moe-ffn 64 --seed 7");
  const std::vector<int32_t> prompt = {1, 5, 9, 13, 200, 42, 7, 180};
  for (const char* args : {"--format gptq --group-size 32 --asym", "--format gptq --group-size 32 --desc-act",
                           "--format awq --group-size 32", "--format slim-w8a8-dynamic", "--format slim-w4a8"}) {
    SCOPED_TRACE(args);
    std::string name = std::regex_replace(std::string(args), std::regex("[^a-z0-9]+"), "_");
    const std::string dir = write(base, (v32 ? "deepseek32" : "deepseek") + name, args);
    const bool int4_16 = std::string(args).find("slim") == std::string::npos;
    const auto src = PrequantSource::open(dir);
    ASSERT_NE(src, nullptr);
    std::vector<std::string> projs = {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"};
    if (v32) projs.insert(projs.end(), {"indexer.wq_b", "indexer.wk"});
    for (const std::string& proj : projs) {
      const std::string p = "model.layers.1.self_attn." + proj;
      EXPECT_NE(src->store().find(p + (int4_16 ? ".qweight" : ".weight_scale")), nullptr) << p << " is not quantized";
    }
    if (v32) {
      const TensorInfo* wp = src->store().find("model.layers.1.self_attn.indexer.weights_proj.weight");
      ASSERT_NE(wp, nullptr);
      EXPECT_EQ(wp->dtype, DType::kF32) << "weights_proj stays float";
      EXPECT_FALSE(src->format().quantizes(src->store(), wp->name));
    }
    // 3 layers x 5 MLA projections (V3.2: + 2 indexer projections), 1 dense MLP x 3, 2 MoE
    // layers x (8 experts + shared) x 3.
    EXPECT_GE(compare_layers(dir, int4_16 ? 1e-6f : 1e-3f), (v32 ? 21 : 15) + 3 + 2 * 9 * 3);
    // `infera check` finds nothing wrong; `infera plan` reads the format's weight files
    // (msModelSlim's quant_model_weights.safetensors too).
    const std::string infera = std::string(INFERA_BINARY_DIR) + "/infera";
    EXPECT_EQ(test::shell(infera + " check " + dir + " > /dev/null 2>&1").first, 0);
    const auto [plan_rc, plan_out] = test::shell(infera + " plan -m " + dir + " 2>&1");
    EXPECT_EQ(plan_rc, 0) << plan_out;
    const Diff d = diff(last_logits(dir, prompt), last_logits(dir + "-ref", prompt));
    std::printf("[ prequant ] %s %-40s max |logit - dequantized| %.2e of %.2f\n", arch.c_str(), args, d.max_abs,
                d.max_ref);
    EXPECT_LT(d.rel(), int4_16 ? 1e-4f : 0.06f) << d.max_abs << " of " << d.max_ref;
  }
}

TEST(PrequantMoe, DeepSeekV3InEveryFormat) { deepseek_in_every_format("deepseek_v3"); }

TEST(PrequantMoe, DeepSeekV32InEveryFormat) { deepseek_in_every_format("deepseek_v32"); }

std::string check_errors(const std::string& dir);

// One layer's fused experts ("<p>gate_up_proj" [E, 2F, H], "<p>down_proj" [E, H, F]) bound from
// `src`, every expert's gate, up and down rows against the per-expert reference of `ref`
// (relative error at most rel). Returns the bound gate_up experts.
std::vector<kernels::LinearWeight> expect_fused_experts(const PrequantSource& src, const WeightStore& ref,
                                                        const std::string& p, int64_t E, int64_t F, int64_t H,
                                                        float rel) {
  TensorSpec gu, down;
  gu.name = p + "gate_up_proj";
  gu.shape = {E, 2 * F, H};
  down.name = p + "down_proj";
  down.shape = {E, H, F};
  const std::vector<kernels::LinearWeight> g = src.experts({&gu}), d = src.experts({&down});
  EXPECT_EQ(g.size(), static_cast<size_t>(E));
  EXPECT_EQ(d.size(), static_cast<size_t>(E));
  for (int64_t e = 0; e < E && e < static_cast<int64_t>(std::min(g.size(), d.size())); ++e) {
    auto expect_rows = [&](const kernels::LinearWeight& w, int64_t r0, const std::string& ref_name) {
      const TensorInfo& r = ref.get(ref_name);
      const auto* want = reinterpret_cast<const float*>(r.data);
      std::vector<float> row(static_cast<size_t>(w.cols()));
      for (int64_t n = 0; n < r.shape[0]; ++n) {
        kernels::dequantize_row(w.quant, r0 + n, row.data());
        for (int64_t k = 0; k < r.shape[1]; ++k)
          ASSERT_NEAR(row[k], want[n * r.shape[1] + k], rel * std::fabs(want[n * r.shape[1] + k]))
              << ref_name << "[" << n << ", " << k << "]";
      }
    };
    const std::string pe = p + std::to_string(e) + ".";
    expect_rows(g[e], 0, pe + "gate_proj.weight");
    expect_rows(g[e], F, pe + "up_proj.weight");
    expect_rows(d[e], 0, pe + "down_proj.weight");
  }
  return g;
}

// MoE experts stored fused, as Infera's own format lays them out (each expert's gate then up
// outputs, every tensor of the per-module layout with the experts first): GPTQ
// (mlp.experts.gate_up_proj.{qweight,qzeros,scales,g_idx}), AWQ, and msModelSlim W8A8_DYNAMIC
// and W4A8_DYNAMIC (mlp.experts.gate_up_proj.{weight,weight_scale,weight_offset[,scale_bias]}).
// Every expert binds exactly (zero points as the row-indexed correction; GPTQ act-order as one
// matrix per expert with its own input permutation), its gate and up rows equal the per-expert
// reference, and the model computes what the dequantized per-expert model does.
TEST(PrequantMoe, FusedExpertsInEveryFormat) {
  const std::string base = moe_model();
  const std::vector<int32_t> prompt = {5, 17, 99, 3, 250, 42, 7, 7, 180, 64};
  struct Case {
    const char* args;
    const char* part;  // the stored gate_up tensor that must exist
    float layer_rel, vs_ref;
  };
  // Bounds as in ExpertsInEveryFormat: the w4a16 layouts exact (f32 rounding of the logits),
  // msModelSlim's int8 activations per token, W4A8's f16 scales 2^-11.
  for (const Case& c :
       {Case{"--format gptq --group-size 64 --fused-experts", "qweight", 1e-6f, 1e-4f},
        Case{"--format gptq --group-size 32 --asym --fused-experts", "qweight", 1e-6f, 1e-4f},
        Case{"--format gptq --group-size 32 --asym --desc-act --fused-experts", "qweight", 1e-6f, 1e-4f},
        Case{"--format awq --group-size 64 --fused-experts", "qweight", 1e-6f, 1e-4f},
        Case{"--format slim-w8a8-dynamic --fused-experts", "weight", 0.0f, 0.05f},
        Case{"--format slim-w4a8 --fused-experts", "weight", 1e-3f, 0.05f}}) {
    SCOPED_TRACE(c.args);
    std::string name = std::regex_replace(std::string(c.args), std::regex("[^a-z0-9]+"), "_");
    const std::string dir = write(base, "moe" + name, c.args);
    auto src = PrequantSource::open(dir);
    ASSERT_NE(src, nullptr);
    const WeightStore ref = WeightStore::open(dir + "-ref");
    const bool act_order = std::string(c.args).find("--desc-act") != std::string::npos;
    for (int layer = 0; layer < 2; ++layer) {
      const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
      EXPECT_EQ(src->store().find(p + "0.gate_proj." + c.part), nullptr);
      ASSERT_NE(src->store().find(p + "gate_up_proj." + c.part), nullptr);
      EXPECT_EQ(src->store().get(p + "gate_up_proj." + c.part).shape.front(), 4);
      const std::vector<kernels::LinearWeight> g = expect_fused_experts(*src, ref, p, 4, 64, 128, c.layer_rel);
      if (act_order) {  // each expert its own matrix and permutation: not one matrix for all
        ASSERT_EQ(g.size(), 4u);
        for (int e = 0; e < 4; ++e) {
          ASSERT_TRUE(g[e].quant.extras && !g[e].quant.extras->in_perm.empty()) << "expert " << e;
          EXPECT_EQ(g[e].quant.extras_row0, 0);
        }
        EXPECT_NE(g[0].quant.extras->in_perm, g[1].quant.extras->in_perm);
      }
    }
    const PrequantStats st = src->stats();
    EXPECT_EQ(st.weights, 16);  // 2 layers x 2 fused tensors x 4 experts
    EXPECT_EQ(st.exact, 16);
    EXPECT_EQ(st.max_rel_error, 0.0);
    const Diff diff_ref = diff(last_logits(dir, prompt), last_logits(dir + "-ref", prompt));
    EXPECT_LT(diff_ref.rel(), c.vs_ref) << diff_ref.max_abs << " of " << diff_ref.max_ref;
    std::printf("%s: logits vs dequantized model %.2e\n", c.args, diff_ref.rel());
  }
}

// A Qwen3.5-MoE whose float release stores its experts fused (mlp.experts.gate_up_proj [E, 2F, H],
// down_proj [E, H, F]), written as msModelSlim writes it (one module per expert:
// mlp.experts.E.{gate,up,down}_proj, W8A8_DYNAMIC / W4A8_DYNAMIC) and fused with the experts
// first: both bind exactly to the writer's reference (attention, GDN projections, shared expert
// and experts); W8A8_DYNAMIC computes exactly what Infera's own W8A8 computes from that reference
// (`infera quantize` of the dequantized model rounds every row to the same int8 values; W4A8's
// per-channel int4 is regrouped by the native quantizer, so it has no such twin), and the
// logits stay within the bound stated for each against the dequantized and the original model.
TEST(PrequantMoe, Qwen35FusedReleaseInModelSlim) {
  const std::string base =
      test::generate_model(kScratch / "qwen35_moe",
                           "--arch qwen3_5_moe --hidden 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 "
                           "--experts 4 --experts-per-tok 2 --moe-ffn 64 --vocab 300 --seed 7 --dtype bf16");
  const std::vector<int32_t> prompt = {5, 17, 99, 3, 250, 42, 7, 7, 180, 64};
  const std::vector<float> original = last_logits(base, prompt);
  struct Case {
    const char* args;
    bool native_w8a8;  // compare with `infera quantize --scheme w8a8` of the reference
    float layer_rel, vs_ref, vs_original;
  };
  // Measured: W8A8_DYNAMIC 0 from native W8A8, 0.36 from the dequantized and the original model
  // (this random hybrid model amplifies the int8 rounding of its activations, native W8A8 as
  // much); W4A8 0.025 from the dequantized model, 0.44 from the original (per-channel int4).
  for (const Case& c : {Case{"--format slim-w8a8-dynamic", true, 0.0f, 0.5f, 0.5f},
                        Case{"--format slim-w8a8-dynamic --fused-experts", true, 0.0f, 0.5f, 0.5f},
                        Case{"--format slim-w4a8", false, 1e-3f, 0.05f, 0.6f},
                        Case{"--format slim-w4a8 --fused-experts", false, 1e-3f, 0.05f, 0.6f}}) {
    SCOPED_TRACE(c.args);
    std::string name = std::regex_replace(std::string(c.args), std::regex("[^a-z0-9]+"), "_");
    const std::string dir = write(base, "qwen35" + name, c.args);
    const bool fused = std::string(c.args).find("--fused-experts") != std::string::npos;
    // 4 attention, 3 x 5 GDN projections, 12 shared expert (+ 48 experts per expert)
    EXPECT_EQ(compare_layers(dir, c.layer_rel), fused ? 31 : 79);
    auto src = PrequantSource::open(dir);
    ASSERT_NE(src, nullptr);
    const WeightStore ref = WeightStore::open(dir + "-ref");
    const std::string p = "model.language_model.layers.1.mlp.experts.";
    EXPECT_EQ(src->store().find(p + "gate_up_proj.weight") != nullptr, fused);
    EXPECT_EQ(src->store().find(p + "0.gate_proj.weight") != nullptr, !fused);
    if (fused) expect_fused_experts(*src, ref, p, 4, 64, 128, c.layer_rel);
    EXPECT_EQ(check_errors(dir), "");
    const std::vector<float> got = last_logits(dir, prompt);
    if (c.native_w8a8) {
      const fs::path native = kScratch / ("qwen35" + name + "_native");
      if (!fs::exists(native / "config.json")) {
        quant::QuantizeOptions o;
        o.scheme = kernels::QuantScheme::kW8A8;
        o.recipe = quant::QuantRecipe::kUniform;
        quant::quantize_model(dir + "-ref", native.string(), o);
      }
      const Diff to_native = diff(got, last_logits(native.string(), prompt));
      EXPECT_LE(to_native.rel(), 1e-6f) << to_native.max_abs << " of " << to_native.max_ref;
    }
    const Diff to_ref = diff(got, last_logits(dir + "-ref", prompt)), to_orig = diff(got, original);
    EXPECT_LT(to_ref.rel(), c.vs_ref) << to_ref.max_abs << " of " << to_ref.max_ref;
    EXPECT_LT(to_orig.rel(), c.vs_original) << to_orig.max_abs << " of " << to_orig.max_ref;
    std::printf("qwen3.5-moe %s: logits vs dequantized model %.2e, vs original %.2e\n", c.args, to_ref.rel(),
                to_orig.rel());
  }
}

// ---- bad files -------------------------------------------------------------------------------

std::string copy_of(const std::string& dir, const std::string& name) {
  const fs::path out = kScratch / name;
  fs::remove_all(out);
  fs::copy(dir, out, fs::copy_options::recursive);
  return out.string();
}

std::string load_error(const std::string& dir) {
  try {
    load_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "loaded";
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(std::ifstream(p)); }
void write_json(const fs::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(2); }

std::string check_errors(const std::string& dir) {
  std::string all;
  for (const CheckIssue& i : check_model_dir(dir).issues)
    if (i.severity == CheckSeverity::kError) all += i.message + "\n";
  return all;
}

TEST(PrequantBadFiles, GptqConfigAndTensors) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  const std::string good = write(test::stories_dir(), "stories_gptq", "--format gptq --group-size 32");
  EXPECT_EQ(check_errors(good), "");
  {  // 3-bit: refused naming the field
    const std::string d = copy_of(good, "bad_bits");
    auto j = read_json(fs::path(d) / "config.json");
    j["quantization_config"]["bits"] = 3;
    write_json(fs::path(d) / "config.json", j);
    EXPECT_NE(load_error(d).find("quantization_config.bits is 3"), std::string::npos) << load_error(d);
    EXPECT_NE(check_errors(d).find("quantization_config.bits is 3"), std::string::npos) << check_errors(d);
  }
  {  // group size not dividing the inputs (64)
    const std::string d = copy_of(good, "bad_group");
    auto j = read_json(fs::path(d) / "config.json");
    j["quantization_config"]["group_size"] = 48;
    write_json(fs::path(d) / "config.json", j);
    EXPECT_NE(load_error(d).find("has 64 input features, which quantization_config.group_size 48 does not divide"),
              std::string::npos)
        << load_error(d);
    EXPECT_NE(check_errors(d).find("group_size 48 does not divide"), std::string::npos) << check_errors(d);
  }
  {  // wrong scale shape: the group size the file was not written with
    const std::string d = copy_of(good, "bad_scales");
    auto j = read_json(fs::path(d) / "config.json");
    j["quantization_config"]["group_size"] = 64;
    write_json(fs::path(d) / "config.json", j);
    EXPECT_NE(load_error(d).find("qzeros' has shape [2, 8], expected [1, 8]"), std::string::npos) << load_error(d);
    EXPECT_NE(check_errors(d).find("qzeros' has shape [2, 8], expected [1, 8]"), std::string::npos) << check_errors(d);
  }
  {  // act-order without g_idx
    const std::string d = copy_of(good, "bad_desc_act");
    auto j = read_json(fs::path(d) / "config.json");
    j["quantization_config"]["desc_act"] = true;
    write_json(fs::path(d) / "config.json", j);
    // g_idx is present in this file: loads; the unit tests cover its absence.
    EXPECT_EQ(load_error(d), "loaded");
  }
}

// Rewrites a safetensors file without the tensors matching `drop`.
void drop_tensors(const fs::path& file, const std::string& drop) {
  std::ifstream in(file, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  auto h = nlohmann::json::parse(header);
  nlohmann::json out = nlohmann::json::object();
  std::string blob;
  for (auto& [name, info] : h.items()) {
    if (name == "__metadata__" || name.find(drop) != std::string::npos) continue;
    const size_t b = info["data_offsets"][0], e = info["data_offsets"][1];
    info["data_offsets"] = {blob.size(), blob.size() + (e - b)};
    blob += data.substr(b, e - b);
    out[name] = info;
  }
  std::string hs = out.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');
  std::ofstream o(file, std::ios::binary | std::ios::trunc);
  const uint64_t len = hs.size();
  o.write(reinterpret_cast<const char*>(&len), 8);
  o << hs << blob;
}

TEST(PrequantBadFiles, MissingZerosAndSlimDescription) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  {
    const std::string d =
        copy_of(write(test::stories_dir(), "stories_awq", "--format awq --group-size 32"), "bad_zeros");
    drop_tensors(fs::path(d) / "model.safetensors", "layers.1.self_attn.k_proj.qzeros");
    EXPECT_NE(load_error(d).find("'model.layers.1.self_attn.k_proj.qzeros' is missing (zero points are missing)"),
              std::string::npos)
        << load_error(d);
    EXPECT_NE(check_errors(d).find("zero points are missing"), std::string::npos) << check_errors(d);
  }
  const std::string slim = write(test::stories_dir(), "stories_slim_w8a8", "--format slim-w8a8");
  EXPECT_EQ(check_errors(slim), "");
  {  // the description says W8A8_DYNAMIC for a weight whose siblings are W8A8
    const std::string d = copy_of(slim, "bad_desc");
    auto j = read_json(fs::path(d) / "quant_model_description.json");
    j["model.layers.2.mlp.up_proj.weight"] = "W8A8_DYNAMIC";
    write_json(fs::path(d) / "quant_model_description.json", j);
    EXPECT_NE(load_error(d).find("inconsistent: 'model.layers.2.mlp.up_proj.deq_scale' is W8A8, but "
                                 "'model.layers.2.mlp.up_proj.weight' is W8A8_DYNAMIC"),
              std::string::npos)
        << load_error(d);
    EXPECT_NE(check_errors(d).find("inconsistent"), std::string::npos) << check_errors(d);
  }
  {  // a described tensor the weights lack, and a missing deq_scale
    const std::string d = copy_of(slim, "bad_missing");
    drop_tensors(fs::path(d) / "quant_model_weights.safetensors", "layers.0.self_attn.o_proj.deq_scale");
    const std::string e = load_error(d);
    EXPECT_NE(e.find("describes tensor 'model.layers.0.self_attn.o_proj.deq_scale' (W8A8), which the weights do not "
                     "store"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("tensor 'model.layers.0.self_attn.o_proj.deq_scale' is missing"), std::string::npos) << e;
  }
  {  // an unsupported type
    const std::string d = copy_of(slim, "bad_type");
    auto j = read_json(fs::path(d) / "quant_model_description.json");
    for (auto& [k, v] : j.items())
      if (k.starts_with("model.layers.3.mlp.down_proj.")) v = "W8A16";
    write_json(fs::path(d) / "quant_model_description.json", j);
    EXPECT_NE(load_error(d).find("quantization type 'W8A16' is not supported"), std::string::npos) << load_error(d);
  }
  {  // per-group scales on a W8A8_DYNAMIC layer: the wrong scale shape
    const std::string d = copy_of(write(test::stories_dir(), "stories_slim_w8a8_dynamic", "--format slim-w8a8-dynamic"),
                                  "bad_slim_scale");
    drop_tensors(fs::path(d) / "quant_model_weights.safetensors", "layers.4.mlp.gate_proj.weight_scale");
    EXPECT_NE(load_error(d).find("tensor 'model.layers.4.mlp.gate_proj.weight_scale' is missing"), std::string::npos)
        << load_error(d);
  }
}

}  // namespace
}  // namespace infera
