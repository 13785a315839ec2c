// The avx2 path of the optimized kernels (see kernels_impl.h).
// Compiled with AVX2 + FMA + F16C (file suffix _avx2).
#define INFERA_SIMD_LEVEL 1
#define INFERA_KERNEL_NS cpu_avx2
#include "infera/kernels/cpu/kernels_impl.h"
