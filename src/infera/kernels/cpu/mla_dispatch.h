// Per-ISA function tables of the hot MLA / DSA kernels (mla.h). mla_scalar.cpp,
// mla_avx2.cpp and mla_avx512.cpp compile the same source, mla_impl.h, with their own
// flags; mla.cpp picks a table (best_isa(), INFERA_ISA cap).
#pragma once

#include <cstdint>

#include "infera/kernels/kernels.h"

namespace infera::kernels {

struct MlaTable {
  void (*indexer_scores_chunk)(const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                               const float* keys, int64_t ld, float* out, int64_t out_ld);
  void (*indexer_scores_paged)(const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                               const PagedKv& kv, int64_t c0, float* out, int64_t out_ld);
  void (*attention_absorbed)(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* lat,
                             int64_t ld, int64_t R, int64_t P, float scale, float* out);
  void (*attention_sparse)(const float* q, int64_t n_tokens, int64_t n_heads, const float* lat, int64_t ld, int64_t R,
                           int64_t P, const int32_t* idx, const int32_t* n_idx, int64_t idx_stride, float scale,
                           float* out);
  void (*attention_naive)(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* kv,
                          int64_t nope, int64_t V, const float* k_pe, int64_t k_pe_ld, int64_t P, float scale,
                          float* out);
};

namespace cpu_scalar {
const MlaTable& mla_table();
}
namespace cpu_avx2 {
const MlaTable& mla_table();
}
namespace cpu_avx512 {
const MlaTable& mla_table();
}

}  // namespace infera::kernels
