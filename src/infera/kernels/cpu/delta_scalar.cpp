// The scalar path of the Gated DeltaNet kernels (see delta_impl.h).
#define INFERA_SIMD_LEVEL 0
#define INFERA_KERNEL_NS cpu_scalar
#include "infera/kernels/cpu/delta_impl.h"
