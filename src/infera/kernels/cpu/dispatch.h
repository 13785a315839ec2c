// Per-ISA function tables behind the public kernels API (kernels.h). Each path
// (kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512.cpp) compiles the same source,
// kernels_impl.h, with its own flags and exposes one table. Arguments are validated by the
// public wrappers (kernels.cpp) before they reach a table.
#pragma once

#include <cstdint>
#include <string>

#include "infera/kernels/kernels.h"

namespace infera::kernels {

// The f32 / bf16 / f16 matmul's shapes (kernels_impl.h), which kernels.cpp's timing of the
// decode prefetch follows too: GEMV passes take up to kGemvMaxRows rows of x per pass over W;
// from kGemmMinRows rows the cache-blocked GEMM takes over (below it, GEMV passes beat packing
// W into panels: measured on a 2048 x 5632 bf16 matrix, packing costs about two W streams,
// and with weights coming from DRAM each extra pass costs one stream).
constexpr int kGemvMaxRows = 4;
constexpr int64_t kGemmMinRows = 16;

struct KernelTable {
  // gemv_prefetch: how far ahead the decode (m < 16) kernels prefetch each weight row in
  // bytes, 0 for not at all (kernels::gemv_prefetch_for chooses it).
  void (*matmul_rows)(const float* x, int64_t m, const MatRef& w, int64_t n0, int64_t n1, float* y, int64_t ldy,
                      int gemv_prefetch);
  std::string (*matmul_path)(DType dtype);
  void (*rmsnorm)(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps, float w_offset);
  void (*silu_mul)(float* gate, const float* up, int64_t n);
  void (*softmax)(float* x, int64_t n);
  void (*add)(float* y, const float* x, int64_t n);
  void (*rope_neox)(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
                    const int32_t* positions, const float* inv_freq, float attn_factor);
  void (*attention_paged)(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const PagedKv& kv,
                          float scale, float* out);
};

namespace cpu_scalar {
const KernelTable& table();
}
namespace cpu_avx2 {
const KernelTable& table();
}
namespace cpu_avx512 {
const KernelTable& table();
}

}  // namespace infera::kernels
