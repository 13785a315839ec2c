// Sequence memory: everything a model keeps per sequence between forwards, behind one
// interface owned by the runtime. The model keeps none of it: before each forward the
// memory says, per chunk, where the sequence's K/V rows live (its block table into the
// memory's KvPool) and where its recurrent state lives (SeqChunk::state), and the model reads
// and writes there.
//
//   PagedKvMemory   attention K/V in a block pool (KvPool), blocks handed out by a
//                   KvBlockManager (ref counts, prefix cache). Rolling back is free: rows past
//                   a sequence's length are ignored and overwritten later.
//   RecurrentMemory one fixed-size recurrent state per sequence (Gated DeltaNet conv +
//                   delta-rule state). It has absorbed every token fed, so rolling back needs
//                   a copy: the state after each token of a verify chunk (token states), or a
//                   snapshot of the state before it.
//   HybridMemory    both (Qwen3.5 / Qwen3-Next).
//
// Per sequence (by id), around a forward that may be undone (speculative verification):
//   snapshot(id)     the sequence's current length L becomes the point to return to;
//   bind(id, ...)    the chunk at L feeds tokens tentatively;
//   commit(id, n)    keeps the first n tokens fed since the snapshot (the rest rolled back);
//   rollback(id, n)  drops the last n tokens fed since the snapshot (= commit(fed - n)).
// Both answer the length the memory now holds: L + n, or L when the state could only go
// back to the snapshot (no token states); the caller then feeds those tokens again.
//
// Checkpoints (hybrid prefix caching builds on them): checkpoint(id, p) copies what a new
// sequence needs to continue from position p (the recurrent state after p tokens; the K/V
// rows of [0, p) stay in their blocks, shared through the prefix cache), and restore(id, cp)
// starts another sequence there.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "infera/model/model.h"
#include "infera/runtime/prefix_cache.h"

namespace infera {

using SeqId = uint64_t;  // the engine's RequestId

// What a sequence needs to continue from `position` in another sequence.
struct MemoryCheckpoint {
  int32_t position = -1;  // tokens absorbed; -1: empty
  std::vector<float> state;  // recurrent state after them [StateShape::floats()]; empty without one
  int64_t bytes() const { return static_cast<int64_t>(state.size() * sizeof(float)); }
};

class SequenceMemory {
 public:
  virtual ~SequenceMemory() = default;

  // The K/V pool and its block manager; null for a memory without attention layers.
  virtual KvPool* kv() { return nullptr; }
  virtual KvBlockManager* blocks() { return nullptr; }
  // Bytes of one sequence's recurrent state (0 without one); over --tp/--ep ranks this
  // rank's part.
  virtual int64_t state_bytes() const { return 0; }
  // Bytes of the state a checkpoint() copies: the whole state (every rank's part).
  virtual int64_t checkpoint_state_bytes() const { return state_bytes(); }
  // A sequence can start from a prefix-cache hit: its blocks alone hold everything before
  // it (paged KV), or the prefix cache keeps state checkpoints beside them (hybrid, when
  // the state can be copied: locally, or through the model's StateTransfer over --tp/--ep
  // ranks). False for a bare recurrent memory.
  virtual bool resumes_from_prefix() const { return true; }
  // Whether checkpoint(id, position) can answer now (see checkpoint()).
  virtual bool has_state_at(SeqId id, int32_t position) const { return position >= 0 && position <= length(id); }

  // Fills `chunk`'s memory fields (block table, recurrent state, token states) for a
  // forward of chunk.n_tokens tokens at chunk.pos0 of sequence `id` (taking its state on the
  // first call). `block_table` covers the chunk's positions and must stay valid through the
  // forward. The memory then holds pos0 + n_tokens positions of the sequence.
  virtual void bind(SeqId id, std::span<const int32_t> block_table, SeqChunk& chunk) = 0;
  // Forgets sequence `id` (its state is reused by later sequences).
  virtual void release(SeqId id) = 0;
  // Positions the memory holds for `id` (0 for an unknown id).
  virtual int32_t length(SeqId id) const = 0;

  virtual void snapshot(SeqId id) = 0;
  virtual int32_t commit(SeqId id, int32_t n) = 0;
  int32_t rollback(SeqId id, int32_t n) { return commit(id, fed_since_snapshot(id) - n); }
  // Tokens fed since the snapshot (0 without one).
  virtual int32_t fed_since_snapshot(SeqId id) const = 0;

  // `position`: the sequence's length, or (with token states) a position inside the last
  // verify chunk not yet committed past. Throws infera::Error otherwise.
  virtual void checkpoint(SeqId id, int32_t position, MemoryCheckpoint& out) const = 0;
  // Sequence `id` (new, or restarted) continues from cp.position: its next chunk starts
  // there, over a block table whose blocks hold the K/V of [0, cp.position).
  virtual void restore(SeqId id, const MemoryCheckpoint& cp) = 0;
};

class PagedKvMemory final : public SequenceMemory {
 public:
  // shape.num_blocks blocks; `prefix_cache`: full blocks are registered and shared.
  PagedKvMemory(const KvPoolShape& shape, bool prefix_cache);

  KvPool* kv() override { return &kv_; }
  KvBlockManager* blocks() override { return &blocks_; }
  void bind(SeqId id, std::span<const int32_t> block_table, SeqChunk& chunk) override;
  void release(SeqId id) override { entries_.erase(id); }
  int32_t length(SeqId id) const override;
  void snapshot(SeqId id) override;
  int32_t commit(SeqId id, int32_t n) override;
  int32_t fed_since_snapshot(SeqId id) const override;
  void checkpoint(SeqId id, int32_t position, MemoryCheckpoint& out) const override;
  void restore(SeqId id, const MemoryCheckpoint& cp) override;

 private:
  struct Entry {
    int32_t length = 0;
    int32_t snapshot = -1;  // length at snapshot(); -1: none
  };
  friend class HybridMemory;
  void set_length(SeqId id, int32_t length);

  KvPool kv_;
  KvBlockManager blocks_;
  std::unordered_map<SeqId, Entry> entries_;
};

class RecurrentMemory final : public SequenceMemory {
 public:
  // `shape`: the model's (Model::state_shape()); states for `num_seqs` sequences to begin with
  // (more are added when needed: a preempted sequence keeps its state while it waits).
  // `max_verify_tokens`: the longest chunk whose per-token states are kept after snapshot()
  // (0 or 1: none; rollbacks then restore the snapshot and the caller re-feeds).
  // `transfer`: copies a state split over ranks (StateShape::local false) whole for
  // checkpoint() / restore() (Model::state_transfer(); null: they need a local state).
  RecurrentMemory(const StateShape& shape, int32_t num_seqs, int32_t max_verify_tokens,
                  StateTransfer* transfer = nullptr);

  int64_t state_bytes() const override { return shape_.bytes(); }
  int64_t checkpoint_state_bytes() const override;
  // checkpoint() / restore() work: the state is local, or a StateTransfer copies it.
  bool copyable() const { return shape_.local || transfer_ != nullptr; }
  bool resumes_from_prefix() const override { return false; }
  bool has_state_at(SeqId id, int32_t position) const override;
  void bind(SeqId id, std::span<const int32_t> block_table, SeqChunk& chunk) override;
  void release(SeqId id) override;
  int32_t length(SeqId id) const override;
  void snapshot(SeqId id) override;
  int32_t commit(SeqId id, int32_t n) override;
  int32_t fed_since_snapshot(SeqId id) const override;
  void checkpoint(SeqId id, int32_t position, MemoryCheckpoint& out) const override;
  void restore(SeqId id, const MemoryCheckpoint& cp) override;

  // Per-token states of verify chunks are kept (else: snapshot copies).
  bool keeps_token_states() const { return max_token_states_ > 0; }
  int32_t num_slots() const { return static_cast<int32_t>(slots_.size()); }
  // The state of sequence `id` (nullptr when unknown), [StateShape::floats()].
  const float* state(SeqId id) const;

 private:
  struct Slot {
    std::vector<float> state;  // [floats]
    std::vector<float> snapshot;  // [floats] the state at snapshot() (when no token states)
    std::vector<float> token_states;  // [max_token_states_, floats], allocated on first use
  };
  struct Entry {
    int32_t slot = -1;
    int32_t length = 0;
    int32_t snapshot = -1;  // length at snapshot(); -1: none
    int32_t chunk_begin = 0;  // first position of the last bound chunk
    int32_t token_states = 0;  // per-token states that chunk kept (after chunk_begin + 1 .. + token_states)
    bool snapshot_copied = false;
  };
  int32_t take_slot();
  Entry& entry(SeqId id);
  const Entry& existing(SeqId id) const;
  void require_local(const char* what) const;

  StateShape shape_;
  StateTransfer* transfer_ = nullptr;
  int32_t max_token_states_ = 0;
  std::vector<Slot> slots_;
  std::vector<int32_t> free_slots_;
  std::unordered_map<SeqId, Entry> entries_;
};

// Attention layers and recurrent layers: each call goes to both.
class HybridMemory final : public SequenceMemory {
 public:
  // `prefix_cache`: full blocks are registered and shared, with state checkpoints beside
  // them (KvBlockManager::enable_checkpoints); only when the state can be copied (local, or
  // whole through `transfer` over --tp/--ep ranks).
  HybridMemory(const KvPoolShape& kv_shape, const StateShape& state_shape, int32_t num_seqs, int32_t max_verify_tokens,
               bool prefix_cache = false, StateTransfer* transfer = nullptr);

  KvPool* kv() override { return kv_.kv(); }
  KvBlockManager* blocks() override { return kv_.blocks(); }
  int64_t state_bytes() const override { return state_.state_bytes(); }
  int64_t checkpoint_state_bytes() const override { return state_.checkpoint_state_bytes(); }
  bool resumes_from_prefix() const override { return kv_.blocks_.checkpoints_enabled(); }
  bool has_state_at(SeqId id, int32_t position) const override { return state_.has_state_at(id, position); }
  void bind(SeqId id, std::span<const int32_t> block_table, SeqChunk& chunk) override;
  void release(SeqId id) override;
  int32_t length(SeqId id) const override { return state_.length(id); }
  void snapshot(SeqId id) override;
  int32_t commit(SeqId id, int32_t n) override;
  int32_t fed_since_snapshot(SeqId id) const override { return state_.fed_since_snapshot(id); }
  void checkpoint(SeqId id, int32_t position, MemoryCheckpoint& out) const override;
  void restore(SeqId id, const MemoryCheckpoint& cp) override;

  RecurrentMemory& recurrent() { return state_; }

 private:
  PagedKvMemory kv_;
  RecurrentMemory state_;
};

struct SequenceMemoryOptions {
  int32_t num_seqs = 1;  // sequences at once (recurrent states to begin with)
  int32_t max_verify_tokens = 0;  // longest verify chunk whose per-token states are kept (0: none)
  bool prefix_cache = false;  // hybrids: with state checkpoints, when the state is local
};

// The memory `model` needs: paged KV for attention-only models, hybrid when the model also
// has recurrent state. `kv_shape` carries num_blocks and the KV dtype. A state split over
// ranks is checkpointed through the model's StateTransfer.
std::unique_ptr<SequenceMemory> make_sequence_memory(Model& model, const KvPoolShape& kv_shape,
                                                     const SequenceMemoryOptions& options);

}  // namespace infera
