#include "infera/runtime/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>

#include "infera/base/error.h"

namespace infera {

KvBlockManager::KvBlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_cache)
    : allocator_(num_blocks),
      block_size_(block_size),
      enable_prefix_cache_(enable_prefix_cache),
      refcount_(num_blocks, 0),
      registered_(num_blocks, 0),
      hash_(num_blocks, 0),
      lru_prev_(num_blocks, -1),
      lru_next_(num_blocks, -1) {
  INFERA_ASSERT(num_blocks > 0 && block_size > 0);
  if (enable_prefix_cache_) {
    block_tokens_.resize(static_cast<size_t>(num_blocks) * block_size);
    by_hash_.reserve(static_cast<size_t>(num_blocks));
  }
}

uint64_t KvBlockManager::chain_hash(uint64_t parent_hash, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent_hash);
}

void KvBlockManager::lru_push_back(int32_t b) {
  lru_prev_[b] = lru_tail_;
  lru_next_[b] = -1;
  if (lru_tail_ >= 0)
    lru_next_[lru_tail_] = b;
  else
    lru_head_ = b;
  lru_tail_ = b;
  ++num_evictable_;
}

void KvBlockManager::lru_remove(int32_t b) {
  const int32_t p = lru_prev_[b], n = lru_next_[b];
  if (p >= 0)
    lru_next_[p] = n;
  else
    lru_head_ = n;
  if (n >= 0)
    lru_prev_[n] = p;
  else
    lru_tail_ = p;
  lru_prev_[b] = lru_next_[b] = -1;
  --num_evictable_;
}

void KvBlockManager::evict(int32_t b) {
  by_hash_.erase(hash_[b]);
  registered_[b] = 0;
  ++evictions_;
}

int32_t KvBlockManager::allocate() {
  int32_t b = allocator_.allocate();
  if (b < 0) {
    if (lru_head_ < 0) return -1;
    b = lru_head_;
    lru_remove(b);
    evict(b);
  }
  INFERA_ASSERT(refcount_[b] == 0 && !registered_[b]);
  refcount_[b] = 1;
  return b;
}

void KvBlockManager::release(int32_t b) {
  INFERA_ASSERT(b >= 0 && b < num_blocks() && refcount_[b] > 0, "releasing a block nobody holds");
  if (--refcount_[b] > 0) return;
  if (registered_[b])
    lru_push_back(b);
  else
    allocator_.free(b);
}

std::vector<int32_t> KvBlockManager::match_prefix(std::span<const int32_t> tokens, int32_t max_blocks,
                                                  uint64_t* chain) {
  std::vector<int32_t> hits;
  if (!enable_prefix_cache_ || max_blocks <= 0) return hits;
  max_blocks = std::min<int32_t>(max_blocks, static_cast<int32_t>(tokens.size() / block_size_));
  uint64_t h = kRootHash;
  for (int32_t i = 0; i < max_blocks; ++i) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    h = chain_hash(h, block_tokens);
    const auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const int32_t b = it->second;
    if (!std::equal(block_tokens.begin(), block_tokens.end(),
                    block_tokens_.begin() + static_cast<size_t>(b) * block_size_))
      break;
    if (refcount_[b]++ == 0) lru_remove(b);
    hits.push_back(b);
    *chain = h;
  }
  hit_blocks_ += static_cast<int64_t>(hits.size());
  miss_blocks_ += max_blocks - static_cast<int64_t>(hits.size());
  return hits;
}

uint64_t KvBlockManager::register_block(int32_t b, uint64_t parent_hash, std::span<const int32_t> tokens) {
  INFERA_ASSERT(static_cast<int32_t>(tokens.size()) == block_size_ && refcount_[b] > 0);
  const uint64_t h = chain_hash(parent_hash, tokens);
  if (!enable_prefix_cache_ || registered_[b]) return h;
  if (by_hash_.emplace(h, b).second) {
    registered_[b] = 1;
    hash_[b] = h;
    std::copy(tokens.begin(), tokens.end(), block_tokens_.begin() + static_cast<size_t>(b) * block_size_);
  }
  return h;
}

}  // namespace infera
