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
#pragma once

#include <cstdint>
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
  // end of the LRU); an unregistered one goes back to the allocator.
  void release(int32_t block);
  int32_t refcount(int32_t block) const { return refcount_[block]; }

  // Looks up the leading full blocks of `tokens` (at most max_blocks of them) and takes a
  // reference on each hit, stopping at the first miss. Returns the hit blocks in order;
  // *chain_hash receives the hash of the last hit (unchanged when none). Counts
  // hits and misses over the max_blocks blocks asked for. Empty when disabled.
  std::vector<int32_t> match_prefix(std::span<const int32_t> tokens, int32_t max_blocks, uint64_t* chain_hash);

  // Registers `block` (full, computed) as holding `tokens` [block_size] after the prefix
  // whose chain hash is `parent_hash` (kRootHash for the first block). Returns the
  // block's chain hash. If another block already holds the same prefix, `block` stays
  // unregistered (it is freed normally) and the same hash is returned.
  uint64_t register_block(int32_t block, uint64_t parent_hash, std::span<const int32_t> tokens);

  static constexpr uint64_t kRootHash = 0x9E3779B97F4A7C15ull;
  static uint64_t chain_hash(uint64_t parent_hash, std::span<const int32_t> tokens);

  // Counters since construction.
  int64_t hit_blocks() const { return hit_blocks_; }
  int64_t miss_blocks() const { return miss_blocks_; }
  int64_t evictions() const { return evictions_; }

 private:
  void lru_push_back(int32_t block);
  void lru_remove(int32_t block);
  void evict(int32_t block);

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
};

}  // namespace infera
