// The architecture registry and the per-architecture tensor tables: one row per
// architecture decides what the loaders, check, plan, quantize and convert used to decide
// each for themselves; the KV and recurrent-state geometry the server checks before a model
// is loaded is the one the loaded model reports; the debug dump writes what forward() computes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/model/arch_registry.h"
#include "infera/model/config.h"
#include "infera/model/model.h"
#include "infera/model/tensor_dump.h"
#include "infera/model/tensor_table.h"
#include "infera/model/weights.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

const fs::path& scratch() {
  static const fs::path dir = test::process_scratch_dir("infera_arch_registry_test");
  return dir;
}

// A tiny model from tools/gen_model.py, generated once per process.
std::string generated(const std::string& name, const std::string& args) {
  return test::generate_model(scratch() / name, args);
}

const char* kHybridArgs = test::kTinyHybridArgs;

ModelConfig config_of(const std::string& model_type, int shared_expert = 0) {
  nlohmann::json j = {{"model_type", model_type},    {"hidden_size", 64},        {"intermediate_size", 128},
                      {"num_hidden_layers", 4},      {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                      {"vocab_size", 300},           {"num_experts", 8},         {"num_experts_per_tok", 2},
                      {"moe_intermediate_size", 32}, {"kv_lora_rank", 32},       {"qk_nope_head_dim", 16},
                      {"qk_rope_head_dim", 8},       {"v_head_dim", 16},         {"n_routed_experts", 8}};
  if (shared_expert > 0) j["shared_expert_intermediate_size"] = shared_expert;
  return parse_model_config(j, "config.json");
}

TEST(ArchRegistry, EveryModelTypeSelectsItsRow) {
  std::set<std::string> names;
  for (const ArchInfo& a : arch_registry()) {
    EXPECT_TRUE(names.insert(a.name).second) << a.name;
    EXPECT_EQ(&arch_info(a.arch), &a);
    EXPECT_STREQ(arch_name(a.arch), a.name);
    ASSERT_FALSE(a.model_types.empty()) << a.name;
    for (std::string_view t : a.model_types) {
      ASSERT_NE(find_arch(t), nullptr) << t;
      EXPECT_EQ(find_arch(t)->arch, a.arch) << t;
      EXPECT_EQ(config_of(std::string(t)).arch, a.arch) << t;
    }
    EXPECT_NE(a.tensors, nullptr) << a.name << ": every row has a tensor table";
    EXPECT_FALSE(a.traits.hybrid && a.traits.mla) << a.name;
  }
  EXPECT_EQ(find_arch("gpt2"), nullptr);
  // The lists users see in errors come from the rows.
  EXPECT_EQ(known_model_types(),
            "llama, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe, deepseek_v3, deepseek_v32");
  EXPECT_EQ(runnable_arch_names(),
            "llama, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe, deepseek_v3, deepseek_v32");
  EXPECT_TRUE(arch_info(Arch::kDeepseekV3).runnable());
  EXPECT_TRUE(arch_info(Arch::kDeepseekV3).traits.mla);
  EXPECT_TRUE(arch_info(Arch::kDeepseekV32).runnable());
  EXPECT_TRUE(arch_info(Arch::kDeepseekV32).traits.mla);
}

// A row is all an architecture needs: every row carries its hooks, its Arch value is its
// place in the table, and a row with a GGUF name names every tensor of its table (a row
// without one names none).
TEST(ArchRegistry, EveryRowIsComplete) {
  const std::vector<ArchInfo>& rows = arch_registry();
  ASSERT_EQ(rows.size(), static_cast<size_t>(Arch::kSentinel));
  for (size_t i = 0; i < rows.size(); ++i) {
    const ArchInfo& a = rows[i];
    EXPECT_EQ(static_cast<size_t>(a.arch), i) << a.name;
    EXPECT_STRNE(a.name, "") << i;
    EXPECT_STRNE(a.display_name, "") << a.name;
    EXPECT_NE(a.read_config, nullptr) << a.name;
    EXPECT_NE(a.tensors, nullptr) << a.name;
    EXPECT_TRUE(a.runnable()) << a.name << ": every row has a model file today";
    ModelConfig c = config_of(std::string(a.model_types.front()), 48);
    c.mtp_num_hidden_layers = a.traits.hybrid ? 1 : 0;
    c.num_nextn_predict_layers = a.traits.mla ? 1 : 0;
    const std::vector<TensorSpec> table = tensor_table(c);
    EXPECT_FALSE(table.empty()) << a.name;
    for (const TensorSpec& t : table) {
      if (a.gguf_arch) {
        EXPECT_FALSE(t.gguf.empty()) << a.name << " " << t.name << ": the row converts to GGUF";
      } else {
        EXPECT_TRUE(t.gguf.empty()) << a.name << " " << t.name;
      }
    }
  }
}

// Nothing outside the registry decides by architecture: no source file but
// model/arch_registry.* names an Arch value or quotes an architecture's name, model_type or
// GGUF name (so a new row is picked up everywhere without touching these files). The
// tokenizer is left out: its kinds share names with architectures (tokenizer.ggml.model
// "llama", the "qwen35" pre-tokenizer) and it cannot see the model module.
TEST(ArchRegistry, OnlyTheRegistryNamesArchitectures) {
  std::set<std::string> quoted;
  for (const ArchInfo& a : arch_registry()) {
    quoted.insert("\"" + std::string(a.name) + "\"");
    for (std::string_view t : a.model_types) quoted.insert("\"" + std::string(t) + "\"");
    if (a.gguf_arch) quoted.insert("\"" + std::string(a.gguf_arch) + "\"");
  }
  const fs::path root = fs::path(INFERA_SOURCE_DIR) / "src" / "infera";
  ASSERT_TRUE(fs::is_directory(root)) << root;
  int files = 0;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(root)) {
    const fs::path& p = e.path();
    if (!e.is_regular_file() || (p.extension() != ".cpp" && p.extension() != ".h")) continue;
    const std::string rel = fs::relative(p, root).generic_string();
    if (rel.starts_with("model/arch_registry.") || rel.starts_with("tokenizer/")) continue;
    ++files;
    std::ifstream in(p);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      const std::string code = line.substr(0, line.find("//"));
      if (code.find("tokenizer.ggml.model") != std::string::npos) continue;  // a tokenizer kind
      EXPECT_EQ(code.find("Arch::"), std::string::npos) << rel << ":" << n << ": " << line;
      for (const std::string& q : quoted) {
        EXPECT_EQ(code.find(q), std::string::npos) << rel << ":" << n << " quotes " << q << ": " << line;
      }
    }
  }
  EXPECT_GT(files, 100);
}

TEST(ArchRegistry, TextPrefixAndExpertLayoutFollowTheCheckpoint) {
  const ModelConfig q35 = config_of("qwen3_5_moe");
  const ModelConfig q3 = config_of("qwen3_moe");
  auto has = [](std::set<std::string> names) { return [names](const std::string& n) { return names.count(n) > 0; }; };
  EXPECT_EQ(text_prefix(q35, has({"model.language_model.embed_tokens.weight"})), "model.language_model.");
  EXPECT_EQ(text_prefix(q35, has({"model.language_model.embed_tokens.weight.qweight"})), "model.language_model.");
  EXPECT_EQ(text_prefix(q35, has({"model.embed_tokens.weight"})), "model.");  // text-only export
  // Only architectures that may nest their text model look there.
  EXPECT_EQ(text_prefix(q3, has({"model.language_model.embed_tokens.weight"})), "model.");

  const std::string p = "model.layers.0.mlp.";
  EXPECT_EQ(stored_expert_layout(q35, p, has({p + "experts.gate_up_proj"})), ExpertLayout::kFused);
  EXPECT_EQ(stored_expert_layout(q35, p, has({p + "experts.0.gate_proj.weight"})), ExpertLayout::kPerExpert);
  EXPECT_EQ(stored_expert_layout(q3, p, has({p + "experts.gate_up_proj.qweight"})), ExpertLayout::kFused);
  EXPECT_EQ(stored_expert_layout(q35, p, has({})), ExpertLayout::kFused);  // the arch's usual layout
  EXPECT_EQ(stored_expert_layout(q3, p, has({})), ExpertLayout::kPerExpert);

  // The table lists the layout the checkpoint has.
  auto names_of = [](const std::vector<TensorSpec>& t) {
    std::set<std::string> s;
    for (const TensorSpec& x : t) s.insert(x.name);
    return s;
  };
  const auto fused = names_of(tensor_table(q35));
  EXPECT_TRUE(fused.count("model.language_model.layers.0.mlp.experts.gate_up_proj"));
  const auto per_expert =
      names_of(tensor_table(q35, has({"model.embed_tokens.weight", p + "experts.0.gate_proj.weight"})));
  EXPECT_TRUE(per_expert.count("model.layers.0.mlp.experts.7.down_proj.weight"));
  EXPECT_FALSE(per_expert.count("model.layers.0.mlp.experts.gate_up_proj"));
}

TEST(TensorTable, RolesDecideQuantizationAndGgufNames) {
  std::map<std::string, TensorSpec> t;
  for (const TensorSpec& s : tensor_table(config_of("qwen3_5_moe", 48))) t[s.name] = s;
  const std::string p = "model.language_model.layers.0.";
  // Quantized: projections, experts, embeddings / head (as --embed-head says).
  for (const std::string& n :
       {p + "linear_attn.in_proj_qkv.weight", p + "linear_attn.out_proj.weight", p + "mlp.experts.gate_up_proj",
        p + "mlp.shared_expert.down_proj.weight", std::string("model.language_model.embed_tokens.weight"),
        std::string("lm_head.weight")}) {
    ASSERT_TRUE(t.count(n)) << n;
    EXPECT_TRUE(t[n].quantizable()) << n;
  }
  // Kept as stored: router, gates, GDN gate projections, vectors.
  for (const std::string& n :
       {p + "mlp.gate.weight", p + "mlp.shared_expert_gate.weight", p + "linear_attn.in_proj_a.weight",
        p + "linear_attn.in_proj_b.weight", p + "linear_attn.A_log", p + "input_layernorm.weight"}) {
    ASSERT_TRUE(t.count(n)) << n;
    EXPECT_FALSE(t[n].quantizable()) << n;
  }
  EXPECT_EQ(t[p + "linear_attn.in_proj_qkv.weight"].gguf, "blk.0.attn_qkv.weight");
  EXPECT_EQ(t[p + "post_attention_layernorm.weight"].gguf, "blk.0.post_attention_norm.weight");
  EXPECT_EQ(t["model.language_model.embed_tokens.weight"].gguf, "token_embd.weight");
  EXPECT_EQ(t[p + "linear_attn.out_proj.weight"].split, TpSplit::kColumns);
  EXPECT_EQ(t[p + "mlp.experts.gate_up_proj"].split, TpSplit::kExperts);
  EXPECT_EQ(t[p + "linear_attn.in_proj_qkv.weight"].layer, 0);

  std::map<std::string, TensorSpec> l;
  for (const TensorSpec& s : tensor_table(config_of("llama"))) l[s.name] = s;
  EXPECT_EQ(l["model.layers.2.post_attention_layernorm.weight"].gguf, "blk.2.ffn_norm.weight");
  EXPECT_EQ(l["model.layers.2.self_attn.o_proj.weight"].gguf, "blk.2.attn_output.weight");
  EXPECT_EQ(l["model.norm.weight"].gguf, "output_norm.weight");
  // Qwen3-Next as llama.cpp's qwen3next: in_proj_qkvz written as attn_qkv (+ attn_gate),
  // in_proj_ba as ssm_ba; a GGUF's layout (in_proj_qkv and in_proj_z present) has them
  // split, b and a both halves of ssm_ba.
  std::map<std::string, TensorSpec> n;
  for (const TensorSpec& s : tensor_table(config_of("qwen3_next"))) n[s.name] = s;
  const std::string q = "model.layers.0.linear_attn.";
  EXPECT_EQ(n[q + "in_proj_qkvz.weight"].gguf, "blk.0.attn_qkv.weight");
  EXPECT_EQ(n[q + "in_proj_qkvz.weight"].gguf_form, GgufForm::kQkvzSplit);
  EXPECT_EQ(n[q + "in_proj_ba.weight"].gguf, "blk.0.ssm_ba.weight");
  EXPECT_EQ(n[q + "A_log"].gguf, "blk.0.ssm_a");
  EXPECT_EQ(n[q + "dt_bias"].gguf_form, GgufForm::kAsIs);  // value heads in HF's order
  EXPECT_EQ(n[q + "out_proj.weight"].gguf_form, GgufForm::kAsIs);
  std::map<std::string, TensorSpec> g;
  const auto gguf_layout = [](const std::string& name) {
    return name.ends_with("linear_attn.in_proj_qkv.weight") || name.ends_with("linear_attn.in_proj_z.weight");
  };
  for (const TensorSpec& s : tensor_table(config_of("qwen3_next"), gguf_layout)) g[s.name] = s;
  EXPECT_EQ(g.count(q + "in_proj_qkvz.weight"), 0u);
  EXPECT_EQ(g[q + "in_proj_qkv.weight"].gguf, "blk.0.attn_qkv.weight");
  EXPECT_EQ(g[q + "in_proj_z.weight"].gguf, "blk.0.attn_gate.weight");
  EXPECT_EQ(g[q + "in_proj_b.weight"].gguf, "blk.0.ssm_ba.weight");
  EXPECT_EQ(g[q + "in_proj_a.weight"].gguf_form, GgufForm::kBaHalf);
  // DeepSeek-V3 as llama.cpp's deepseek2 names it (kv_b_proj becomes attn_k_b + attn_v_b).
  std::map<std::string, std::string> ds;
  for (const TensorSpec& s : tensor_table(config_of("deepseek_v3"))) ds[s.name] = s.gguf;
  EXPECT_EQ(ds["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"], "blk.0.attn_kv_a_mqa.weight");
  EXPECT_EQ(ds["model.layers.0.self_attn.kv_b_proj.weight"], "blk.0.attn_k_b.weight");
  // DeepSeek-V3.2 as llama.cpp's deepseek32: the same plus the lightning indexer.
  ModelConfig v32_config = config_of("deepseek_v32");
  v32_config.q_lora_rank = 24;
  v32_config.index_n_heads = 4;
  v32_config.index_head_dim = 16;
  v32_config.index_topk = 8;
  std::map<std::string, std::string> v32;
  for (const TensorSpec& s : tensor_table(v32_config)) v32[s.name] = s.gguf;
  EXPECT_EQ(v32["model.layers.1.self_attn.kv_b_proj.weight"], "blk.1.attn_k_b.weight");
  EXPECT_EQ(v32["model.layers.1.self_attn.indexer.wq_b.weight"], "blk.1.indexer.attn_q_b.weight");
  EXPECT_EQ(v32["model.layers.1.self_attn.indexer.wk.weight"], "blk.1.indexer.attn_k.weight");
  EXPECT_EQ(v32["model.layers.1.self_attn.indexer.k_norm.weight"], "blk.1.indexer.k_norm.weight");
  EXPECT_EQ(v32["model.layers.1.self_attn.indexer.k_norm.bias"], "blk.1.indexer.k_norm.bias");
  EXPECT_EQ(v32["model.layers.1.self_attn.indexer.weights_proj.weight"], "blk.1.indexer.proj.weight");
}

// Model files bind by (layer, slot[, expert]): every row of every table has a slot, and no
// two rows share a key, so a binding names exactly one tensor.
TEST(TensorTable, EveryRowHasAUniqueSlotKey) {
  for (const ArchInfo& a : arch_registry()) {
    ModelConfig c = config_of(std::string(a.model_types.front()), 48);
    c.mtp_num_hidden_layers = a.traits.hybrid ? 1 : 0;
    c.num_nextn_predict_layers = a.traits.mla ? 1 : 0;
    std::set<std::tuple<int, std::string, int>> keys;
    for (const TensorSpec& s : tensor_table(c)) {
      EXPECT_FALSE(s.slot.empty()) << a.name << " " << s.name;
      EXPECT_TRUE(keys.emplace(s.layer, s.slot, s.expert).second) << a.name << " " << s.name << " repeats " << s.slot;
    }
  }
}

// ModelWeights finds rows by role and names what is missing.
TEST(TensorTable, ModelWeightsBindByRole) {
  const std::string dir = generated("llama", "--arch llama --vocab 300 --seed 2");
  const ModelConfig c = load_model_config(dir);
  ModelWeights w(c, SafetensorsSource::open(dir));
  ASSERT_NE(w.find(-1, "token_embd"), nullptr);
  EXPECT_EQ(w.spec(1, "attn_q").name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(w.linear(1, "attn_q").rows(), c.num_heads * c.head_dim);
  EXPECT_EQ(static_cast<int64_t>(w.vector(0, "attn_norm").size()), c.hidden_size);
  EXPECT_TRUE(w.has(0, "ffn_down"));
  EXPECT_FALSE(w.has(0, "gdn_qkv"));  // not in a llama table
  try {
    (void)w.linear(0, "gdn_qkv");
    ADD_FAILURE() << "binding a slot the table lacks should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no 'gdn_qkv' for layer 0"), std::string::npos) << e.what();
  }
}

// The KV geometry counts only the layers that keep a KV cache: a hybrid's linear-attention
// layers keep a fixed recurrent state instead. It is what the loaded model reports.
TEST(SequenceGeometry, HybridCountsFullAttentionLayersAndTheirState) {
  const std::string dir = generated("hybrid", kHybridArgs);
  const ModelConfig cfg = load_model_config(dir);
  ASSERT_EQ(cfg.num_layers, 4);
  ASSERT_EQ(cfg.num_full_attention_layers(), 1);
  std::unique_ptr<Model> model = load_model(dir);
  ASSERT_NE(model->mtp_head(), nullptr);
  const SequenceGeometry g = sequence_geometry(cfg, 1);
  const KvPoolShape shape = model->kv_shape(16);
  EXPECT_EQ(g.kv.num_layers, 2);  // layer 3 and the MTP layer, not layers 0-2
  EXPECT_EQ(shape.num_layers, g.kv.num_layers);
  EXPECT_EQ(shape.bytes_per_token(), g.kv.bytes_per_token());
  EXPECT_EQ(g.recurrent_layers, 3);
  EXPECT_EQ(g.state_bytes, model->state_shape().bytes());
  // A dense model: every layer keeps KV, no state.
  const SequenceGeometry d = sequence_geometry(config_of("qwen3"), 0, DType::kBF16);
  EXPECT_EQ(d.kv.num_layers, 4);
  EXPECT_EQ(d.kv.bytes_per_token(), 4 * 2 * 2 * 128 * 2);
  EXPECT_EQ(d.state_bytes, 0);
}

std::vector<float> forward_logits(Model& model, const std::vector<int32_t>& tokens, KvPool& kv, bool all_logits) {
  return test::forward_chunk(model, kv, tokens, 4, all_logits);
}

// The dump writes exactly what forward computes (logits, the final-norm rows), one file per
// layer for per-layer names, with an index; with the dump off the logits are the same.
void check_dump(const std::string& dir, bool per_layer_names) {
  std::unique_ptr<Model> model = load_model(dir);
  KvPoolShape shape = model->kv_shape(16);
  shape.num_blocks = 4;
  KvPool kv(shape);
  const std::vector<int32_t> tokens = {5, 17, 42, 7, 99};
  const std::vector<float> plain = forward_logits(*model, tokens, kv, true);

  const fs::path out = scratch() / ("dump_" + fs::path(dir).filename().string());
  TensorDump dump(per_layer_names ? "all" : "embed,layer_out,final_norm,logits", out.string());
  model->set_tensor_dump(&dump);
  const std::vector<float> dumped = forward_logits(*model, tokens, kv, true);
  model->set_tensor_dump(nullptr);
  const std::vector<float> again = forward_logits(*model, tokens, kv, true);
  EXPECT_EQ(plain, dumped);
  EXPECT_EQ(plain, again);

  const int64_t T = static_cast<int64_t>(tokens.size()), H = model->config().hidden_size;
  int64_t rows = 0, cols = 0;
  const std::vector<float> logits = read_npy_f32((out / "0000-logits.npy").string(), &rows, &cols);
  EXPECT_EQ(rows, T);
  EXPECT_EQ(cols, model->config().vocab_size);
  EXPECT_EQ(logits, plain);
  const std::vector<float> normed = read_npy_f32((out / "0000-final_norm.npy").string(), &rows, &cols);
  EXPECT_EQ(rows, T);
  EXPECT_EQ(cols, H);
  const MtpHead* head = model->mtp_head();
  if (const float* hidden =
          head ? head->last_hidden() : nullptr) {  // hybrids keep the post-final-norm rows (the MTP input)
    EXPECT_EQ(normed, std::vector<float>(hidden, hidden + T * H));
  }
  EXPECT_EQ(read_npy_f32((out / "0000-embed.npy").string(), &rows, &cols).size(), static_cast<size_t>(T * H));
  const int L = model->config().num_layers;
  for (int l = 0; l < L; ++l) {
    char name[64];
    std::snprintf(name, sizeof name, "0000-layer_out-%03d.npy", l);
    EXPECT_TRUE(fs::exists(out / name)) << name;
  }
  std::ifstream index(out / "index.tsv");
  std::string line;
  int lines = 0;
  while (std::getline(index, line)) ++lines;
  const int per_layer = per_layer_names ? 5 : 1;
  EXPECT_EQ(lines, 1 + 3 + L * per_layer);
  EXPECT_EQ(dump.files_written(), 3 + L * per_layer);
}

TEST(TensorDump, WritesWhatForwardComputesLlama) {
  check_dump(generated("llama", "--arch llama --vocab 300 --seed 2"), true);
}

TEST(TensorDump, WritesWhatForwardComputesHybrid) { check_dump(generated("hybrid", kHybridArgs), false); }

TEST(TensorDump, RejectsUnknownNames) {
  EXPECT_THROW(TensorDump("logits,attn_weights", (scratch() / "bad").string()), Error);
  EXPECT_THROW(TensorDump("", (scratch() / "bad").string()), Error);
}

}  // namespace
}  // namespace infera
