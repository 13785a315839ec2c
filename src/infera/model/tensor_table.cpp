#include "infera/model/tensor_table.h"

#include "infera/base/error.h"

namespace infera {

namespace table_rows {

namespace {
constexpr const char* kNoGguf = nullptr;
}  // namespace

TableBuilder::TableBuilder(const ModelConfig& c, const HasTensor& has_tensor, std::vector<TensorSpec>& out)
    : c_(c), has_(has_tensor), out_(out), gguf_(arch_info(c.arch).gguf_arch != nullptr) {}

void TableBuilder::add(std::string name, std::vector<int64_t> shape, WeightRole role, const char* slot,
                       const char* gguf, TpSplit split, GgufForm form) {
  TensorSpec t;
  t.name = std::move(name);
  t.slot = slot;
  t.expert = expert;
  t.shape = std::move(shape);
  t.role = role;
  t.mtp = mtp;
  t.layer = layer;
  if (gguf_ && gguf) {
    t.gguf = gguf[0] == '/' ? std::string(gguf + 1) : block + gguf;  // '/': a global name
    t.gguf_form = form;
  }
  t.split = split;
  out_.push_back(std::move(t));
}

GgufForm TableBuilder::norm_form() const {
  return arch_info(c_.arch).traits.zero_centred_norms ? GgufForm::kPlusOne : GgufForm::kAsIs;
}

// Standard (GQA) attention of llama / qwen3 / the hybrids' full-attention layers.
void add_attention(TableBuilder& t, const std::string& p) {
  const ModelConfig& c = t.config();
  const int64_t H = c.hidden_size, nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;
  // attn_output_gate: q_proj also yields a per-head gate of the same width.
  t.add(p + "self_attn.q_proj.weight", {nh * hd * (c.attn_output_gate ? 2 : 1), H}, WeightRole::kLinear, "attn_q",
        "attn_q.weight", TpSplit::kRows);
  t.add(p + "self_attn.k_proj.weight", {nkv * hd, H}, WeightRole::kLinear, "attn_k", "attn_k.weight", TpSplit::kRows);
  t.add(p + "self_attn.v_proj.weight", {nkv * hd, H}, WeightRole::kLinear, "attn_v", "attn_v.weight", TpSplit::kRows);
  t.add(p + "self_attn.o_proj.weight", {H, nh * hd}, WeightRole::kLinear, "attn_output", "attn_output.weight",
        TpSplit::kColumns);
  if (c.attention_bias) {
    t.add(p + "self_attn.q_proj.bias", {nh * hd}, WeightRole::kVector, "attn_q_bias", kNoGguf, TpSplit::kRows);
    t.add(p + "self_attn.k_proj.bias", {nkv * hd}, WeightRole::kVector, "attn_k_bias", kNoGguf, TpSplit::kRows);
    t.add(p + "self_attn.v_proj.bias", {nkv * hd}, WeightRole::kVector, "attn_v_bias", kNoGguf, TpSplit::kRows);
    t.add(p + "self_attn.o_proj.bias", {H}, WeightRole::kVector, "attn_output_bias", kNoGguf, TpSplit::kReplicated);
  }
  if (c.qk_norm) {
    t.add(p + "self_attn.q_norm.weight", {hd}, WeightRole::kVector, "attn_q_norm", "attn_q_norm.weight",
          TpSplit::kReplicated, t.norm_form());
    t.add(p + "self_attn.k_norm.weight", {hd}, WeightRole::kVector, "attn_k_norm", "attn_k_norm.weight",
          TpSplit::kReplicated, t.norm_form());
  }
}

void add_mla(TableBuilder& t, const std::string& p) {
  const ModelConfig& c = t.config();
  const int64_t H = c.hidden_size, nh = c.num_heads;
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  if (c.q_lora_rank > 0) {
    t.add(p + "self_attn.q_a_proj.weight", {c.q_lora_rank, H}, WeightRole::kLinear, "attn_q_a", "attn_q_a.weight",
          TpSplit::kReplicated);
    t.add(p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank}, WeightRole::kVector, "attn_q_a_norm",
          "attn_q_a_norm.weight", TpSplit::kReplicated);
    t.add(p + "self_attn.q_b_proj.weight", {nh * qk, c.q_lora_rank}, WeightRole::kLinear, "attn_q_b", "attn_q_b.weight",
          TpSplit::kRows);
  } else {
    t.add(p + "self_attn.q_proj.weight", {nh * qk, H}, WeightRole::kLinear, "attn_q", "attn_q.weight", TpSplit::kRows);
  }
  t.add(p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, H}, WeightRole::kLinear,
        "attn_kv_a_mqa", "attn_kv_a_mqa.weight", TpSplit::kReplicated);
  t.add(p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}, WeightRole::kVector, "attn_kv_a_norm",
        "attn_kv_a_norm.weight", TpSplit::kReplicated);
  // kv_b_proj stays float: both attention forms read it per head (absorbed into q and o).
  // llama.cpp splits it into attn_k_b (named here) and attn_v_b (infera convert writes both).
  t.add(p + "self_attn.kv_b_proj.weight", {nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank},
        WeightRole::kFloat, "attn_kv_b", "attn_k_b.weight", TpSplit::kRows, GgufForm::kKvBSplit);
  t.add(p + "self_attn.o_proj.weight", {H, nh * c.v_head_dim}, WeightRole::kLinear, "attn_output", "attn_output.weight",
        TpSplit::kColumns);
  if (c.index_n_heads > 0) {  // DeepSeek-V3.2 lightning indexer (llama.cpp's deepseek32 names)
    t.add(p + "self_attn.indexer.wq_b.weight", {c.index_n_heads * c.index_head_dim, c.q_lora_rank}, WeightRole::kLinear,
          "indexer_q_b", "indexer.attn_q_b.weight", TpSplit::kReplicated);
    t.add(p + "self_attn.indexer.wk.weight", {c.index_head_dim, H}, WeightRole::kLinear, "indexer_k",
          "indexer.attn_k.weight", TpSplit::kReplicated);
    t.add(p + "self_attn.indexer.k_norm.weight", {c.index_head_dim}, WeightRole::kVector, "indexer_k_norm",
          "indexer.k_norm.weight", TpSplit::kReplicated);
    t.add(p + "self_attn.indexer.k_norm.bias", {c.index_head_dim}, WeightRole::kVector, "indexer_k_norm_bias",
          "indexer.k_norm.bias", TpSplit::kReplicated);
    t.add(p + "self_attn.indexer.weights_proj.weight", {c.index_n_heads, H}, WeightRole::kFloat, "indexer_proj",
          "indexer.proj.weight", TpSplit::kReplicated);
  }
}

void add_gdn(TableBuilder& t, const std::string& p) {
  const ModelConfig& c = t.config();
  const int64_t H = c.hidden_size, hk = c.linear_num_key_heads, hv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t conv_dim = 2 * hk * dk + hv * dv;
  const std::string a = p + "linear_attn.";
  const ArchTraits& traits = arch_info(c.arch).traits;
  // Value heads reordered in the GGUF (Qwen3.5) or kept in HF's order (Qwen3-Next).
  const GgufForm heads = traits.gguf_tiled_value_heads ? GgufForm::kValueHeads : GgufForm::kAsIs;
  // Qwen3-Next checkpoints fuse the projections; its GGUFs (whose layout the GGUF loader
  // answers with in_proj_qkv and in_proj_z) store q | k | v and z split as Qwen3.5's, b and
  // a still fused.
  const bool fused =
      traits.fused_gdn_projections && !(t.has(a + "in_proj_qkv.weight") && t.has(a + "in_proj_z.weight"));
  if (fused) {
    t.add(a + "in_proj_qkvz.weight", {2 * hk * dk + 2 * hv * dv, H}, WeightRole::kLinear, "gdn_qkvz", "attn_qkv.weight",
          TpSplit::kRows, GgufForm::kQkvzSplit);
    t.add(a + "in_proj_ba.weight", {2 * hv, H}, WeightRole::kFloat, "gdn_ba", "ssm_ba.weight", TpSplit::kRows);
  } else {
    t.add(a + "in_proj_qkv.weight", {conv_dim, H}, WeightRole::kLinear, "gdn_qkv", "attn_qkv.weight", TpSplit::kRows,
          heads);
    t.add(a + "in_proj_z.weight", {hv * dv, H}, WeightRole::kLinear, "gdn_z", "attn_gate.weight", TpSplit::kRows,
          heads);
    if (traits.fused_gdn_projections) {
      t.add(a + "in_proj_b.weight", {hv, H}, WeightRole::kFloat, "gdn_b", "ssm_ba.weight", TpSplit::kRows,
            GgufForm::kBaHalf);
      t.add(a + "in_proj_a.weight", {hv, H}, WeightRole::kFloat, "gdn_a", "ssm_ba.weight", TpSplit::kRows,
            GgufForm::kBaHalf);
    } else {
      t.add(a + "in_proj_b.weight", {hv, H}, WeightRole::kFloat, "gdn_b", "ssm_beta.weight", TpSplit::kRows, heads);
      t.add(a + "in_proj_a.weight", {hv, H}, WeightRole::kFloat, "gdn_a", "ssm_alpha.weight", TpSplit::kRows, heads);
    }
  }
  t.add(a + "conv1d.weight", {conv_dim, 1, c.linear_conv_kernel_dim}, WeightRole::kVector, "gdn_conv1d",
        "ssm_conv1d.weight", TpSplit::kRows, GgufForm::kConv);
  t.add(a + "dt_bias", {hv}, WeightRole::kVector, "gdn_dt_bias", "ssm_dt.bias", TpSplit::kRows, heads);
  t.add(a + "A_log", {hv}, WeightRole::kVector, "gdn_a_log", "ssm_a", TpSplit::kRows, GgufForm::kNegExp);
  t.add(a + "norm.weight", {dv}, WeightRole::kVector, "gdn_norm", "ssm_norm.weight", TpSplit::kReplicated);
  t.add(a + "out_proj.weight", {H, hv * dv}, WeightRole::kLinear, "gdn_out", "ssm_out.weight", TpSplit::kColumns,
        traits.gguf_tiled_value_heads ? GgufForm::kValueHeadColumns : GgufForm::kAsIs);
}

// shared: a shared expert (slots and GGUF names ffn_*_shexp) instead of the block's MLP.
void add_dense_mlp(TableBuilder& t, const std::string& p, int64_t H, int64_t F, const char* name, bool shared) {
  t.add(p + name + "gate_proj.weight", {F, H}, WeightRole::kLinear, shared ? "ffn_gate_shexp" : "ffn_gate",
        shared ? "ffn_gate_shexp.weight" : "ffn_gate.weight", TpSplit::kRows);
  t.add(p + name + "up_proj.weight", {F, H}, WeightRole::kLinear, shared ? "ffn_up_shexp" : "ffn_up",
        shared ? "ffn_up_shexp.weight" : "ffn_up.weight", TpSplit::kRows);
  t.add(p + name + "down_proj.weight", {H, F}, WeightRole::kLinear, shared ? "ffn_down_shexp" : "ffn_down",
        shared ? "ffn_down_shexp.weight" : "ffn_down.weight", TpSplit::kColumns);
}

void add_moe(TableBuilder& t, const std::string& p) {
  const ModelConfig& c = t.config();
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  t.add(p + "mlp.gate.weight", {E, H}, WeightRole::kFloat, "ffn_gate_inp", "ffn_gate_inp.weight", TpSplit::kReplicated);
  const ExpertLayout layout = t.probing()
                                  ? stored_expert_layout(c, p + "mlp.", [&t](const std::string& n) { return t.has(n); })
                                  : arch_info(c.arch).traits.experts;
  if (layout == ExpertLayout::kFused) {
    t.add(p + "mlp.experts.gate_up_proj", {E, 2 * I, H}, WeightRole::kExpert, "ffn_gate_up_exps",
          "ffn_gate_exps.weight", TpSplit::kExperts);
    t.add(p + "mlp.experts.down_proj", {E, H, I}, WeightRole::kExpert, "ffn_down_exps", "ffn_down_exps.weight",
          TpSplit::kExperts);
  } else {
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      t.expert = static_cast<int>(e);
      t.add(x + "gate_proj.weight", {I, H}, WeightRole::kExpert, "ffn_gate_exps", "ffn_gate_exps.weight",
            TpSplit::kExperts);
      t.add(x + "up_proj.weight", {I, H}, WeightRole::kExpert, "ffn_up_exps", "ffn_up_exps.weight", TpSplit::kExperts);
      t.add(x + "down_proj.weight", {H, I}, WeightRole::kExpert, "ffn_down_exps", "ffn_down_exps.weight",
            TpSplit::kExperts);
    }
    t.expert = -1;
  }
  if (c.mla) {
    t.add(p + "mlp.gate.e_score_correction_bias", {E}, WeightRole::kVector, "exp_probs_b", "exp_probs_b.bias",
          TpSplit::kReplicated);
    if (c.n_shared_experts > 0) add_dense_mlp(t, p, H, I * c.n_shared_experts, "mlp.shared_experts.", true);
  } else if (c.shared_expert_intermediate_size > 0) {
    add_dense_mlp(t, p, H, c.shared_expert_intermediate_size, "mlp.shared_expert.", true);
    t.add(p + "mlp.shared_expert_gate.weight", {1, H}, WeightRole::kFloat, "ffn_gate_inp_shexp",
          "ffn_gate_inp_shexp.weight", TpSplit::kReplicated);
  }
}

// moe: the block's MLP is a mixture of experts (else a dense MLP).
void add_block(TableBuilder& t, const std::string& p, bool full_attention, bool moe) {
  const ModelConfig& c = t.config();
  const int64_t H = c.hidden_size;
  const bool hybrid = arch_info(c.arch).traits.hybrid;
  t.add(p + "input_layernorm.weight", {H}, WeightRole::kVector, "attn_norm", "attn_norm.weight", TpSplit::kReplicated,
        t.norm_form());
  // llama.cpp names the second norm of its hybrid blocks post_attention_norm.
  t.add(p + "post_attention_layernorm.weight", {H}, WeightRole::kVector, "ffn_norm",
        hybrid ? "post_attention_norm.weight" : "ffn_norm.weight", TpSplit::kReplicated, t.norm_form());
  if (c.mla)
    add_mla(t, p);
  else if (full_attention)
    add_attention(t, p);
  else
    add_gdn(t, p);
  if (moe)
    add_moe(t, p);
  else
    add_dense_mlp(t, p, H, c.intermediate_size);
}

void add_trunk(TableBuilder& t, const std::string& root) {
  const ModelConfig& c = t.config();
  const int64_t H = c.hidden_size, V = c.vocab_size;
  t.add(root + "embed_tokens.weight", {V, H}, WeightRole::kEmbedding, "token_embd", "/token_embd.weight",
        TpSplit::kVocab);
  for (int i = 0; i < c.num_layers; ++i) {
    t.layer = i;
    t.block = "blk." + std::to_string(i) + ".";
    add_block(t, root + "layers." + std::to_string(i) + ".", !c.is_linear_attention_layer(i), c.is_moe_layer(i));
  }
  t.layer = -1;
  t.block.clear();
  t.add(root + "norm.weight", {H}, WeightRole::kVector, "output_norm", "/output_norm.weight", TpSplit::kReplicated,
        t.norm_form());
  if (!c.tie_word_embeddings) {
    t.add("lm_head.weight", {V, H}, WeightRole::kHead, "output", "/output.weight", TpSplit::kVocab);
  }
}

}  // namespace table_rows

using table_rows::add_block;
using table_rows::add_moe;
using table_rows::add_trunk;
using table_rows::TableBuilder;

// ---- The tables (named in the registry rows) ----

// llama, qwen3, qwen3_moe (model/transformer.cpp).
void transformer_tensor_table(const ModelConfig& c, const HasTensor& has_tensor, std::vector<TensorSpec>& out) {
  TableBuilder t(c, has_tensor, out);
  add_trunk(t, "model.");
}

// qwen3_next, qwen3_5, qwen3_5_moe (model/qwen35.cpp): the trunk and the MTP head, which
// llama.cpp's converter appends as one more block, blk.{num_layers}.nextn.*.
void hybrid_tensor_table(const ModelConfig& c, const HasTensor& has_tensor, std::vector<TensorSpec>& out) {
  TableBuilder t(c, has_tensor, out);
  add_trunk(t, text_prefix(c, has_tensor));
  const int64_t H = c.hidden_size;
  t.mtp = true;
  const int n_mtp = has_tensor ? mtp_layers(c, has_tensor) : c.mtp_num_hidden_layers;
  for (int m = 0; m < n_mtp; ++m) {
    t.layer = c.num_layers + m;
    t.block = "blk." + std::to_string(c.num_layers + m) + ".";
    if (m == 0) {
      t.add("mtp.fc.weight", {H, 2 * H}, WeightRole::kLinear, "mtp_eh_proj", "nextn.eh_proj.weight",
            TpSplit::kReplicated);
      t.add("mtp.pre_fc_norm_embedding.weight", {H}, WeightRole::kVector, "mtp_enorm", "nextn.enorm.weight",
            TpSplit::kReplicated, t.norm_form());
      t.add("mtp.pre_fc_norm_hidden.weight", {H}, WeightRole::kVector, "mtp_hnorm", "nextn.hnorm.weight",
            TpSplit::kReplicated, t.norm_form());
      t.add("mtp.norm.weight", {H}, WeightRole::kVector, "mtp_head_norm", "nextn.shared_head_norm.weight",
            TpSplit::kReplicated, t.norm_form());
    }
    // The MTP block is a full-attention block, MoE when the model has experts (whatever
    // mlp_only_layers says of the trunk's layers).
    add_block(t, "mtp.layers." + std::to_string(m) + ".", true, c.num_experts > 0);
  }
}

// deepseek_v3 / deepseek_v32 (model/deepseek.cpp). MTP layers follow
// the trunk as model.layers.{num_layers + m}.
void deepseek_tensor_table(const ModelConfig& c, const HasTensor& has_tensor, std::vector<TensorSpec>& out) {
  TableBuilder t(c, has_tensor, out);
  add_trunk(t, "model.");
  const int64_t H = c.hidden_size, V = c.vocab_size;
  t.mtp = true;
  // llama.cpp's converter appends the MTP layer as blk.{num_layers} with nextn.* extras.
  for (int m = 0; m < c.num_nextn_predict_layers; ++m) {
    const int layer = c.num_layers + m;
    t.layer = layer;
    t.block = "blk." + std::to_string(layer) + ".";
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    t.add(p + "embed_tokens.weight", {V, H}, WeightRole::kEmbedding, "mtp_embed", "nextn.embed_tokens.weight",
          TpSplit::kVocab);
    t.add(p + "enorm.weight", {H}, WeightRole::kVector, "mtp_enorm", "nextn.enorm.weight", TpSplit::kReplicated);
    t.add(p + "hnorm.weight", {H}, WeightRole::kVector, "mtp_hnorm", "nextn.hnorm.weight", TpSplit::kReplicated);
    t.add(p + "eh_proj.weight", {H, 2 * H}, WeightRole::kLinear, "mtp_eh_proj", "nextn.eh_proj.weight",
          TpSplit::kReplicated);
    add_block(t, p, true, c.is_moe_layer(layer));
    t.add(p + "shared_head.norm.weight", {H}, WeightRole::kVector, "mtp_head_norm", "nextn.shared_head_norm.weight",
          TpSplit::kReplicated);
    t.add(p + "shared_head.head.weight", {V, H}, WeightRole::kHead, "mtp_head", "nextn.shared_head_head.weight",
          TpSplit::kVocab);
  }
}

const char* weight_role_name(WeightRole r) {
  switch (r) {
    case WeightRole::kEmbedding: return "embedding";
    case WeightRole::kHead: return "head";
    case WeightRole::kLinear: return "linear";
    case WeightRole::kExpert: return "expert";
    case WeightRole::kFloat: return "float";
    case WeightRole::kVector: return "vector";
  }
  return "?";
}

const char* tp_split_name(TpSplit s) {
  switch (s) {
    case TpSplit::kReplicated: return "replicated";
    case TpSplit::kRows: return "rows";
    case TpSplit::kColumns: return "columns";
    case TpSplit::kVocab: return "vocab";
    case TpSplit::kExperts: return "experts";
  }
  return "?";
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorSpec> tensor_table(const ModelConfig& cfg, const HasTensor& has_tensor) {
  const ArchInfo& info = arch_info(cfg.arch);
  if (!info.tensors) fail("architecture '{}' has no tensor table", info.name);
  std::vector<TensorSpec> out;
  info.tensors(cfg, has_tensor, out);
  return out;
}

std::vector<TensorSpec> moe_block_table(const ModelConfig& cfg, const std::string& block_prefix,
                                        const HasTensor& has_tensor, int layer) {
  std::vector<TensorSpec> out;
  TableBuilder t(cfg, has_tensor, out);
  t.layer = layer;
  add_moe(t, block_prefix);
  return out;
}

std::string gguf_tensor_name(const ModelConfig& cfg, const std::string& hf_name) {
  for (const TensorSpec& t : tensor_table(cfg)) {
    if (t.name == hf_name) return t.gguf;
  }
  return "";
}

}  // namespace infera
