// KV blocks with reference counts and a prefix cache on top of BlockAllocator.
//
// A FULL block whose K/V have been computed can be registered under a chain hash:
// hash(block i) = XXH3_64(tokens of block i, seed = hash(block i-1)), so a hash names the
// whole prefix up to and including the block, not only its own 16 tokens. A later
// sequence whose prompt starts with the same tokens looks the hashes up block by block and
// takes the cached blocks into its own block table (refcount + 1) instead of computing
// them. Shared blocks are never written (only full blocks are shared and a sequence only
// writes positions past its last full block), so no copy-on-write is needed.
//
// Block states:
//   free       refcount 0, not registered: in the BlockAllocator
//   in use     refcount >= 1 (registered or not)
//   cached     refcount 0, registered: kept with its K/V, evictable, in LRU order
// allocate() takes a free block first and evicts the least recently released cached
// block only when no free one is left, so cached prefixes live as long as memory allows.
//
// State checkpoints (hybrid models, enable_checkpoints()): a registered block can carry
// the recurrent state after the prefix that ends with it. A lookup then resumes only from
// the deepest hit block that carries one (its blocks alone cannot rebuild the state). A
// checkpoint's bytes come out of the same pool as the blocks: it holds ceil(bytes /
// bytes_per_block) free blocks back ("reserved"), and eviction takes whichever of the
// least recently used cached block and the least recently used checkpoint is older, so
// blocks and checkpoints compete for one budget. A checkpoint is never needed by a running
// sequence (a hit copies it), so it can always be evicted: the blocks available to
// allocate() are the free ones plus the cached ones, as without checkpoints. Evicting a
// block drops the checkpoint it carries; blocks released past a sequence's deepest
// checkpoint (useless to a hybrid until a deeper one is stored) go to the front of the LRU.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "infera/runtime/block_allocator.h"

namespace infera {

class KvBlockManager {
 public:
  KvBlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_cache);

  int32_t num_blocks() const { return allocator_.num_total(); }
  int32_t block_size() const { return block_size_; }
  bool prefix_cache_enabled() const { return enable_prefix_cache_; }

  // Blocks allocate() can hand out now: free ones plus evictable cached ones.
  int32_t num_available() const { return allocator_.num_free() + num_evictable_; }
  // Blocks referenced by at least one sequence.
  int32_t num_in_use() const { return num_blocks() - num_available(); }
  // Cached blocks nobody references (kept for future prefix hits).
  int32_t num_evictable() const { return num_evictable_; }

  // A block with refcount 1, or -1 when every block is in use.
  int32_t allocate();
  // Drops one reference. At zero a registered block becomes cached (most recently used
  // end of the LRU, or the least recently used end when `low_value`: evicted first); an
  // unregistered one goes back to the allocator.
  void release(int32_t block, bool low_value = false);
  int32_t refcount(int32_t block) const { return refcount_[block]; }

  // Looks up the leading full blocks of `tokens` (at most max_blocks of them) and takes a
  // reference on each hit, stopping at the first miss. Returns the hit blocks in order;
  // *chain_hash receives the hash of the last hit (unchanged when none). Counts
  // hits and misses over the max_blocks blocks asked for. Empty when disabled.
  // With checkpoints enabled the hits stop at the deepest block carrying a checkpoint, whose
  // state is copied into *checkpoint_state (not touched when there is no such hit).
  // `root`: the parent hash of the first block (root_hash(salt)).
  std::vector<int32_t> match_prefix(std::span<const int32_t> tokens, int32_t max_blocks, uint64_t* chain_hash,
                                    std::vector<float>* checkpoint_state = nullptr, uint64_t root = kRootHash);

  // Registers `block` (full, computed) as holding `tokens` [block_size] after the prefix
  // whose chain hash is `parent_hash` (kRootHash for the first block). Returns the
  // block's chain hash. If another block already holds the same prefix, `block` stays
  // unregistered (it is freed normally) and the same hash is returned.
  uint64_t register_block(int32_t block, uint64_t parent_hash, std::span<const int32_t> tokens);

  // ---- State checkpoints ----
  // Turns them on; a block is `bytes_per_block` bytes of the budget (the KV pool's).
  void enable_checkpoints(int64_t bytes_per_block);
  bool checkpoints_enabled() const { return bytes_per_block_ > 0; }
  // Keeps `state` as the checkpoint after the prefix whose chain hash is `hash` (a registered
  // block). Older cached blocks and checkpoints are evicted to make room. False (nothing
  // kept) when the hash names no registered block, it has a checkpoint already, or no
  // room can be made.
  bool add_checkpoint(uint64_t hash, std::span<const float> state);
  bool has_checkpoint(uint64_t hash) const { return checkpoints_.contains(hash); }
  // Whether `block` carries a checkpoint.
  bool block_has_checkpoint(int32_t block) const {
    return !block_checkpoint_.empty() && block_checkpoint_[static_cast<size_t>(block)] != 0;
  }
  int64_t num_checkpoints() const { return static_cast<int64_t>(checkpoints_.size()); }
  int64_t checkpoint_bytes() const { return checkpoint_bytes_; }
  // Free blocks held back for the checkpoints' bytes.
  int32_t num_reserved() const { return reserved_blocks_; }

  // ---- A second tier (runtime/disk_cache.h) ----
  // Called when a registered block is about to lose its contents (evicted for new data) or
  // its checkpoint (evicted for room): the block's K/V are still intact during the call.
  // `state`: the checkpoint after the block, null when it has none.
  using SpillFn = std::function<void(int32_t block, uint64_t hash, std::span<const int32_t> tokens,
                                     const std::vector<float>* state)>;
  void set_spill(SpillFn fn) { spill_ = std::move(fn); }
  // Calls `fn` for every registered block (held or cached), most recently used first.
  void for_each_registered(const SpillFn& fn) const;
  // The registered block holding the prefix `hash`, or -1.
  int32_t find(uint64_t hash) const {
    const auto it = by_hash_.find(hash);
    return it == by_hash_.end() ? -1 : it->second;
  }

  // Drops the checkpoint kept under `hash` (nothing when none).
  void remove_checkpoint(uint64_t hash) { drop_checkpoint(hash); }

  static constexpr uint64_t kRootHash = 0x9E3779B97F4A7C15ull;
  // The parent hash of a chain's first block: kRootHash, or a hash of it and `salt` when the
  // salt is not 0 (chains of different salts never meet).
  static uint64_t root_hash(uint64_t salt);
  static uint64_t chain_hash(uint64_t parent_hash, std::span<const int32_t> tokens);

  // Counters since construction.
  int64_t hit_blocks() const { return hit_blocks_; }
  int64_t miss_blocks() const { return miss_blocks_; }
  int64_t evictions() const { return evictions_; }
  int64_t checkpoint_hits() const { return checkpoint_hits_; }  // lookups that resumed from a checkpoint
  int64_t checkpoints_stored() const { return checkpoints_stored_; }
  int64_t checkpoint_evictions() const { return checkpoint_evictions_; }

 private:
  void lru_push_back(int32_t block);
  void lru_remove(int32_t block);
  void evict(int32_t block);
  struct Checkpoint {
    int32_t block = -1;
    uint64_t tick = 0;  // last stored or used
    std::list<uint64_t>::iterator lru;
    std::vector<float> state;
  };
  // Evicts the older of the LRU cached block and the LRU checkpoint. Returns the evicted
  // block (unregistered, refcount 0, not in the allocator) or -1 when a checkpoint went (or
  // nothing could).
  int32_t evict_oldest(bool* evicted_any);
  void drop_checkpoint(uint64_t hash);
  int32_t reserved_for(int64_t bytes) const;

  BlockAllocator allocator_;
  int32_t block_size_;
  bool enable_prefix_cache_;
  std::vector<int32_t> refcount_;  // [num_blocks]
  std::vector<uint8_t> registered_;  // [num_blocks]
  std::vector<uint64_t> hash_;  // [num_blocks] chain hash when registered
  // Tokens of each registered block [num_blocks, block_size]: a hit is confirmed by
  // comparing them, so a 64-bit hash collision on the block itself cannot return wrong K/V.
  std::vector<int32_t> block_tokens_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  // Intrusive doubly linked LRU of cached (refcount 0, registered) blocks; head = oldest.
  std::vector<int32_t> lru_prev_, lru_next_;
  int32_t lru_head_ = -1, lru_tail_ = -1;
  int32_t num_evictable_ = 0;
  int64_t hit_blocks_ = 0, miss_blocks_ = 0, evictions_ = 0;
  // LRU ticks of cached blocks [num_blocks] (0: released as low value) and of checkpoints.
  uint64_t tick_ = 0;
  std::vector<uint64_t> lru_tick_;
  int64_t bytes_per_block_ = 0;  // 0: no checkpoints
  std::unordered_map<uint64_t, Checkpoint> checkpoints_;  // by the chain hash of their block
  std::list<uint64_t> checkpoint_lru_;  // front = oldest
  std::vector<uint8_t> block_checkpoint_;  // [num_blocks] carries one
  int64_t checkpoint_bytes_ = 0;
  int32_t reserved_blocks_ = 0;  // ceil(checkpoint_bytes_ / bytes_per_block_), kept free
  int64_t checkpoint_hits_ = 0, checkpoints_stored_ = 0, checkpoint_evictions_ = 0;
  SpillFn spill_;
};

}  // namespace infera
