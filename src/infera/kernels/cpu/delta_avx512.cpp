// The avx512 path of the Gated DeltaNet kernels (see delta_impl.h).
// GCC 12 flags the undefined pass-through operand of its own AVX-512 intrinsics as
// uninitialized: a false positive, silenced here (as in kernels_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define INFERA_SIMD_LEVEL 2
#define INFERA_KERNEL_NS cpu_avx512
#include "infera/kernels/cpu/delta_impl.h"
