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

struct TensorSpec {
  std::string name;  // Hugging Face name
  std::vector<int64_t> shape;  // as stored in the checkpoint (fused experts 3-D [E, rows, cols])
  WeightRole role = WeightRole::kLinear;
  bool mtp = false;  // belongs to the multi-token-prediction head (optional in a checkpoint)
  int layer = -1;  // decoder layer (MTP layers after the trunk's), -1 for global tensors
  // GGUF (llama.cpp) name; empty when the architecture has no GGUF export. A per-expert
  // tensor names the stacked 3-D GGUF tensor; a fused experts.gate_up_proj names the gate
  // half (ffn_gate_exps), its up half goes to the matching ffn_up_exps.
  std::string gguf;
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

// The architecture's tensor table for this config. With has_tensor (a checkpoint's names),
// the per-checkpoint choices follow what is stored: the text prefix (model.language_model.
// or model.), the expert layout and, for Qwen3-Next, the MTP layers; without it, the
// architecture's usual layout. Throws infera::Error for an architecture without a table.
std::vector<TensorSpec> tensor_table(const ModelConfig& cfg, const HasTensor& has_tensor = nullptr);
inline std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg) { return tensor_table(cfg); }

}  // namespace infera
