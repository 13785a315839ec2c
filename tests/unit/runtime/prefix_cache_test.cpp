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
