#include "infera/model/kv_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "infera/base/error.h"

namespace infera {
namespace {

int64_t round_up_64(int64_t n) { return (n + 63) / 64 * 64; }

void check_dtype(DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kI8) {
    fail("KV cache dtype {} is not supported (f32, bf16 or int8)", dtype_name(dtype));
  }
}

}  // namespace

int64_t KvPoolShape::bytes_per_token_per_layer() const {
  const int64_t per_head = head_dim * static_cast<int64_t>(dtype_size(dtype)) + (dtype == DType::kI8 ? 4 : 0);
  return 2 * n_kv_heads * per_head;
}

DType parse_kv_cache_dtype(const std::string_view text, const char* what) {
  if (text == "f32") return DType::kF32;
  if (text == "bf16") return DType::kBF16;
  if (text == "int8") return DType::kI8;
  fail("{}: unknown KV cache dtype '{}' (expected f32, bf16 or int8)", what, std::string(text));
}

const char* kv_cache_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kI8: return "int8";
    default: return "?";
  }
}

KvPool::KvPool(const KvPoolShape& shape) : shape_(shape) {
  INFERA_ASSERT(shape.num_blocks > 0 && shape.block_size > 0 && shape.n_kv_heads > 0 && shape.head_dim > 0);
  check_dtype(shape.dtype);
  const int64_t slots = shape.num_blocks * shape.block_size * shape.n_kv_heads;  // (token, head) rows
  data_bytes_ = round_up_64(slots * shape.head_dim * static_cast<int64_t>(dtype_size(shape.dtype)));
  scale_bytes_ = shape.dtype == DType::kI8 ? round_up_64(slots * static_cast<int64_t>(sizeof(float))) : 0;
  layer_bytes_ = 2 * (data_bytes_ + scale_bytes_);
  bytes_ = static_cast<size_t>(std::max<int64_t>(shape.num_layers, 1) * layer_bytes_);
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    fail("cannot reserve {} bytes for the KV cache: {} (lower --kv-cache-memory)", bytes_, std::strerror(errno));
  }
  base_ = static_cast<uint8_t*>(p);
  // 4 KiB pages on purpose. Huge pages (MADV_HUGEPAGE) made decode attention over 32K keys
  // ~35% faster (fewer TLB misses from page to page), but their first-touch faults during
  // prefill made W8A8 AMX prompt processing 2.4x slower (64-token prompt, TinyLlama shape,
  // one thread, measured A/B), so the pool is not advised.
}

KvPool::~KvPool() {
  if (base_) ::munmap(base_, bytes_);
}

float* KvPool::scales(int64_t layer, int which) {
  if (scale_bytes_ == 0) return nullptr;
  return reinterpret_cast<float*>(base_ + layer * layer_bytes_ + 2 * data_bytes_ + which * scale_bytes_);
}

float* KvPool::k(int64_t layer) {
  INFERA_ASSERT(shape_.dtype == DType::kF32, "KvPool::k: f32 pools only");
  return static_cast<float*>(k_data(layer));
}

float* KvPool::v(int64_t layer) {
  INFERA_ASSERT(shape_.dtype == DType::kF32, "KvPool::v: f32 pools only");
  return static_cast<float*>(v_data(layer));
}

void KvPool::write(int64_t layer, const float* k_rows, const float* v_rows, int64_t stride, int64_t n_rows,
                   const int64_t* slots) {
  kernels::store_kv_rows(shape_.dtype, k_rows, stride, n_rows, slots, shape_.block_size, shape_.n_kv_heads,
                         shape_.head_dim, k_data(layer), k_scales(layer));
  kernels::store_kv_rows(shape_.dtype, v_rows, stride, n_rows, slots, shape_.block_size, shape_.n_kv_heads,
                         shape_.head_dim, v_data(layer), v_scales(layer));
}

kernels::PagedKv KvPool::view(int64_t layer, const int32_t* block_table) const {
  return kernels::PagedKv{k_data(layer), v_data(layer), shape_.block_size, shape_.n_kv_heads, shape_.head_dim,
                          block_table,   shape_.dtype,  k_scales(layer),   v_scales(layer)};
}

int64_t kv_blocks_for_budget(int64_t budget_bytes, const KvPoolShape& shape) {
  check_dtype(shape.dtype);
  KvPoolShape s = shape;
  s.num_layers = std::max<int64_t>(shape.num_layers, 1);
  const int64_t per_block = s.bytes_per_block();
  return per_block > 0 ? budget_bytes / per_block : 0;
}

}  // namespace infera
