// Per-architecture tensor tables: every tensor of an architecture's text model (and MTP
// head), derived from the config alone, with what each tool needs to know about it: its
// Hugging Face name and shape, its role, whether `infera quantize` quantizes it, its GGUF
// name for `infera convert`, and how it splits under tensor parallelism. `infera check`
// compares a checkpoint against it, `infera plan` sizes memory from it, `infera quantize`
// picks the tensors it quantizes from it and `infera convert` names GGUF tensors from it.
// The registry row of each architecture (model/arch_registry.h) points at its table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "infera/model/arch_registry.h"
#include "infera/model/config.h"

namespace infera {

// What a weight is, and so how it is stored and counted.
enum class WeightRole {
  kEmbedding,  // token embedding table: kept at bf16 by quantized schemes (--embed-head)
  kHead,  // output head: kept at bf16 by quantized schemes (--embed-head)
  kLinear,  // projection in a block: stored in the scheme
  kExpert,  // routed expert projection (only k of E active per token): stored in the scheme
  kFloat,  // sensitive small matrices kept as stored (MoE router, GDN in_proj_a/b, gates)
  kVector,  // norms, biases, conv1d, A_log, dt_bias: f32 in memory
};
const char* weight_role_name(WeightRole r);

// How a tensor is divided between the ranks of a tensor-parallel group
// (model/tensor_parallel.h does the division).
enum class TpSplit {
  kReplicated,  // every rank holds all of it (norms, routers, gates)
  kRows,  // output rows by head / column block (q/k/v, gate/up, GDN input projections)
  kColumns,  // input columns (o_proj, down, GDN out_proj): partial sums, all-reduced
  kVocab,  // embedding / head rows by vocabulary
  kExperts,  // whole experts by rank (EP), or their columns (TP without EP)
};
const char* tp_split_name(TpSplit s);

// How llama.cpp's converter stores a tensor beyond renaming it (`infera convert` writes it
// so, the GGUF loader undoes it). Qwen3.5's Gated DeltaNet value heads: Hugging Face groups
// them by key head (key head k's r = Hv / Hk value heads together, k * r + v); llama.cpp
// tiles them (v * Hk + k), in every tensor with a per-value-head axis (only where the
// architecture's trait gguf_tiled_value_heads says so: its qwen3next keeps HF's order).
enum class GgufForm : uint8_t {
  kAsIs,
  kPlusOne,  // a zero-centred RMSNorm weight w, applied as 1 + w, stored as 1 + w
  kValueHeads,  // rows (a vector's elements) per value head reordered; in_proj_qkv: after q and k
  kValueHeadColumns,  // out_proj: the columns per value head reordered
  kNegExp,  // A_log stored as -exp(A_log), value heads reordered
  kConv,  // conv1d [C, 1, K] stored as ne {K, C}, the value channels reordered
  kKvBSplit,  // DeepSeek kv_b_proj stored as attn_k_b ne {nope, R, nh} (named) + attn_v_b ne {R, V, nh}
  // Qwen3-Next in_proj_qkvz (per key-head group q | k | v | z) stored de-interleaved as
  // attn_qkv (named: all q rows | all k | all v) + attn_gate (the z rows); written only.
  kQkvzSplit,
  // Qwen3-Next in_proj_b / in_proj_a as a GGUF presents them: the b (a) rows of ssm_ba, which
  // keeps in_proj_ba's layout (per key-head group b | a); read only.
  kBaHalf,
};

// A tensor's slot: what it is within its layer, the key model files bind it by
// (ModelWeights, model/weights.h), whatever the checkpoint calls it. The vocabulary:
//   global (layer -1):   token_embd, output_norm, output
//   every block:         attn_norm, ffn_norm (the norm before the MLP / MoE)
//   GQA attention:       attn_q, attn_k, attn_v, attn_output, attn_{q,k,v,output}_bias,
//                        attn_q_norm, attn_k_norm
//   MLA attention:       attn_q_a, attn_q_a_norm, attn_q_b, attn_kv_a_mqa, attn_kv_a_norm,
//                        attn_kv_b, attn_output; V3.2 indexer: indexer_q_b, indexer_k,
//                        indexer_k_norm, indexer_k_norm_bias, indexer_proj
//   Gated DeltaNet:      gdn_qkv, gdn_z, gdn_b, gdn_a (split) or gdn_qkvz, gdn_ba (fused),
//                        gdn_conv1d, gdn_dt_bias, gdn_a_log, gdn_norm, gdn_out
//   dense MLP:           ffn_gate, ffn_up, ffn_down
//   MoE:                 ffn_gate_inp (router), exp_probs_b (router bias); experts either
//                        fused, ffn_gate_up_exps [E, 2I, H] + ffn_down_exps [E, H, I], or per
//                        expert (TensorSpec::expert), ffn_gate_exps, ffn_up_exps,
//                        ffn_down_exps; shared expert: ffn_{gate,up,down}_shexp,
//                        ffn_gate_inp_shexp (its sigmoid gate)
//   MTP head (its layer after the trunk's): mtp_eh_proj, mtp_enorm, mtp_hnorm,
//                        mtp_head_norm, mtp_embed, mtp_head, and the block's slots
struct TensorSpec {
  std::string name;  // Hugging Face name
  std::string slot;  // what it is in its layer (above)
  int expert = -1;  // the expert of a per-expert tensor, else -1
  std::vector<int64_t> shape;  // as stored in the checkpoint (fused experts 3-D [E, rows, cols])
  WeightRole role = WeightRole::kLinear;
  bool mtp = false;  // belongs to the multi-token-prediction head (optional in a checkpoint)
  int layer = -1;  // decoder layer (MTP layers after the trunk's), -1 for global tensors
  // GGUF (llama.cpp) name; empty when the architecture has no GGUF export. A per-expert
  // tensor names the stacked 3-D GGUF tensor; a fused experts.gate_up_proj names the gate
  // half (ffn_gate_exps), its up half goes to the matching ffn_up_exps.
  std::string gguf;
  GgufForm gguf_form = GgufForm::kAsIs;
  TpSplit split = TpSplit::kReplicated;
  // `infera quantize` stores it in the scheme (embeddings and head as --embed-head says).
  bool quantizable() const {
    return (role == WeightRole::kLinear || role == WeightRole::kExpert || role == WeightRole::kEmbedding ||
            role == WeightRole::kHead) &&
           (shape.size() == 2 || shape.size() == 3);
  }
  int64_t numel() const;
};
using ExpectedTensor = TensorSpec;

// ---- Writing a table ----
// A registry row's `tensors` hook appends its rows with these: the builder carries the
// current layer, GGUF block prefix and MTP flag, and the row builders add the tensors of the
// usual blocks under a Hugging Face prefix `p` ("model.layers.3."). An architecture with a
// new layout writes its table function beside its model (the existing tables are in
// tensor_table.cpp: transformer, hybrid, DeepSeek).
namespace table_rows {

class TableBuilder {
 public:
  TableBuilder(const ModelConfig& c, const HasTensor& has_tensor, std::vector<TensorSpec>& out);

  const ModelConfig& config() const { return c_; }
  bool has(const std::string& name) const { return has_ && has_(name); }
  bool probing() const { return static_cast<bool>(has_); }  // a checkpoint's names are known

  bool mtp = false;
  int layer = -1;
  std::string block;  // GGUF prefix of the current block ("blk.3.")
  int expert = -1;  // per-expert tensors: the expert being added

  // gguf: the name within the block, "/name" for a global one, nullptr for none; the row
  // has no GGUF name when the architecture has no GGUF export.
  void add(std::string name, std::vector<int64_t> shape, WeightRole role, const char* slot, const char* gguf,
           TpSplit split, GgufForm form = GgufForm::kAsIs);
  // kPlusOne for an RMSNorm weight of an architecture whose norms are zero-centred, else kAsIs.
  GgufForm norm_form() const;

 private:
  const ModelConfig& c_;
  const HasTensor& has_;
  std::vector<TensorSpec>& out_;
  bool gguf_;
};

void add_attention(TableBuilder& t, const std::string& p);  // GQA (q/k/v/o, biases, q/k norms)
void add_mla(TableBuilder& t, const std::string& p);  // DeepSeek MLA (+ the V3.2 indexer)
void add_gdn(TableBuilder& t, const std::string& p);  // Gated DeltaNet, split or fused projections
// A SwiGLU MLP under p + name; shared: a shared expert (slots and GGUF names ffn_*_shexp).
void add_dense_mlp(TableBuilder& t, const std::string& p, int64_t H, int64_t F, const char* name = "mlp.",
                   bool shared = false);
void add_moe(TableBuilder& t, const std::string& p);  // router, experts (stored layout), shared expert
// One decoder block: the two norms, the mixer (MLA, full attention or GDN) and the MLP or MoE.
void add_block(TableBuilder& t, const std::string& p, bool full_attention, bool moe);
// The embedding table, every layer's block under root + "layers.{i}.", the final norm and head.
void add_trunk(TableBuilder& t, const std::string& root);

}  // namespace table_rows

// The architecture's tensor table for this config. With has_tensor (a checkpoint's names),
// the per-checkpoint choices follow what is stored: the text prefix (model.language_model.
// or model.), the expert layout and, for Qwen3-Next, the MTP layers; without it, the
// architecture's usual layout. Throws infera::Error for an architecture without a table.
std::vector<TensorSpec> tensor_table(const ModelConfig& cfg, const HasTensor& has_tensor = nullptr);
inline std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg) { return tensor_table(cfg); }

// The rows of one MoE block whose tensors live under `block_prefix` ("model.layers.3."),
// as the architecture's table lays them out (for binding a lone block, as tests do).
std::vector<TensorSpec> moe_block_table(const ModelConfig& cfg, const std::string& block_prefix,
                                        const HasTensor& has_tensor = nullptr, int layer = 0);

// llama.cpp's name for the tensor the architecture's table calls `hf_name`
// ("model.layers.3.mlp.up_proj.weight" -> "blk.3.ffn_up.weight"); "" when the table has no
// such tensor or it has no GGUF counterpart.
std::string gguf_tensor_name(const ModelConfig& cfg, const std::string& hf_name);

}  // namespace infera
