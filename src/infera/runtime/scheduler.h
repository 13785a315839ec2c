// Continuous batching. Each step packs, within max_batch_tokens and max_num_seqs:
//   1. every running sequence, oldest first: its decode token, or its next prefill chunk
//      (at most prefill_chunk tokens; decode tokens of the others are reserved first so
//      a long prefill never starves them);
//   2. then waiting sequences, oldest first (preempted ones at the front), each with its
//      first chunk, after a prefix-cache lookup that skips the blocks already cached.
// KV blocks are taken on demand, only for the positions a step writes. When none is
// left for a running sequence, the NEWEST running sequence is preempted: its blocks are
// released (its full blocks stay in the prefix cache until evicted) and it goes back to
// the front of the waiting queue, to be recomputed (prompt + generated so far) later.
// The oldest running sequence therefore always progresses, and admission guarantees a
// sequence alone fits in the KV cache, so nothing deadlocks.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "infera/runtime/engine_config.h"
#include "infera/runtime/prefix_cache.h"
#include "infera/runtime/sequence.h"

namespace infera {

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t pos0 = 0;  // = seq->num_computed when scheduled
  int32_t n_tokens = 0;  // tokens seq->tokens[pos0, pos0 + n_tokens)
  bool sample = false;  // the chunk reaches the end of the sequence: sample a token
  // Speculative decoding: seq->drafts.tokens[0, n_draft) follow the n_tokens real tokens
  // in the batch, at positions pos0 + n_tokens ..., to be verified (only when `sample`).
  // Their KV blocks are taken without preempting anyone: drafts that do not fit are dropped.
  int32_t n_draft = 0;
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;  // running sequences first, then newly admitted ones
  int32_t num_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

// Most tokens per step in chunks that still score prompt tokens (Request::prompt_logprobs),
// all sequences together: each such token returns a logits row.
inline constexpr int32_t kPromptLogprobsChunk = 128;

class Scheduler {
 public:
  Scheduler(const EngineConfig& config, KvBlockManager& blocks);

  // Appends to the waiting queue (the caller has validated and resolved the request).
  void add(std::unique_ptr<Sequence> seq);

  // Chooses the work of one forward and takes the KV blocks it writes. May preempt.
  StepPlan schedule();

  // After the forward: marks the chunk's tokens computed and registers the sequence's
  // newly completed full blocks in the prefix cache.
  void commit(const ScheduledChunk& chunk) { commit(chunk, chunk.n_tokens); }
  // Speculative verify: only the first n_kept fed tokens (real tokens, then accepted
  // drafts) stay computed; the K/V of the rest is left to be overwritten.
  void commit(const ScheduledChunk& chunk, int32_t n_kept);

  // Releases seq's blocks beyond those covering positions [0, n_positions) (rejected
  // draft tokens' blocks). They were never registered in the prefix cache.
  void trim_blocks(Sequence& seq, int32_t n_positions);
  // Grows seq's block table to cover [0, n_positions) without preempting anyone (MTP
  // drafting writes a few positions ahead). False when the blocks are not available.
  bool try_reserve_blocks(Sequence& seq, int32_t n_positions) { return reserve_blocks(seq, n_positions); }

  // Removes a sequence (finished, cancelled or failed) and releases its blocks. Returns
  // its ownership; null when the id is unknown.
  std::unique_ptr<Sequence> remove(RequestId id);

  Sequence* find(RequestId id);
  // The most leading blocks of seq's tokens a prefix-cache lookup at admission may reuse.
  int32_t max_lookup_blocks(const Sequence& seq) const;
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  const std::deque<std::unique_ptr<Sequence>>& waiting() const { return waiting_; }

 private:
  // Grows seq's block table to cover positions [0, n_positions). False (nothing taken)
  // when not enough blocks are available.
  bool reserve_blocks(Sequence& seq, int32_t n_positions);
  void release_blocks(Sequence& seq);
  void preempt_newest();
  // Most tokens one chunk of seq feeds: prefill_chunk, or while it scores its prompt at most
  // the step's scoring rows left.
  int32_t chunk_limit(const Sequence& seq, int32_t score_rows_left) const;
  // n, or fewer so that a chunk of seq ends at its next state-checkpoint position.
  int32_t cut_at_checkpoint(const Sequence& seq, int32_t n) const;

  EngineConfig config_;
  KvBlockManager& blocks_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order, oldest first
  std::deque<std::unique_ptr<Sequence>> waiting_;
  int32_t watermark_blocks_ = 0;  // admission leaves this many blocks for running decodes
  int64_t num_preemptions_ = 0;
};

}  // namespace infera
