// The scalar path of the optimized kernels (see kernels_impl.h).
#define INFERA_SIMD_LEVEL 0
#define INFERA_KERNEL_NS cpu_scalar
#include "infera/kernels/cpu/kernels_impl.h"
