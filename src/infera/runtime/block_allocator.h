// Hands out KV blocks of a KvPool. Free blocks are reused most-recently-freed first, so
// memory the OS has already committed is reused before untouched pages are.
#pragma once

#include <cstdint>
#include <vector>

namespace infera {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);
  // -1 when none is free.
  int32_t allocate();
  void free(int32_t block);
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_total() const { return num_blocks_; }
  int32_t num_used() const { return num_blocks_ - num_free(); }

 private:
  int32_t num_blocks_;
  std::vector<int32_t> free_;  // stack
};

}  // namespace infera
