#include "infera/model/kv_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "infera/base/error.h"

namespace infera {

KvPool::KvPool(const KvPoolShape& shape) : shape_(shape) {
  INFERA_ASSERT(shape.num_blocks > 0 && shape.block_size > 0 && shape.n_kv_heads > 0 && shape.head_dim > 0);
  layer_elems_ = shape.num_blocks * shape.block_size * shape.n_kv_heads * shape.head_dim;
  bytes_ = static_cast<size_t>(std::max<int64_t>(shape.num_layers, 1) * 2 * layer_elems_) * sizeof(float);
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    fail("cannot reserve {} bytes for the KV cache: {} (lower --kv-cache-memory)", bytes_, std::strerror(errno));
  }
  base_ = static_cast<float*>(p);
}

KvPool::~KvPool() {
  if (base_) ::munmap(base_, bytes_);
}

int64_t KvPool::bytes_per_block() const {
  return shape_.num_layers * 2 * shape_.block_size * shape_.n_kv_heads * shape_.head_dim * static_cast<int64_t>(sizeof(float));
}

int64_t KvPool::bytes_per_token() const { return bytes_per_block() / shape_.block_size; }

int64_t kv_blocks_for_budget(int64_t budget_bytes, const KvPoolShape& shape) {
  const int64_t per_block = std::max<int64_t>(shape.num_layers, 1) * 2 * shape.block_size * shape.n_kv_heads *
                            shape.head_dim * static_cast<int64_t>(sizeof(float));
  return per_block > 0 ? budget_bytes / per_block : 0;
}

}  // namespace infera
