// The model seam: one forward over a batch that packs chunks of several sequences
// (decode tokens and prefill chunks alike). Architecture files (transformer.cpp, qwen35.cpp)
// implement it. The model keeps no per-sequence state: each chunk says where its sequence's
// memory lives (K/V rows through its block table, recurrent state through `state`), and the
// runtime's sequence memory (runtime/sequence_memory.h) owns, snapshots and rolls it back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "infera/model/config.h"
#include "infera/model/kv_pool.h"
#include "infera/parallel/plan.h"

namespace infera::parallel {
class Communicator;
}

namespace infera {

class LoadProgress;
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
  // Hybrid models (Gated DeltaNet layers) only: where this sequence's recurrent state lives,
  // [Model::state_shape().floats()] f32 (per linear-attention layer, its conv state then its
  // delta-rule state), read and updated in place. The runtime's sequence memory owns it
  // (runtime/sequence_memory.h); the model keeps no per-sequence state. A chunk at pos0 == 0
  // starts a fresh sequence and the model zeroes the state itself; a chunk at pos0 > 0
  // continues it (after earlier chunks, or a checkpoint copied in).
  float* state = nullptr;
  // Hybrid models, speculative verification (StateShape::token_states): where to keep the
  // state after each of the chunk's first n_tokens - 1 tokens, [n_tokens - 1,
  // state_shape().floats()], so that the runtime can keep a prefix of the chunk without
  // running it again. Such a chunk runs the token-by-token recurrence, as decode does, not
  // the chunked rule. nullptr: not kept.
  float* token_states = nullptr;
  // A stable id of `state`'s storage (the runtime's slot), so that the ranks of a tensor-
  // parallel group each keep their heads' part of the state under the same id. -1: none.
  int32_t state_id = -1;
};

struct ForwardBatch {
  std::vector<int32_t> tokens;  // [n_tokens]
  std::vector<SeqChunk> seqs;
  int32_t num_logit_rows() const;
};

struct LoadOptions {
  bool load_into_memory = false;  // read weights into RAM instead of mmap
  int32_t max_batch_tokens = 512;  // scratch buffers are sized for this many tokens
  // Tensor / expert parallelism: which part of the model this rank loads and the group it
  // syncs with (docs/parallel.md). Default: one process, the whole model.
  parallel::ParallelPlan parallel;
  // Where load_model reports how far it has come (base/load_progress.h): it plans its steps
  // (reading with load_into_memory, converting for a GGUF file, binding) and ends each.
  std::shared_ptr<LoadProgress> progress;
};

// Geometry of one sequence's recurrent state (hybrid models; all zero otherwise): what the
// runtime's sequence memory allocates per sequence and hands to forward() in SeqChunk::state.
struct StateShape {
  int64_t num_layers = 0;  // layers with recurrent state (Gated DeltaNet)
  int64_t floats_per_layer = 0;  // conv state [kernel-1, conv_dim] then delta-rule state [Hv, dk, dv], f32
  // forward() can keep the state after each token of a chunk (SeqChunk::token_states).
  bool token_states = false;
  // The whole state is in this process. False on a tensor-parallel group, whose ranks each
  // hold their heads' part: the runtime cannot copy it out (snapshots, checkpoints).
  bool local = true;
  int64_t floats() const { return num_layers * floats_per_layer; }
  int64_t bytes() const { return floats() * static_cast<int64_t>(sizeof(float)); }
};

// The multi-token-prediction head (Qwen3.5 / Qwen3-Next mtp.*): the narrow capability the
// runtime's MTP drafter (runtime/drafter.h) uses. Model::mtp_head() is null without one.
class MtpHead {
 public:
  virtual ~MtpHead() = default;
  // When on, forward() leaves in last_hidden() the post-final-norm hidden state of EVERY
  // token of the batch, [batch.tokens.size(), hidden] in batch order, instead of only the
  // logits rows' (drafting needs the prompt's hidden states without paying for their
  // logits). Logits are unchanged.
  virtual void set_hidden_for_all_tokens(bool on) = 0;
  // After Model::forward(): the trunk's post-final-norm hidden state of every logits row,
  // [num_logit_rows, hidden] (every token's when set_hidden_for_all_tokens). After draft():
  // the head's own post-norm hidden state of each logits row, the stand-in for h_{p+1} when
  // drafting further tokens recursively.
  virtual const float* last_hidden() const = 0;
  // draft(batch, hidden, kv, logits): a chunk at pos0 = p holds tokens x_{p+1}, x_{p+2}, ...
  // and hidden [n_tokens, hidden] the trunk hidden h_p, h_{p+1}, ... (row order as tokens);
  // the head predicts the token after each x_{p+1}, writing logits rows like forward(). Its
  // one layer keeps its own K/V in KV layer kv_shape().num_layers - 1, in slot p for the pair
  // (h_p, x_{p+1}): a sequence must have drafted every earlier slot (feed the prompt through
  // draft once) for later drafts to see a complete context. Block tables cover the same
  // positions as the trunk's; the chunks' recurrent-state fields are not used.
  virtual void draft(const ForwardBatch& batch, const float* hidden, KvPool& kv, float* logits) = 0;
};

// A recurrent state split over the ranks of a group (StateShape::local false) copied
// whole, for state checkpoints (hybrid prefix caching): on rank 0, gather() collects every
// rank's part of the state that forward() keeps under a chunk's state_id, in rank order, and
// scatter() hands each rank its part back. Both are collectives of the whole group (rank 0
// drives them; the other ranks answer between forwards), so they are consistent by
// construction: only rank 0 decides what is checkpointed and restored.
class StateTransfer {
 public:
  virtual ~StateTransfer() = default;
  // Floats of the whole state: every rank's part (this rank's is StateShape::floats()).
  virtual int64_t whole_floats() const = 0;
  // whole[whole_floats()] := every rank's part of state `state_id`; `local` is this rank's.
  virtual void gather(int32_t state_id, const float* local, float* whole) = 0;
  // Every rank's state `state_id` := its part of whole[whole_floats()]; `local` is this rank's.
  virtual void scatter(int32_t state_id, const float* whole, float* local) = 0;
};

// Runtime work on every rank of a group between forwards (the prefix cache's disk tier,
// where each rank keeps its own shard of a KV block). Rank 0 posts a message of int32 words;
// every other rank's handler (run_parallel_worker's `on_message`) gets it with its own KV
// pool, sized like rank 0's `kv` as for a forward. After a post, rank 0 and the handlers may
// meet in collectives of comm(), in the same order on every rank: only rank 0 decides.
class GroupChannel {
 public:
  virtual ~GroupChannel() = default;
  virtual parallel::Communicator& comm() = 0;
  virtual void post(const std::vector<int32_t>& words, const KvPool& kv) = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }

  // Geometry of the KV pool this model needs (num_blocks left for the caller to set).
  virtual KvPoolShape kv_shape(int64_t block_size) const = 0;

  // Runs the batch, writing the new tokens' K/V into `kv` (the rows each chunk's block table
  // names), updating each chunk's recurrent state (SeqChunk::state), and the requested logits rows
  // (in batch order: per chunk, all rows when all_logits, else the last row when
  // last_logits) into `logits` [num_logit_rows, vocab_size].
  virtual void forward(const ForwardBatch& batch, KvPool& kv, float* logits) = 0;

  // Bytes of weights read for one decode token (bandwidth accounting).
  virtual int64_t weight_bytes_per_token() const = 0;
  virtual int64_t num_parameters() const = 0;

  // Geometry of one sequence's recurrent state (zero for attention-only models); the runtime
  // allocates it (runtime/sequence_memory.h) and passes it per chunk (SeqChunk::state).
  virtual StateShape state_shape() const { return {}; }
  // Copies a state that is not local (StateShape::local false) whole; null when it cannot
  // (and for a local state, which the runtime copies itself).
  virtual StateTransfer* state_transfer() { return nullptr; }
  // Over --tp/--ep ranks (on rank 0): the channel to the other ranks' runtime; null in one
  // process.
  virtual GroupChannel* group_channel() { return nullptr; }

  // ---- Mixture of experts ----
  // Tokens routed to each expert so far, [num_layers * num_experts] layer-major (dense
  // layers stay 0); empty for dense models. Uneven routing shows up here first.
  virtual std::vector<uint64_t> expert_counts() const { return {}; }
  virtual void reset_expert_counts() {}

  // ---- Multi-token prediction ----
  // The MTP head, or null when the checkpoint has none (or it was not loaded).
  virtual MtpHead* mtp_head() { return nullptr; }

  // ---- Tensor / expert parallel (docs/parallel.md) ----
  // What rank 0's collectives cost so far (ParallelModel); ranks 0 for one process.
  struct ParallelStats {
    int32_t ranks = 0;
    int64_t collectives = 0;
    int64_t bytes = 0;  // payload this rank contributed
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
