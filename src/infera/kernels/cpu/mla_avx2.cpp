// The avx2 path of the hot MLA / DSA kernels (see mla_impl.h).
#define INFERA_SIMD_LEVEL 1
#define INFERA_KERNEL_NS cpu_avx2
#include "infera/kernels/cpu/mla_impl.h"
