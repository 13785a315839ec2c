// The scalar path of the hot MLA / DSA kernels (see mla_impl.h).
#define INFERA_SIMD_LEVEL 0
#define INFERA_KERNEL_NS cpu_scalar
#include "infera/kernels/cpu/mla_impl.h"
