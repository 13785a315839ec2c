// The FP8 (W8A16) kernel's per-ISA entry points (kernels/quant.h, QuantExtras::fp8_group):
// fp8_avx2.cpp and fp8_avx512.cpp compile fp8_impl.h with their own flags; the scalar path
// is ref::fp8_matmul (quant.cpp). Arguments are validated by the public wrappers.
#pragma once

#include <cstdint>

namespace infera::kernels {

// y[t * ldy + r] = Σ_c e4m3(weights[r * cols + c]) · scales[r * ⌈cols / group⌉ + c / group] · x[t * ldx + c]
// for rows r < rows and tokens t < m.
struct Fp8Args {
  const uint8_t* weights = nullptr;  // e4m3 [rows, cols]
  const float* scales = nullptr;  // [rows, ceil(cols / group)]
  int64_t rows = 0, cols = 0, group = 0;
  int64_t ldx = 0, ldy = 0;
};

namespace fp8_avx2 {
void fp8_matmul(const Fp8Args& a, const float* x, int64_t m, float* y);
}
namespace fp8_avx512 {
void fp8_matmul(const Fp8Args& a, const float* x, int64_t m, float* y);
}

}  // namespace infera::kernels
