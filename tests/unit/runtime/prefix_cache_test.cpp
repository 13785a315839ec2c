#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "infera/base/error.h"
#include "infera/runtime/engine_config.h"
#include "infera/runtime/prefix_cache.h"

using namespace infera;

namespace {
std::vector<int32_t> iota_tokens(int32_t n, int32_t start) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}
}  // namespace

TEST(KvBlockManager, RefcountsAndFreeWithoutCache) {
  KvBlockManager m(4, 4, /*enable_prefix_cache=*/false);
  std::set<int32_t> got;
  for (int i = 0; i < 4; ++i) got.insert(m.allocate());
  EXPECT_EQ(got.size(), 4u);
  EXPECT_EQ(m.allocate(), -1);
  EXPECT_EQ(m.num_in_use(), 4);
  const auto tokens = iota_tokens(4, 0);
  m.register_block(0, KvBlockManager::kRootHash, tokens);  // ignored when disabled
  for (int32_t b : got) m.release(b);
  EXPECT_EQ(m.num_available(), 4);
  EXPECT_EQ(m.num_evictable(), 0);
  uint64_t chain = 0;
  EXPECT_TRUE(m.match_prefix(tokens, 1, &chain).empty());
}

TEST(KvBlockManager, CachedBlocksAreSharedAndEvictedLeastRecentlyUsedFirst) {
  const int32_t bs = 4;
  KvBlockManager m(3, bs, true);
  const auto a = iota_tokens(8, 100);  // two blocks
  const int32_t b0 = m.allocate(), b1 = m.allocate();
  uint64_t h = m.register_block(b0, KvBlockManager::kRootHash, std::span(a).subspan(0, bs));
  const uint64_t h1 = m.register_block(b1, h, std::span(a).subspan(bs, bs));
  EXPECT_EQ(h1, KvBlockManager::chain_hash(KvBlockManager::chain_hash(KvBlockManager::kRootHash,
                                                                      std::span(a).subspan(0, bs)),
                                           std::span(a).subspan(bs, bs)));
  // While held, a second sequence shares them (refcount 2).
  uint64_t chain = 0;
  auto hits = m.match_prefix(a, 2, &chain);
  ASSERT_EQ(hits, (std::vector<int32_t>{b0, b1}));
  EXPECT_EQ(chain, h1);
  EXPECT_EQ(m.refcount(b0), 2);
  EXPECT_EQ(m.hit_blocks(), 2);
  for (int i = 0; i < 2; ++i) {
    m.release(b1);
    m.release(b0);
  }
  // Released in order b1 then b0: both cached, b1 least recently released.
  EXPECT_EQ(m.num_evictable(), 2);
  EXPECT_EQ(m.num_available(), 3);
  EXPECT_EQ(m.num_in_use(), 0);
  const int32_t fresh = m.allocate();  // the never-used block first: no eviction yet
  EXPECT_NE(fresh, b0);
  EXPECT_NE(fresh, b1);
  EXPECT_EQ(m.evictions(), 0);
  EXPECT_EQ(m.allocate(), b1);  // then the LRU cached block
  EXPECT_EQ(m.evictions(), 1);
  // b1 is gone from the cache: a lookup of both blocks hits only the first.
  hits = m.match_prefix(a, 2, &chain);
  EXPECT_EQ(hits, (std::vector<int32_t>{b0}));
  EXPECT_EQ(m.miss_blocks(), 1);
}

TEST(KvBlockManager, DifferentPrefixSameBlockTokensDoesNotHit) {
  const int32_t bs = 4;
  KvBlockManager m(4, bs, true);
  const std::vector<int32_t> a = {1, 2, 3, 4, 9, 9, 9, 9};
  const std::vector<int32_t> b = {5, 6, 7, 8, 9, 9, 9, 9};  // same 2nd block, other parent
  const int32_t b0 = m.allocate(), b1 = m.allocate();
  const uint64_t h = m.register_block(b0, KvBlockManager::kRootHash, std::span(a).subspan(0, bs));
  m.register_block(b1, h, std::span(a).subspan(bs, bs));
  uint64_t chain = 0;
  EXPECT_TRUE(m.match_prefix(b, 2, &chain).empty());
  EXPECT_EQ(m.miss_blocks(), 2);
}

TEST(KvBlockManager, DuplicateRegistrationKeepsTheFirstBlock) {
  const int32_t bs = 2;
  KvBlockManager m(2, bs, true);
  const std::vector<int32_t> a = {7, 8};
  const int32_t x = m.allocate(), y = m.allocate();
  const uint64_t hx = m.register_block(x, KvBlockManager::kRootHash, a);
  const uint64_t hy = m.register_block(y, KvBlockManager::kRootHash, a);
  EXPECT_EQ(hx, hy);
  m.release(y);  // unregistered duplicate: straight back to the free list
  EXPECT_EQ(m.num_evictable(), 0);
  m.release(x);
  EXPECT_EQ(m.num_evictable(), 1);
}

TEST(ParseMemorySize, UnitsAndPercent) {
  EXPECT_EQ(parse_memory_size("1024"), 1024);
  EXPECT_EQ(parse_memory_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_memory_size("2g"), int64_t{2} << 30);
  EXPECT_EQ(parse_memory_size("512MB"), 512'000'000);
  EXPECT_EQ(parse_memory_size("512 MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_memory_size("1.5K"), 1536);
  EXPECT_EQ(parse_memory_size("3kb"), 3000);
  const int64_t phys = physical_memory_bytes();
  ASSERT_GT(phys, 0);
  EXPECT_NEAR(static_cast<double>(parse_memory_size("30%")), phys * 0.3, 1.0);
  for (const char* bad : {"", "GiB", "-1GiB", "1.2.3G", "12 parsecs", "0", "150%", "0%", "1e3"}) {
    EXPECT_THROW(parse_memory_size(bad), Error) << bad;
  }
  try {
    parse_memory_size("lots");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-cache-memory"), std::string::npos);
  }
}

TEST(KvBlockManager, CheckpointsBoundHitsAndShareTheBudget) {
  const int32_t bs = 4;
  KvBlockManager m(8, bs, true);
  m.enable_checkpoints(/*bytes_per_block=*/64);  // a 16-float state = one block
  const auto a = iota_tokens(12, 7);  // three blocks
  std::vector<int32_t> table;
  std::vector<uint64_t> hashes;
  uint64_t h = KvBlockManager::kRootHash;
  for (int i = 0; i < 3; ++i) {
    table.push_back(m.allocate());
    h = m.register_block(table.back(), h, std::span(a).subspan(size_t(i) * bs, bs));
    hashes.push_back(h);
  }
  // No checkpoint: a hybrid cannot resume anywhere.
  uint64_t chain = 0;
  std::vector<float> state;
  EXPECT_TRUE(m.match_prefix(a, 3, &chain, &state).empty());
  EXPECT_EQ(m.num_in_use(), 3);
  // A checkpoint after block 1 (position 8): hits stop there and copy the state.
  const std::vector<float> s1(16, 1.5f);
  ASSERT_TRUE(m.add_checkpoint(hashes[1], s1));
  EXPECT_FALSE(m.add_checkpoint(hashes[1], s1));  // one per prefix
  EXPECT_FALSE(m.add_checkpoint(12345, s1));  // no such block
  EXPECT_TRUE(m.block_has_checkpoint(table[1]));
  EXPECT_EQ(m.num_reserved(), 1);
  EXPECT_EQ(m.checkpoint_bytes(), 64);
  // Reserved blocks still count as available: a checkpoint can always be evicted.
  EXPECT_EQ(m.num_available(), 5);
  auto hits = m.match_prefix(a, 3, &chain, &state);
  EXPECT_EQ(hits, (std::vector<int32_t>{table[0], table[1]}));
  EXPECT_EQ(chain, hashes[1]);
  EXPECT_EQ(state, s1);
  EXPECT_EQ(m.checkpoint_hits(), 1);
  for (int32_t b : hits) m.release(b);
  // Release the sequence: block 2 is past the deepest checkpoint (low value, evicted first).
  m.release(table[2], true);
  m.release(table[1]);
  m.release(table[0]);
  EXPECT_EQ(m.num_evictable(), 3);
  // 8 blocks, 1 reserved: allocating the 4 free ones leaves the reserve; the next takes the
  // least valuable cached block (block 2), then the checkpoint goes (older than no block
  // left? no: blocks 1 and 0 were released after it was stored, so it is the oldest).
  std::vector<int32_t> taken;
  for (int i = 0; i < 4; ++i) taken.push_back(m.allocate());
  EXPECT_EQ(m.num_reserved(), 1);
  const int32_t fifth = m.allocate();
  EXPECT_EQ(fifth, table[2]);
  EXPECT_EQ(m.num_checkpoints(), 1);
  const int32_t sixth = m.allocate();  // the checkpoint is older than blocks 0 and 1
  EXPECT_GE(sixth, 0);
  EXPECT_EQ(m.num_checkpoints(), 0);
  EXPECT_EQ(m.num_reserved(), 0);
  EXPECT_EQ(m.checkpoint_evictions(), 1);
  // Blocks 0 and 1 are still cached, but without a checkpoint they are no hit.
  EXPECT_TRUE(m.match_prefix(a, 3, &chain, &state).empty());
  // (That lookup released blocks 0 and 1 at the front of the LRU: past any checkpoint.)
  // A checkpoint added to a cached block holds it while room is made (the low-value block
  // 1 goes), then the block is cached again, newer than its checkpoint: under pressure the
  // checkpoint goes first and block 0 stays.
  ASSERT_TRUE(m.add_checkpoint(hashes[0], s1));
  EXPECT_EQ(m.num_reserved(), 1);
  EXPECT_EQ(m.num_evictable(), 1);
  EXPECT_EQ(m.prefix_cache_enabled(), true);
  EXPECT_GE(m.allocate(), 0);
  EXPECT_EQ(m.num_checkpoints(), 0);
  EXPECT_EQ(m.num_reserved(), 0);
  EXPECT_EQ(m.num_evictable(), 1);
}

TEST(KvBlockManager, EvictingABlockDropsItsCheckpoint) {
  const int32_t bs = 4;
  KvBlockManager m(4, bs, true);
  m.enable_checkpoints(64);
  const auto a = iota_tokens(4, 1);
  const int32_t b = m.allocate();
  const uint64_t h = m.register_block(b, KvBlockManager::kRootHash, a);
  m.release(b);
  const std::vector<float> s(16, 2.0f);
  ASSERT_TRUE(m.add_checkpoint(h, s));
  // A lookup uses the checkpoint; the block released as low value is the oldest now.
  uint64_t chain = 0;
  std::vector<float> got;
  ASSERT_EQ(m.match_prefix(a, 1, &chain, &got), std::vector<int32_t>{b});
  m.release(b, /*low_value=*/true);
  int32_t taken = -1;
  for (int i = 0; i < 3 && taken != b; ++i) taken = m.allocate();
  EXPECT_EQ(taken, b);
  EXPECT_EQ(m.num_checkpoints(), 0);
  EXPECT_EQ(m.checkpoint_bytes(), 0);
}

TEST(KvBlockManager, SaltedChainsDoNotMeet) {
  const int32_t bs = 4;
  KvBlockManager m(4, bs, true);
  const auto a = iota_tokens(8, 3);
  const int32_t b = m.allocate();
  m.register_block(b, KvBlockManager::root_hash(11), std::span(a).subspan(0, bs));
  m.release(b);
  uint64_t chain = 0;
  EXPECT_TRUE(m.match_prefix(a, 1, &chain).empty());  // unsalted
  EXPECT_TRUE(m.match_prefix(a, 1, &chain, nullptr, KvBlockManager::root_hash(12)).empty());
  EXPECT_EQ(m.match_prefix(a, 1, &chain, nullptr, KvBlockManager::root_hash(11)), std::vector<int32_t>{b});
  EXPECT_EQ(KvBlockManager::root_hash(0), KvBlockManager::kRootHash);
}
