// Every registered architecture Infera can run goes through every tool: a generated
// checkpoint (tools/gen_model.py) -> infera check -> infera plan -> load -> one forward ->
// infera quantize (and a forward of the quantized model) -> infera convert (where the
// architecture has a GGUF name). A new registry row is picked up here with no new test.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/io/gguf.h"
#include "infera/io/safetensors.h"
#include "infera/model/arch_registry.h"
#include "infera/model/model.h"
#include "infera/model/tensor_table.h"
#include "infera/quant/quantize_model.h"
#include "infera/tools/gguf_export.h"
#include "infera/tools/model_check.h"
#include "infera/tools/planner.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

// gen_model.py arguments per architecture: small shapes, 4 layers so the hybrids have one
// full-attention layer (every 4th), equal GDN key and value widths (llama.cpp's hybrids
// need them for the GGUF export) and, for DeepSeek-V3.2, an indexer head of 64 (llama.cpp's
// deepseek32 takes power-of-two sizes from 64 up).
std::string gen_args(const ArchInfo& a) {
  std::string args = std::string("--arch ") + a.name + " --layers 4 --vocab 300 --seed 11";
  if (a.traits.hybrid) args += " --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 --lin-dk 16 --lin-dv 16";
  if (a.arch == Arch::kDeepseekV32) args += " --index-head-dim 64";
  return args;
}

// Last-token logits of one prompt, checked finite.
std::vector<float> one_forward(const std::string& dir) {
  const std::vector<float> logits = test::model_logits(dir, {3, 14, 15, 92, 65}, false);
  for (float x : logits) EXPECT_TRUE(std::isfinite(x));
  return logits;
}

class ArchWalk : public ::testing::TestWithParam<Arch> {};

TEST_P(ArchWalk, GeneratedCheckPlanLoadForwardQuantizeConvert) {
  const ArchInfo& arch = arch_info(GetParam());
  static const fs::path base = test::process_scratch_dir("infera_arch_walk");
  const fs::path dir = base / arch.name;
  test::generate_model(dir, gen_args(arch));
  ASSERT_TRUE(fs::exists(dir / "config.json"));

  // check: recognised, runnable, no errors (every tensor of the table present and shaped).
  const CheckReport report = check_model_dir(dir.string());
  EXPECT_EQ(report.errors(), 0) << report.to_text();
  EXPECT_EQ(report.arch, arch.name);
  EXPECT_TRUE(report.arch_runnable);

  // The table as this checkpoint lays it out (Qwen3-Next: MTP layers from its tensors).
  const ModelConfig cfg = load_model_config(dir.string());
  const WeightStore store = WeightStore::open(dir.string());
  const std::vector<TensorSpec> table =
      tensor_table(cfg, [&store](const std::string& name) { return store.find(name) != nullptr; });

  // plan: KV layers as the registry's geometry counts them.
  const Plan plan = plan_memory(cfg, PlanOptions{});
  EXPECT_EQ(plan.kv_layers, sequence_geometry(cfg, cfg.num_mtp_layers() > 0 ? cfg.num_mtp_layers() : 0).kv.num_layers);
  EXPECT_GT(plan.devices.at(0).total_bytes, 0);

  // load + one forward, and the loaded model reports the geometry.
  const std::vector<float> logits = one_forward(dir.string());
  {
    std::unique_ptr<Model> model = load_model(dir.string());
    const SequenceGeometry g = sequence_geometry(cfg, model->mtp_head() ? model->config().num_mtp_layers() : 0);
    EXPECT_EQ(model->kv_shape(16).bytes_per_token(), g.kv.bytes_per_token());
    EXPECT_EQ(model->state_shape().bytes(), g.state_bytes);
  }

  // quantize: exactly the table's quantizable tensors, and the result loads and runs.
  const fs::path qdir = base / (std::string(arch.name) + "_w8a8");
  quant::QuantizeOptions qo;
  qo.embed_head = quant::EmbedHeadMode::kScheme;
  const quant::QuantizeReport qr = quant::quantize_model(dir.string(), qdir.string(), qo);
  size_t quantizable = 0;
  for (const TensorSpec& t : table) quantizable += t.quantizable() ? 1 : 0;
  EXPECT_EQ(qr.layers.size(), quantizable);
  const std::vector<float> qlogits = one_forward(qdir.string());
  EXPECT_EQ(qlogits.size(), logits.size());
  EXPECT_EQ(check_model_dir(qdir.string()).errors(), 0);

  // convert: every tensor the table names for GGUF is in the file.
  if (arch.gguf_arch == nullptr) return;
  const fs::path gguf_path = base / (std::string(arch.name) + ".gguf");
  export_gguf(dir.string(), gguf_path.string());
  const gguf::Reader r(gguf_path.string());
  EXPECT_EQ(r.get("general.architecture").str(), arch.gguf_arch);
  for (const TensorSpec& t : table) {
    if (!t.gguf.empty()) {
      EXPECT_NE(r.find_tensor(t.gguf), nullptr) << t.name << " -> " << t.gguf;
    }
  }
}

std::vector<Arch> runnable_archs() {
  std::vector<Arch> out;
  for (const ArchInfo& a : arch_registry()) {
    if (a.runnable()) out.push_back(a.arch);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Registered, ArchWalk, ::testing::ValuesIn(runnable_archs()),
                         [](const ::testing::TestParamInfo<Arch>& info) { return std::string(arch_name(info.param)); });

}  // namespace
}  // namespace infera
