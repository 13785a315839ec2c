// The model seam: one forward over a batch that packs chunks of several sequences
// (decode tokens and prefill chunks alike). Architecture files (llama.cpp, ...) implement
// it; the runtime owns which KV blocks each sequence holds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "infera/model/config.h"
#include "infera/model/kv_pool.h"
#include "infera/parallel/plan.h"

namespace infera {

class TensorDump;

// One sequence's slice of a batch: tokens [token_begin, token_begin + n_tokens) of
// ForwardBatch::tokens sit at positions pos0 .. pos0 + n_tokens - 1 of the sequence.
struct SeqChunk {
  int32_t token_begin = 0;
  int32_t n_tokens = 0;
  int32_t pos0 = 0;
  const int32_t* block_table = nullptr;  // blocks covering positions [0, pos0 + n_tokens)
  int32_t n_blocks = 0;
  bool all_logits = false;  // logits for every token of the chunk (eval, speculative verify)
  bool last_logits = true;  // logits for the chunk's last token
  // Hybrid models (Gated DeltaNet layers) only: which recurrent-state slot this sequence
  // owns, in [0, Model::num_state_slots()). A chunk at pos0 == 0 starts a fresh sequence and
  // the model zeroes the slot itself; a chunk at pos0 > 0 continues the slot's state, so
  // the slot must stay with one sequence for its whole life, and a sequence cannot resume
  // from a prefix-cache hit (the state after the prefix is not cached).
  int32_t state_slot = 0;
  // Hybrid models, after Model::reserve_token_states: also keep the recurrent state after
  // each of the chunk's first n_tokens - 1 tokens (speculative verification), so that
  // Model::commit_token_state can keep a prefix of the chunk without running it again.
  // Such a chunk runs the token-by-token recurrence, as decode does, not the chunked rule.
  bool keep_token_states = false;
};

struct ForwardBatch {
  std::vector<int32_t> tokens;  // [n_tokens]
  std::vector<SeqChunk> seqs;
  int32_t num_logit_rows() const;
};

struct LoadOptions {
  bool load_into_memory = false;  // read weights into RAM instead of mmap
  int32_t max_batch_tokens = 512; // scratch buffers are sized for this many tokens
  // Tensor / expert parallelism: which part of the model this rank loads and the group it
  // syncs with (docs/parallel.md). Default: one process, the whole model.
  parallel::ParallelPlan parallel;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }

  // Geometry of the KV pool this model needs (num_blocks left for the caller to set).
  virtual KvPoolShape kv_shape(int64_t block_size) const = 0;

  // Runs the batch, writing the new tokens' K/V into `kv` and the requested logits rows
  // (in batch order: per chunk, all rows when all_logits, else the last row when
  // last_logits) into `logits` [num_logit_rows, vocab_size].
  virtual void forward(const ForwardBatch& batch, KvPool& kv, float* logits) = 0;

  // Bytes of weights read for one decode token (bandwidth accounting).
  virtual int64_t weight_bytes_per_token() const = 0;
  virtual int64_t num_parameters() const = 0;

  // ---- Recurrent state (hybrid models; 0 / no-ops otherwise) ----
  // Per sequence a hybrid model keeps, per linear-attention layer, the conv state
  // [kernel-1, conv_dim] and the delta-rule state S [Hv, dk, dv] (f32), in fixed-size slots
  // the runtime hands out (SeqChunk::state_slot). Models start with one slot (enough for
  // SequenceRunner); a runtime serving N sequences at once calls set_num_state_slots(N)
  // before the first forward (existing slots keep their contents).
  virtual int64_t state_bytes_per_slot() const { return 0; }
  virtual int32_t num_state_slots() const { return 0; }
  virtual void set_num_state_slots(int32_t n) { (void)n; }
  // Copies one slot's whole recurrent state out to `buffer` [state_bytes_per_slot() bytes]
  // and back. Speculative decoding snapshots a sequence's slot before a forward that
  // verifies draft tokens and restores it when a draft is rejected: unlike attention K/V,
  // which a shorter position simply ignores, the recurrent state has already absorbed the
  // rejected tokens.
  virtual void save_state(int32_t slot, void* buffer) const { (void)slot, (void)buffer; }
  virtual void restore_state(int32_t slot, const void* buffer) { (void)slot, (void)buffer; }
  // Per-token states for verification without a re-feed: reserve room for chunks of up to
  // max_chunk_tokens tokens with SeqChunk::keep_token_states (max_chunk_tokens - 1
  // snapshots per slot, each state_bytes_per_slot() bytes, allocated on a slot's first
  // such chunk). False when the model cannot (no recurrent state, or a tensor-parallel
  // group, whose ranks hold the state): the caller falls back to save/restore_state.
  virtual bool reserve_token_states(int32_t max_chunk_tokens) { (void)max_chunk_tokens; return false; }
  // After a forward whose chunk on `slot` kept token states: make the slot's state the one
  // after that chunk's first n_tokens tokens (1 <= n_tokens < the chunk's length; the full
  // chunk's state is already there). A copy of one slot's state.
  virtual void commit_token_state(int32_t slot, int32_t n_tokens) { (void)slot, (void)n_tokens; }

  // ---- Mixture of experts ----
  // Tokens routed to each expert so far, [num_layers * num_experts] layer-major (dense
  // layers stay 0); empty for dense models. Uneven routing shows up here first.
  virtual std::vector<uint64_t> expert_counts() const { return {}; }
  virtual void reset_expert_counts() {}

  // ---- Multi-token prediction (Qwen3.5 / Qwen3-Next MTP head) ----
  // 0 when the checkpoint has no MTP weights. After forward(), last_hidden() holds the
  // trunk's post-final-norm hidden state of every logits row, [num_logit_rows, hidden].
  // draft(batch, hidden, kv, logits): a chunk at pos0 = p holds tokens x_{p+1}, x_{p+2}, ...
  // and hidden [n_tokens, hidden] the trunk hidden h_p, h_{p+1}, ... (row order as tokens);
  // the MTP head predicts the token after each x_{p+1}, writing logits rows like forward().
  // Its one layer keeps its own K/V in KV layer kv_shape().num_layers - 1, in slot p for the
  // pair (h_p, x_{p+1}): a sequence must have drafted every earlier slot (feed the prompt
  // through draft once) for later drafts to see a complete MTP context. Block tables cover
  // the same positions as the trunk's.
  // After draft(), last_hidden() holds the MTP head's own post-norm hidden state of each
  // logits row: the stand-in for h_{p+1} when drafting further tokens recursively.
  virtual int num_mtp_layers() const { return 0; }
  virtual const float* last_hidden() const { return nullptr; }
  virtual void draft(const ForwardBatch& batch, const float* hidden, KvPool& kv, float* logits) {
    (void)batch, (void)hidden, (void)kv, (void)logits;
  }
  // When on, forward() leaves in last_hidden() the post-final-norm hidden state of EVERY
  // token of the batch, [batch.tokens.size(), hidden] in batch order, instead of only the
  // logits rows' (MTP drafting needs the prompt's hidden states without paying for their
  // logits). Logits are unchanged.
  virtual void set_hidden_for_all_tokens(bool on) { (void)on; }

  // ---- Tensor / expert parallel (docs/parallel.md) ----
  // What rank 0's collectives cost so far (ParallelModel); ranks 0 for one process.
  struct ParallelStats {
    int32_t ranks = 0;
    int64_t collectives = 0;
    int64_t bytes = 0;          // payload this rank contributed
    double comm_seconds = 0.0;  // inside collectives, waiting for slower ranks included
  };
  virtual ParallelStats parallel_stats() const { return {}; }

  // ---- Debug dump (model/tensor_dump.h; `infera run --dump-tensors`) ----
  // While set, forward() writes the selected named intermediates; nullptr (the default):
  // off. The dump must outlive its use by the model.
  void set_tensor_dump(TensorDump* dump) { dump_ = dump; }

 protected:
  ModelConfig config_;
  TensorDump* dump_ = nullptr;
};

// Loads the model directory (config.json + safetensors). Throws infera::Error.
std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& options = {});

}  // namespace infera
