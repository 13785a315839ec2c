// Storage of the paged KV cache: per layer, K and V for `num_blocks` blocks of
// `block_size` tokens. The whole budget is reserved as virtual memory and committed by
// the OS page by page as blocks are first written, so resident memory follows the tokens
// actually cached, never the maximum context. Which block belongs to which sequence is
// the runtime's business (runtime/block_allocator.h); this is only the memory.
#pragma once

#include <cstddef>
#include <cstdint>

namespace infera {

struct KvPoolShape {
  int64_t num_layers = 0;  // layers that keep KV (full-attention layers)
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

class KvPool {
 public:
  KvPool() = default;
  explicit KvPool(const KvPoolShape& shape);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvPoolShape& shape() const { return shape_; }
  // [num_blocks, block_size, n_kv_heads, head_dim]
  float* k(int64_t layer) { return base_ + layer * 2 * layer_elems_; }
  float* v(int64_t layer) { return base_ + (layer * 2 + 1) * layer_elems_; }
  const float* k(int64_t layer) const { return base_ + layer * 2 * layer_elems_; }
  const float* v(int64_t layer) const { return base_ + (layer * 2 + 1) * layer_elems_; }

  int64_t bytes_per_block() const;  // all layers, K and V
  int64_t bytes_per_token() const;  // all layers, K and V
  int64_t reserved_bytes() const { return static_cast<int64_t>(bytes_); }

 private:
  KvPoolShape shape_;
  int64_t layer_elems_ = 0;  // elements of K (or V) of one layer
  float* base_ = nullptr;
  size_t bytes_ = 0;
};

// Number of blocks that fit in `budget_bytes` for this geometry.
int64_t kv_blocks_for_budget(int64_t budget_bytes, const KvPoolShape& shape);

}  // namespace infera
