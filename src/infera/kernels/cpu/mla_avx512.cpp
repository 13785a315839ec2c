// The avx512 path of the hot MLA / DSA kernels (see mla_impl.h).
#define INFERA_SIMD_LEVEL 2
#define INFERA_KERNEL_NS cpu_avx512
#include "infera/kernels/cpu/mla_impl.h"
