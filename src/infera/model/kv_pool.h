// Storage of the paged KV cache: per layer, K and V for `num_blocks` blocks of
// `block_size` tokens. The whole budget is reserved as virtual memory and committed by
// the OS page by page as blocks are first written, so resident memory follows the tokens
// actually cached, never the maximum context. Which block belongs to which sequence is
// the runtime's business (runtime/block_allocator.h); this is only the memory.
//
// Element types (--kv-dtype): f32 (default), bf16 (half the bytes), int8 (a quarter, plus
// one f32 scale per token and KV head for K and for V). int8 scales are per token rather
// than per block so that a row, once written, never changes: a block fills token by token
// (decode), a speculative rollback un-writes its tail, and a prefix-cache hit reuses it as
// is; a per-block scale would have to grow (re-quantizing the rows already there) and
// would make a row's value depend on the tokens written after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "infera/kernels/kernels.h"
#include "infera/tensor/dtype.h"

namespace infera {

struct KvPoolShape {
  int64_t num_layers = 0;  // layers that keep KV (full-attention layers)
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  DType dtype = DType::kF32;  // kF32, kBF16 or kI8

  // Bytes of one token of one layer, K and V (int8: with its scales).
  int64_t bytes_per_token_per_layer() const;
  int64_t bytes_per_token() const { return bytes_per_token_per_layer() * num_layers; }  // all layers
  int64_t bytes_per_block() const { return bytes_per_token() * block_size; }  // all layers
};

// "f32" | "bf16" | "int8" -> kF32 | kBF16 | kI8; throws infera::Error naming `what`
// (e.g. "--kv-dtype") and the choices otherwise.
DType parse_kv_cache_dtype(const std::string_view text, const char* what = "--kv-dtype");
const char* kv_cache_dtype_name(DType dtype);  // "f32" | "bf16" | "int8"

class KvPool {
 public:
  KvPool() = default;
  explicit KvPool(const KvPoolShape& shape);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvPoolShape& shape() const { return shape_; }
  DType dtype() const { return shape_.dtype; }
  // [num_blocks, n_kv_heads, block_size, head_dim] of dtype() (kernels::PagedKv, kernels::kv_row)
  void* k_data(int64_t layer) { return base_ + layer * layer_bytes_; }
  void* v_data(int64_t layer) { return base_ + layer * layer_bytes_ + data_bytes_; }
  const void* k_data(int64_t layer) const { return base_ + layer * layer_bytes_; }
  const void* v_data(int64_t layer) const { return base_ + layer * layer_bytes_ + data_bytes_; }
  // int8 only (nullptr otherwise): [num_blocks, n_kv_heads, block_size] f32
  float* k_scales(int64_t layer) { return scales(layer, 0); }
  float* v_scales(int64_t layer) { return scales(layer, 1); }
  const float* k_scales(int64_t layer) const { return const_cast<KvPool*>(this)->scales(layer, 0); }
  const float* v_scales(int64_t layer) const { return const_cast<KvPool*>(this)->scales(layer, 1); }
  // f32 pools only (asserted): the data as floats.
  float* k(int64_t layer);
  float* v(int64_t layer);

  // Stores n_rows new K and V rows of `layer` ([n_kv_heads, head_dim] f32 each, `stride`
  // floats apart) into the given slots (block * block_size + offset), converting to dtype().
  void write(int64_t layer, const float* k_rows, const float* v_rows, int64_t stride, int64_t n_rows,
             const int64_t* slots);
  // The attention kernels' view of `layer` for one sequence's block table.
  kernels::PagedKv view(int64_t layer, const int32_t* block_table) const;

  int64_t bytes_per_block() const { return shape_.bytes_per_block(); }  // all layers, K and V
  int64_t bytes_per_token() const { return shape_.bytes_per_token(); }  // all layers, K and V
  int64_t reserved_bytes() const { return static_cast<int64_t>(bytes_); }

 private:
  float* scales(int64_t layer, int which);

  KvPoolShape shape_;
  int64_t data_bytes_ = 0;  // K (or V) elements of one layer, rounded up to 64 bytes
  int64_t scale_bytes_ = 0;  // K (or V) scales of one layer (int8), rounded up to 64 bytes
  int64_t layer_bytes_ = 0;  // K, V, K scales, V scales
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
};

// Number of blocks that fit in `budget_bytes` for this geometry and dtype.
int64_t kv_blocks_for_budget(int64_t budget_bytes, const KvPoolShape& shape);

}  // namespace infera
