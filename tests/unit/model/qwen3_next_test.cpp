// Qwen3-Next (qwen3_next): tools/gen_model.py writes it from the same underlying weights as
// a qwen3_5_moe model (GDN projections fused per key-head group, experts per expert, flat
// layout and config), so the two directories describe one network: logits, MTP drafts and
// expert counts must agree. Also: dense layers from mlp_only_layers, the layer pattern
// from full_attention_interval, and clear errors for missing / mis-shaped fused tensors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/io/safetensors.h"
#include "infera/model/arch_registry.h"
#include "infera/model/model.h"
#include "infera/model/weights.h"
#include "infera/tools/model_check.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

const fs::path kScratch = test::process_scratch_dir("infera_qwen3_next_test");
fs::path scratch_root() { return kScratch; }

// r = Hv / Hk = 2 and dk != dv, so a wrong group stride or split shows up.
const char* kShape =
    "--hidden 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 --lin-v-heads 4 --lin-dk 16 "
    "--lin-dv 8 --experts 6 --experts-per-tok 2 --moe-ffn 32 --shared-ffn 48 --vocab 300 --seed 5";

std::string generated(const std::string& name, const std::string& args) {
  return test::generate_model(scratch_root() / name, args);
}

// A model with 8 KV blocks and one sequence's recurrent state.
struct Runner : test::ModelRunner {
  explicit Runner(const std::string& dir) : test::ModelRunner(dir, 8) {}
};

SeqChunk chunk(int32_t n, int32_t pos0, const std::vector<int32_t>& blocks) {
  SeqChunk s;
  s.token_begin = 0;
  s.n_tokens = n;
  s.pos0 = pos0;
  s.block_table = blocks.data();
  s.n_blocks = static_cast<int32_t>(blocks.size());
  return s;
}

const std::vector<int32_t> kPrompt = {5, 17, 99, 3, 250, 42, 7, 7, 180, 64, 12, 33, 91, 200, 150, 8, 77, 21};

// Logits of a 15-token prefill (every row) followed by 3 single-token decode steps, then
// MTP drafts over the prefill's hidden states.
std::vector<float> trace(Runner& r) {
  const int32_t V = r.model->config().vocab_size, H = r.model->config().hidden_size;
  const std::vector<int32_t> blocks = {0, 1};
  std::vector<float> out;
  ForwardBatch prefill;
  const int32_t T = 15;
  prefill.tokens.assign(kPrompt.begin(), kPrompt.begin() + T);
  prefill.seqs.push_back(chunk(T, 0, blocks));
  prefill.seqs[0].all_logits = true;
  prefill.seqs[0].state = r.state();
  std::vector<float> logits(T * V);
  MtpHead* head = r.model->mtp_head();  // null without mtp.* weights
  if (head) head->set_hidden_for_all_tokens(true);
  r.model->forward(prefill, *r.kv, logits.data());
  std::vector<float> hidden;
  if (head) {
    head->set_hidden_for_all_tokens(false);
    hidden.assign(head->last_hidden(), head->last_hidden() + T * H);
  }
  out.insert(out.end(), logits.begin(), logits.end());
  for (int32_t p = T; p < static_cast<int32_t>(kPrompt.size()); ++p) {
    ForwardBatch step;
    step.tokens = {kPrompt[p]};
    step.seqs.push_back(chunk(1, p, blocks));
    step.seqs[0].state = r.state();
    r.model->forward(step, *r.kv, logits.data());
    out.insert(out.end(), logits.begin(), logits.begin() + V);
  }
  if (head) {
    ForwardBatch d;
    d.tokens.assign(kPrompt.begin() + 1, kPrompt.begin() + T);
    d.seqs.push_back(chunk(T - 1, 0, blocks));
    d.seqs[0].all_logits = true;
    std::vector<float> draft((T - 1) * V);
    head->draft(d, hidden.data(), *r.kv, draft.data());
    out.insert(out.end(), draft.begin(), draft.end());
  }
  return out;
}

TEST(Qwen3Next, FusedLayoutGivesTheSameLogitsAsQwen35Moe) {
  Runner split(generated("split", std::string("--arch qwen3_5_moe ") + kShape));
  Runner fused(generated("fused", std::string("--arch qwen3_next ") + kShape));
  const ModelConfig& c = fused.model->config();
  EXPECT_EQ(c.arch, Arch::kQwen3Next);
  EXPECT_EQ(c.full_attention_interval, 4);  // the pattern came from full_attention_interval
  ASSERT_EQ(c.layer_types.size(), 4u);
  EXPECT_TRUE(c.is_linear_attention_layer(0) && c.is_linear_attention_layer(2));
  EXPECT_FALSE(c.is_linear_attention_layer(3));
  EXPECT_TRUE(c.norm_topk_prob);
  // Qwen3-Next's config.json does not declare the MTP head; the mtp.* tensors do.
  EXPECT_NE(fused.model->mtp_head(), nullptr);
  EXPECT_EQ(fused.model->weight_bytes_per_token(), split.model->weight_bytes_per_token());

  const auto a = trace(split);
  const auto b = trace(fused);
  ASSERT_EQ(a.size(), b.size());
  float max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(b[i]));
    max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
    max_abs = std::max(max_abs, std::fabs(a[i]));
  }
  // Same weights, same arithmetic: only the order of the projection rows differs.
  EXPECT_LT(max_diff, 1e-5f) << "max |logit| " << max_abs;
  EXPECT_GT(max_abs, 0.1f);

  // The routers saw the same inputs.
  EXPECT_EQ(split.model->expert_counts(), fused.model->expert_counts());
}

TEST(Qwen3Next, DenseLayersFromMlpOnlyLayers) {
  Runner r(generated("dense", std::string("--arch qwen3_next --mlp-only-layers 1,3 ") + kShape));
  const ModelConfig& c = r.model->config();
  EXPECT_FALSE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(2));
  r.model->reset_expert_counts();
  const auto logits = trace(r);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  const auto counts = r.model->expert_counts();
  for (int e = 0; e < c.num_experts; ++e) EXPECT_EQ(counts[1 * c.num_experts + e], 0u);
  uint64_t layer2 = 0;
  for (int e = 0; e < c.num_experts; ++e) layer2 += counts[2 * c.num_experts + e];
  EXPECT_GT(layer2, 0u);
}

// Rewrites the model with `edit` applied to its tensor list, returns the directory.
template <class Edit>
std::string edited_copy(const std::string& src, const std::string& name, Edit edit) {
  const fs::path dir = scratch_root() / name;
  fs::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
    fs::copy_file(fs::path(src) / f, dir / f, fs::copy_options::overwrite_existing);
  }
  WeightStore store = WeightStore::open(src);
  std::vector<TensorToWrite> tensors;
  for (const auto& n : store.names()) {
    const TensorInfo& t = store.get(n);
    tensors.push_back({t.name, t.dtype, t.shape, t.data, t.nbytes});
  }
  edit(tensors);
  write_safetensors((dir / "model.safetensors").string(), tensors);
  return dir.string();
}

std::string load_error(const std::string& dir) {
  try {
    load_model(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Qwen3Next, MissingOrMisShapedFusedTensorsAreNamed) {
  const std::string src = generated("fused", std::string("--arch qwen3_next ") + kShape);
  const std::string missing = edited_copy(src, "missing_ba", [](std::vector<TensorToWrite>& t) {
    std::erase_if(t, [](const TensorToWrite& x) { return x.name == "model.layers.1.linear_attn.in_proj_ba.weight"; });
  });
  std::string msg = load_error(missing);
  EXPECT_NE(msg.find("model.layers.1.linear_attn.in_proj_ba.weight' not found"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the qwen3_next layout: linear_attn.in_proj_ba.weight is [8, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[b 2 | a 2]"), std::string::npos) << msg;

  // in_proj_qkvz one key-head group short (the rows of a Qwen3.5 in_proj_qkv + z without
  // one group): the message gives the expected shape and the group layout.
  const std::string short_rows = edited_copy(src, "short_qkvz", [](std::vector<TensorToWrite>& t) {
    for (auto& x : t) {
      if (x.name == "model.layers.0.linear_attn.in_proj_qkvz.weight") {
        const int64_t group = 2 * 16 + 2 * 2 * 8;
        x.shape[0] -= group;
        x.nbytes -= group * x.shape[1] * dtype_size(x.dtype);
      }
    }
  });
  msg = load_error(short_rows);
  EXPECT_NE(msg.find("in_proj_qkvz.weight' has shape [64, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("linear_attn.in_proj_qkvz.weight is [128, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 key-head groups of rows [q 16 | k 16 | v 2x8 | z 2x8]"), std::string::npos) << msg;

  // A Qwen3.5-layout GDN layer under a qwen3_next config: the fused tensor is missing.
  const std::string split_layout = edited_copy(src, "split_layout", [](std::vector<TensorToWrite>& t) {
    for (auto& x : t) {
      if (x.name == "model.layers.2.linear_attn.in_proj_qkvz.weight")
        x.name = "model.layers.2.linear_attn.in_proj_qkv.weight";
    }
  });
  msg = load_error(split_layout);
  EXPECT_NE(msg.find("in_proj_qkvz.weight' not found"), std::string::npos) << msg;
}

// `infera check` counts Qwen3-Next's undeclared MTP head as part of the model (its tensors
// checked, not listed as unused) and the active parameters the same as for the equivalent
// qwen3_5_moe checkpoint, which declares it.
TEST(Qwen3Next, CheckFindsTheUndeclaredMtpHead) {
  const std::string fused = generated("fused", std::string("--arch qwen3_next ") + kShape);
  const std::string split = generated("split", std::string("--arch qwen3_5_moe ") + kShape);
  EXPECT_EQ(stored_mtp_layers(WeightStore::open(fused)), 1);
  const CheckReport a = check_model_dir(fused);
  const CheckReport b = check_model_dir(split);
  EXPECT_EQ(a.errors(), 0) << a.to_text();
  for (const CheckIssue& issue : a.issues) {
    EXPECT_EQ(issue.message.find("not used"), std::string::npos) << issue.message;
  }
  EXPECT_EQ(a.params_total, b.params_total);
  EXPECT_EQ(a.params_active, b.params_active);
}

}  // namespace
}  // namespace infera
