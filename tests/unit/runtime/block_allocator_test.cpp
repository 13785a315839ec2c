#include <gtest/gtest.h>

#include <set>

#include "infera/runtime/block_allocator.h"

using namespace infera;

TEST(BlockAllocator, AllocatesEachBlockOnceAndReusesMostRecentlyFreed) {
  BlockAllocator a(4);
  std::set<int32_t> got;
  for (int i = 0; i < 4; ++i) got.insert(a.allocate());
  EXPECT_EQ(got.size(), 4u);
  EXPECT_EQ(a.allocate(), -1);
  EXPECT_EQ(a.num_used(), 4);
  a.free(2);
  a.free(0);
  EXPECT_EQ(a.allocate(), 0);
  EXPECT_EQ(a.allocate(), 2);
  EXPECT_EQ(a.num_free(), 0);
}
