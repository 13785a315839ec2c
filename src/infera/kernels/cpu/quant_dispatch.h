// Per-ISA tables of the quantized kernels (kernels/quant.h). quant_avx2.cpp and
// quant_avx512.cpp compile quant_impl.h with their own flags; the scalar path is the
// reference itself (quant.cpp). Arguments are validated by the public wrappers.
#pragma once

#include <cstdint>

#include "infera/kernels/quant.h"

namespace infera::kernels {

struct QuantKernelTable {
  void (*quantize_activations)(const float* x, int64_t m, int64_t k, int8_t* q, int64_t ld, float* scale,
                               int32_t* block_sums);
  void (*qmatmul)(const float* x, int64_t m, const QuantMatRef& w, float* y);
  // Over w.packed (non-null); nullptr on paths without panel kernels (they use qmatmul).
  void (*qmatmul_packed)(const float* x, int64_t m, const QuantMatRef& w, float* y);
  // One token against `count` packed matrices of one scheme, cols and group size (linear_multi);
  // nullptr where qmatmul_packed is.
  void (*qgemv_packed_multi)(const float* x, const QuantMatRef* const* ws, float* const* ys, int count);
  // Whether W8A8 prefill runs on AMX tiles here, for `infera sysinfo`: "in use", or why not
  // ("off (INFERA_AMX=0)", "not on this CPU", "not granted by the kernel"); nullptr on paths
  // without the AMX kernel.
  const char* (*amx_status)();
};

namespace quant_avx2 {
const QuantKernelTable& table();
}
namespace quant_avxvnni {  // the AVX2 path's kernels with AVX-VNNI's vpdpbusd
const QuantKernelTable& table();
}
namespace quant_avx512 {
const QuantKernelTable& table();
}

// Activation rows are padded to this many columns (one zmm of int8), so SIMD loops read
// whole vectors of x; the padding is zero.
constexpr int64_t kActivationPad = 64;
// One more vector when the padded width is a multiple of 512 bytes: with such a power-of-two
// stride the rows of a tile of tokens (an AMX A tile is 16 rows) all fall in a few L1 sets
// and evict each other.
inline int64_t activation_ld(int64_t k) {
  const int64_t ld = (k + kActivationPad - 1) / kActivationPad * kActivationPad;
  return ld % 512 == 0 ? ld + kActivationPad : ld;
}

}  // namespace infera::kernels
