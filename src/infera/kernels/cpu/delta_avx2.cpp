// The avx2 path of the Gated DeltaNet kernels (see delta_impl.h).
#define INFERA_SIMD_LEVEL 1
#define INFERA_KERNEL_NS cpu_avx2
#include "infera/kernels/cpu/delta_impl.h"
