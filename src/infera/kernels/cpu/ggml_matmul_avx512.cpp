// The ggml block-format matmul (ggml_matmul_impl.h) compiled for the avx512 path.
// GCC 12 warns about the undefined upper halves inside its own 512-bit cast / extract
// intrinsics (as in the other AVX-512 files).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define INFERA_GGML_NS isa_avx512
#include "infera/kernels/cpu/ggml_matmul_impl.h"

namespace infera::kernels::ggml {

void matmul_rows_avx512(uint32_t type, const void* data, int64_t row_bytes, int64_t k, const float* x, int64_t m,
                        int64_t n0, int64_t n1, float* y, int64_t ldy, PanelRef panels, PanelPrefetch pf) {
  isa_avx512::matmul_rows(type, data, row_bytes, k, x, m, n0, n1, y, ldy, panels, pf);
}

void matvec_many_avx512(std::span<const PanelMatVec> steps, PanelPrefetch pf) { isa_avx512::matvec_many(steps, pf); }

}  // namespace infera::kernels::ggml
