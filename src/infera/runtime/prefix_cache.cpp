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
      lru_next_(num_blocks, -1),
      lru_tick_(num_blocks, 0) {
  INFERA_ASSERT(num_blocks > 0 && block_size > 0);
  if (enable_prefix_cache_) {
    block_tokens_.resize(static_cast<size_t>(num_blocks) * block_size);
    by_hash_.reserve(static_cast<size_t>(num_blocks));
  }
}

uint64_t KvBlockManager::chain_hash(uint64_t parent_hash, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent_hash);
}

uint64_t KvBlockManager::root_hash(uint64_t salt) {
  return salt == 0 ? kRootHash : XXH3_64bits_withSeed(&salt, sizeof(salt), kRootHash);
}

void KvBlockManager::lru_push_back(int32_t b) {
  lru_tick_[b] = ++tick_;
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
  if (spill_) {
    const auto it = checkpoints_.find(hash_[b]);
    spill_(b, hash_[b],
           std::span<const int32_t>(block_tokens_).subspan(static_cast<size_t>(b) * block_size_, block_size_),
           it != checkpoints_.end() && it->second.block == b ? &it->second.state : nullptr);
  }
  if (block_has_checkpoint(b)) {
    // The checkpoint resumes after this block's prefix: useless without it.
    drop_checkpoint(hash_[b]);
    ++checkpoint_evictions_;
  }
  by_hash_.erase(hash_[b]);
  registered_[b] = 0;
  ++evictions_;
}

int32_t KvBlockManager::reserved_for(int64_t bytes) const {
  return bytes_per_block_ > 0 ? static_cast<int32_t>((bytes + bytes_per_block_ - 1) / bytes_per_block_) : 0;
}

void KvBlockManager::drop_checkpoint(uint64_t hash) {
  const auto it = checkpoints_.find(hash);
  if (it == checkpoints_.end()) return;
  block_checkpoint_[static_cast<size_t>(it->second.block)] = 0;
  checkpoint_bytes_ -= static_cast<int64_t>(it->second.state.size() * sizeof(float));
  checkpoint_lru_.erase(it->second.lru);
  checkpoints_.erase(it);
  reserved_blocks_ = reserved_for(checkpoint_bytes_);
}

int32_t KvBlockManager::evict_oldest(bool* evicted_any) {
  *evicted_any = false;
  const bool have_block = lru_head_ >= 0;
  if (!have_block && checkpoint_lru_.empty()) return -1;
  *evicted_any = true;
  if (!checkpoint_lru_.empty() &&
      (!have_block || checkpoints_.at(checkpoint_lru_.front()).tick < lru_tick_[lru_head_])) {
    const uint64_t hash = checkpoint_lru_.front();
    if (spill_) {
      const Checkpoint& cp = checkpoints_.at(hash);
      spill_(cp.block, hash,
             std::span<const int32_t>(block_tokens_).subspan(static_cast<size_t>(cp.block) * block_size_, block_size_),
             &cp.state);
    }
    drop_checkpoint(hash);
    ++checkpoint_evictions_;
    return -1;
  }
  const int32_t b = lru_head_;
  lru_remove(b);
  evict(b);
  return b;
}

int32_t KvBlockManager::allocate() {
  // Free blocks beyond those held back for the checkpoints' bytes; else evict the oldest
  // cached block (taken directly) or checkpoint (which frees reserved blocks).
  int32_t b = -1;
  for (;;) {
    if (allocator_.num_free() > reserved_blocks_) {
      b = allocator_.allocate();
      break;
    }
    bool any = false;
    b = evict_oldest(&any);
    if (b >= 0) break;
    if (!any) return -1;
  }
  INFERA_ASSERT(refcount_[b] == 0 && !registered_[b]);
  refcount_[b] = 1;
  return b;
}

void KvBlockManager::release(int32_t b, bool low_value) {
  INFERA_ASSERT(b >= 0 && b < num_blocks() && refcount_[b] > 0, "releasing a block nobody holds");
  if (--refcount_[b] > 0) return;
  if (!registered_[b]) {
    allocator_.free(b);
    return;
  }
  if (!low_value || lru_head_ < 0) {
    lru_push_back(b);
    if (low_value) lru_tick_[b] = 0;
    return;
  }
  // Front of the LRU: evicted before anything released normally.
  lru_tick_[b] = 0;
  lru_prev_[b] = -1;
  lru_next_[b] = lru_head_;
  lru_prev_[lru_head_] = b;
  lru_head_ = b;
  ++num_evictable_;
}

void KvBlockManager::for_each_registered(const SpillFn& fn) const {
  auto visit = [&](int32_t b) {
    const auto it = checkpoints_.find(hash_[b]);
    fn(b, hash_[b], std::span<const int32_t>(block_tokens_).subspan(static_cast<size_t>(b) * block_size_, block_size_),
       it != checkpoints_.end() && it->second.block == b ? &it->second.state : nullptr);
  };
  for (int32_t b = 0; b < num_blocks(); ++b) {
    if (registered_[b] && refcount_[b] > 0) visit(b);
  }
  for (int32_t b = lru_tail_; b >= 0; b = lru_prev_[b]) visit(b);
}

void KvBlockManager::enable_checkpoints(int64_t bytes_per_block) {
  INFERA_ASSERT(bytes_per_block > 0);
  if (!enable_prefix_cache_) return;
  bytes_per_block_ = bytes_per_block;
  block_checkpoint_.assign(static_cast<size_t>(num_blocks()), 0);
}

bool KvBlockManager::add_checkpoint(uint64_t hash, std::span<const float> state) {
  if (!checkpoints_enabled() || checkpoints_.contains(hash) || !by_hash_.contains(hash)) return false;
  const int64_t bytes = static_cast<int64_t>(state.size_bytes());
  const int32_t need = reserved_for(checkpoint_bytes_ + bytes);
  // Checkpoints take at most half of the pool, and only what evicting cached blocks and
  // older checkpoints can give back.
  // The block the checkpoint belongs to is held while room is made (never evicted for it).
  const int32_t owner = by_hash_.at(hash);
  const bool owner_cached = refcount_[owner] == 0;
  if (owner_cached) lru_remove(owner);
  ++refcount_[owner];
  bool room = need <= num_blocks() / 2 && need <= allocator_.num_free() + num_evictable_;
  while (room && allocator_.num_free() < need) {
    bool any = false;
    const int32_t b = evict_oldest(&any);
    if (b >= 0) allocator_.free(b);
    room = any;
  }
  if (!room) {
    release(owner);
    return false;
  }
  Checkpoint* cp = &checkpoints_[hash];
  cp->block = owner;
  // Stamped before its block goes back to the cached ones: under pressure the checkpoint
  // goes before the block it needs.
  cp->tick = ++tick_;
  release(owner);
  cp->lru = checkpoint_lru_.insert(checkpoint_lru_.end(), hash);
  cp->state.assign(state.begin(), state.end());
  block_checkpoint_[static_cast<size_t>(owner)] = 1;
  checkpoint_bytes_ += bytes;
  reserved_blocks_ = reserved_for(checkpoint_bytes_);
  ++checkpoints_stored_;
  return true;
}

std::vector<int32_t> KvBlockManager::match_prefix(std::span<const int32_t> tokens, int32_t max_blocks, uint64_t* chain,
                                                  std::vector<float>* checkpoint_state, uint64_t root) {
  std::vector<int32_t> hits;
  if (!enable_prefix_cache_ || max_blocks <= 0) return hits;
  max_blocks = std::min<int32_t>(max_blocks, static_cast<int32_t>(tokens.size() / block_size_));
  uint64_t h = root;
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
  }
  if (checkpoints_enabled()) {
    // A hybrid resumes only where a state checkpoint was kept: the deepest hit carrying one.
    size_t keep = hits.size();
    while (keep > 0 && !block_has_checkpoint(hits[keep - 1])) --keep;
    while (hits.size() > keep) {
      release(hits.back(), /*low_value=*/true);
      hits.pop_back();
    }
    if (keep > 0) {
      Checkpoint& cp = checkpoints_.at(hash_[hits.back()]);
      cp.tick = ++tick_;
      checkpoint_lru_.splice(checkpoint_lru_.end(), checkpoint_lru_, cp.lru);
      if (checkpoint_state) checkpoint_state->assign(cp.state.begin(), cp.state.end());
      ++checkpoint_hits_;
    }
  }
  if (!hits.empty()) *chain = hash_[hits.back()];
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
