// The ggml block-format matmul (ggml_matmul_impl.h) compiled for the avx2 path.
#define INFERA_GGML_NS isa_avx2
#include "infera/kernels/cpu/ggml_matmul_impl.h"

namespace infera::kernels::ggml {

void matmul_rows_avx2(uint32_t type, const void* data, int64_t row_bytes, int64_t k, const float* x, int64_t m,
                      int64_t n0, int64_t n1, float* y, int64_t ldy, PanelRef panels, PanelPrefetch pf) {
  isa_avx2::matmul_rows(type, data, row_bytes, k, x, m, n0, n1, y, ldy, panels, pf);
}

void matvec_many_avx2(std::span<const PanelMatVec> steps, PanelPrefetch pf) { isa_avx2::matvec_many(steps, pf); }

}  // namespace infera::kernels::ggml
