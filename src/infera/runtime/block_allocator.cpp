#include "infera/runtime/block_allocator.h"

#include "infera/base/error.h"

namespace infera {

BlockAllocator::BlockAllocator(int32_t num_blocks) : num_blocks_(num_blocks) {
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockAllocator::allocate() {
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  return b;
}

void BlockAllocator::free(int32_t block) {
  INFERA_ASSERT(block >= 0 && block < num_blocks_, "freeing a block that does not exist");
  free_.push_back(block);
}

}  // namespace infera
