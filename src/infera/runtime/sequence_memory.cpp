#include "infera/runtime/sequence_memory.h"

#include <algorithm>
#include <cstring>

#include "infera/base/error.h"

namespace infera {

// ---- PagedKvMemory ----------------------------------------------------------------------

PagedKvMemory::PagedKvMemory(const KvPoolShape& shape, bool prefix_cache)
    : kv_(shape),
      blocks_(static_cast<int32_t>(shape.num_blocks), static_cast<int32_t>(shape.block_size), prefix_cache) {}

void PagedKvMemory::bind(SeqId id, std::span<const int32_t> block_table, SeqChunk& chunk) {
  chunk.block_table = block_table.data();
  chunk.n_blocks = static_cast<int32_t>(block_table.size());
  Entry& e = entries_[id];
  if (e.snapshot >= 0 && e.snapshot != chunk.pos0) {
    fail("sequence memory: the chunk after a snapshot at position {} starts at {}", e.snapshot, chunk.pos0);
  }
  e.length = chunk.pos0 + chunk.n_tokens;
}

int32_t PagedKvMemory::length(SeqId id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? 0 : it->second.length;
}

void PagedKvMemory::snapshot(SeqId id) {
  Entry& e = entries_[id];
  e.snapshot = e.length;
}

int32_t PagedKvMemory::fed_since_snapshot(SeqId id) const {
  auto it = entries_.find(id);
  return it == entries_.end() || it->second.snapshot < 0 ? 0 : it->second.length - it->second.snapshot;
}

int32_t PagedKvMemory::commit(SeqId id, int32_t n) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.snapshot < 0) fail("sequence memory: commit without a snapshot");
  Entry& e = it->second;
  if (n < 0 || n > e.length - e.snapshot) {
    fail("sequence memory: cannot keep {} tokens, {} were fed since the snapshot", n, e.length - e.snapshot);
  }
  // Rows past the length are simply not read (attention stops at the sequence's length) and
  // are overwritten by the next chunk.
  e.length = e.snapshot + n;
  e.snapshot = -1;
  return e.length;
}

void PagedKvMemory::set_length(SeqId id, int32_t length) {
  Entry& e = entries_[id];
  e.length = length;
  e.snapshot = -1;
}

void PagedKvMemory::checkpoint(SeqId id, int32_t position, MemoryCheckpoint& out) const {
  const int32_t n = length(id);
  if (position < 0 || position > n)
    fail("sequence memory: no checkpoint at position {} (the sequence holds {})", position, n);
  out.position = position;
  out.state.clear();  // the K/V rows of [0, position) stay in their blocks
}

void PagedKvMemory::restore(SeqId id, const MemoryCheckpoint& cp) {
  if (cp.position < 0) fail("sequence memory: restore from an empty checkpoint");
  set_length(id, cp.position);
}

// ---- RecurrentMemory --------------------------------------------------------------------

RecurrentMemory::RecurrentMemory(const StateShape& shape, int32_t num_seqs, int32_t max_verify_tokens,
                                 StateTransfer* transfer)
    : shape_(shape),
      transfer_(shape.local ? nullptr : transfer),
      max_token_states_(shape.token_states && max_verify_tokens > 1 ? max_verify_tokens - 1 : 0) {
  INFERA_ASSERT(shape.floats() > 0, "a recurrent memory for a model without recurrent state");
  slots_.resize(static_cast<size_t>(std::max(num_seqs, 1)));
  for (Slot& s : slots_) s.state.assign(static_cast<size_t>(shape_.floats()), 0.0f);
  // Slot 0 first.
  for (int32_t i = static_cast<int32_t>(slots_.size()) - 1; i >= 0; --i) free_slots_.push_back(i);
}

int64_t RecurrentMemory::checkpoint_state_bytes() const {
  return transfer_ ? transfer_->whole_floats() * static_cast<int64_t>(sizeof(float)) : shape_.bytes();
}

int32_t RecurrentMemory::take_slot() {
  if (free_slots_.empty()) {
    // Preempted sequences keep their state while they wait, so states can outnumber the
    // sequences that run at once. (Moving a Slot keeps its buffers: bound pointers stay valid.)
    slots_.emplace_back();
    slots_.back().state.assign(static_cast<size_t>(shape_.floats()), 0.0f);
    return static_cast<int32_t>(slots_.size()) - 1;
  }
  const int32_t slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

RecurrentMemory::Entry& RecurrentMemory::entry(SeqId id) {
  auto [it, fresh] = entries_.try_emplace(id);
  if (fresh) it->second.slot = take_slot();
  return it->second;
}

const RecurrentMemory::Entry& RecurrentMemory::existing(SeqId id) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) fail("sequence memory: unknown sequence {}", id);
  return it->second;
}

void RecurrentMemory::require_local(const char* what) const {
  if (!shape_.local) {
    fail(
        "{}: the recurrent state is split over the --tp/--ep ranks and cannot be copied (speculative decoding "
        "and state checkpoints need one process); run without --speculative",
        what);
  }
}

void RecurrentMemory::bind(SeqId id, std::span<const int32_t> block_table, SeqChunk& chunk) {
  (void)block_table;
  Entry& e = entry(id);
  // The state has absorbed exactly `length` tokens: a chunk continues there, or starts over
  // at 0 (the model zeroes the state then).
  if (chunk.pos0 != 0 && chunk.pos0 != e.length) {
    fail("sequence memory: a chunk at position {} does not continue the recurrent state, which holds {} tokens",
         chunk.pos0, e.length);
  }
  Slot& slot = slots_[static_cast<size_t>(e.slot)];
  chunk.state = slot.state.data();
  chunk.state_id = e.slot;
  chunk.token_states = nullptr;
  e.token_states = 0;
  if (e.snapshot >= 0) {
    if (chunk.pos0 != e.snapshot) {
      fail("sequence memory: the chunk after a snapshot at position {} starts at {}", e.snapshot, chunk.pos0);
    }
    if (chunk.n_tokens > 1 && chunk.n_tokens - 1 <= max_token_states_) {
      // The model keeps the state after each token but the last: a commit is one copy.
      slot.token_states.resize(static_cast<size_t>(max_token_states_ * shape_.floats()));
      chunk.token_states = slot.token_states.data();
      e.token_states = chunk.n_tokens - 1;
    } else {
      slot.snapshot.assign(slot.state.begin(), slot.state.end());
      e.snapshot_copied = true;
    }
  }
  e.chunk_begin = chunk.pos0;
  e.length = chunk.pos0 + chunk.n_tokens;
}

void RecurrentMemory::release(SeqId id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  free_slots_.push_back(it->second.slot);
  entries_.erase(it);
}

int32_t RecurrentMemory::length(SeqId id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? 0 : it->second.length;
}

const float* RecurrentMemory::state(SeqId id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : slots_[static_cast<size_t>(it->second.slot)].state.data();
}

void RecurrentMemory::snapshot(SeqId id) {
  require_local("recurrent-state snapshot");
  Entry& e = entry(id);
  e.snapshot = e.length;
  e.snapshot_copied = false;  // taken when the chunk is bound (unless token states make it unneeded)
}

int32_t RecurrentMemory::fed_since_snapshot(SeqId id) const {
  auto it = entries_.find(id);
  return it == entries_.end() || it->second.snapshot < 0 ? 0 : it->second.length - it->second.snapshot;
}

int32_t RecurrentMemory::commit(SeqId id, int32_t n) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.snapshot < 0) fail("sequence memory: commit without a snapshot");
  Entry& e = it->second;
  const int32_t fed = e.length - e.snapshot;
  if (n < 0 || n > fed) fail("sequence memory: cannot keep {} tokens, {} were fed since the snapshot", n, fed);
  Slot& slot = slots_[static_cast<size_t>(e.slot)];
  const size_t floats = static_cast<size_t>(shape_.floats());
  if (n < fed) {
    if (n >= 1 && n <= e.token_states) {
      // The state after the n-th token of the chunk was kept during the forward.
      std::memcpy(slot.state.data(), slot.token_states.data() + static_cast<size_t>(n - 1) * floats,
                  floats * sizeof(float));
      e.length = e.snapshot + n;
      e.token_states = n - 1;  // those before it stay valid positions of the sequence
    } else if (e.snapshot_copied) {
      // The state has absorbed the dropped tokens: back to the snapshot; the caller feeds
      // the kept ones again.
      std::memcpy(slot.state.data(), slot.snapshot.data(), floats * sizeof(float));
      e.length = e.snapshot;
      e.token_states = 0;
    } else {
      fail(
          "sequence memory: keeping {} of {} tokens needs the state before them, which was not kept (token states "
          "start after the chunk's first token)",
          n, fed);
    }
  }
  e.snapshot = -1;
  e.snapshot_copied = false;
  return e.length;
}

bool RecurrentMemory::has_state_at(SeqId id, int32_t position) const {
  if (!copyable()) return false;
  const auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  const Entry& e = it->second;
  return position == e.length || (position > e.chunk_begin && position - e.chunk_begin <= e.token_states);
}

void RecurrentMemory::checkpoint(SeqId id, int32_t position, MemoryCheckpoint& out) const {
  if (!copyable()) require_local("recurrent-state checkpoint");
  const Entry& e = existing(id);
  const Slot& slot = slots_[static_cast<size_t>(e.slot)];
  const size_t floats = static_cast<size_t>(shape_.floats());
  const float* src = nullptr;
  if (position == e.length) {
    src = slot.state.data();
  } else if (position > e.chunk_begin && position - e.chunk_begin <= e.token_states) {
    src = slot.token_states.data() + static_cast<size_t>(position - e.chunk_begin - 1) * floats;
  } else {
    fail(
        "sequence memory: no recurrent state at position {} (the sequence is at {}; checkpoints are taken at its "
        "current position or inside its last verify chunk)",
        position, e.length);
  }
  out.position = position;
  if (transfer_) {
    // Every rank's part of the slot (no token states over ranks: src is the slot's state).
    out.state.resize(static_cast<size_t>(transfer_->whole_floats()));
    transfer_->gather(e.slot, src, out.state.data());
    return;
  }
  out.state.assign(src, src + floats);
}

void RecurrentMemory::restore(SeqId id, const MemoryCheckpoint& cp) {
  if (!copyable()) require_local("recurrent-state restore");
  if (cp.position < 0) fail("sequence memory: restore from an empty checkpoint");
  const int64_t whole = checkpoint_state_bytes() / static_cast<int64_t>(sizeof(float));
  if (cp.state.size() != static_cast<size_t>(whole)) {
    fail("sequence memory: the checkpoint holds {} state floats, this model's state has {}", cp.state.size(), whole);
  }
  Entry& e = entry(id);
  float* state = slots_[static_cast<size_t>(e.slot)].state.data();
  if (transfer_) {
    transfer_->scatter(e.slot, cp.state.data(), state);
  } else {
    std::copy(cp.state.begin(), cp.state.end(), state);
  }
  e.length = cp.position;
  e.chunk_begin = cp.position;
  e.token_states = 0;
  e.snapshot = -1;
  e.snapshot_copied = false;
}

// ---- HybridMemory -----------------------------------------------------------------------

HybridMemory::HybridMemory(const KvPoolShape& kv_shape, const StateShape& state_shape, int32_t num_seqs,
                           int32_t max_verify_tokens, bool prefix_cache, StateTransfer* transfer)
    // A prefix hit needs the recurrent state after the prefix: the prefix cache keeps state
    // checkpoints, which a state split over ranks provides only through a StateTransfer (no
    // prefix caching without one).
    : kv_(kv_shape, prefix_cache && (state_shape.local || transfer != nullptr)),
      state_(state_shape, num_seqs, max_verify_tokens, transfer) {
  if (kv_.blocks_.prefix_cache_enabled()) kv_.blocks_.enable_checkpoints(kv_.kv_.bytes_per_block());
}

void HybridMemory::bind(SeqId id, std::span<const int32_t> block_table, SeqChunk& chunk) {
  kv_.bind(id, block_table, chunk);
  state_.bind(id, block_table, chunk);
}

void HybridMemory::release(SeqId id) {
  kv_.release(id);
  state_.release(id);
}

void HybridMemory::snapshot(SeqId id) {
  state_.snapshot(id);
  kv_.snapshot(id);
}

int32_t HybridMemory::commit(SeqId id, int32_t n) {
  const int32_t kept = state_.commit(id, n);
  kv_.set_length(id, kept);
  return kept;
}

void HybridMemory::checkpoint(SeqId id, int32_t position, MemoryCheckpoint& out) const {
  state_.checkpoint(id, position, out);
}

void HybridMemory::restore(SeqId id, const MemoryCheckpoint& cp) {
  state_.restore(id, cp);
  kv_.restore(id, cp);
}

std::unique_ptr<SequenceMemory> make_sequence_memory(Model& model, const KvPoolShape& kv_shape,
                                                     const SequenceMemoryOptions& options) {
  const StateShape state = model.state_shape();
  if (state.floats() > 0) {
    return std::make_unique<HybridMemory>(kv_shape, state, options.num_seqs, options.max_verify_tokens,
                                          options.prefix_cache, state.local ? nullptr : model.state_transfer());
  }
  return std::make_unique<PagedKvMemory>(kv_shape, options.prefix_cache);
}

}  // namespace infera
