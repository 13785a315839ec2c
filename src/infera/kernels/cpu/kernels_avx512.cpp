// The avx512 path of the optimized kernels (see kernels_impl.h).
// Compiled with AVX-512 F/BW/VL/DQ (file suffix _avx512).
// GCC 12 flags the deliberately undefined pass-through operand of its own AVX-512
// intrinsics (_mm512_undefined_*) as uninitialized: a false positive, silenced here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define INFERA_SIMD_LEVEL 2
#define INFERA_KERNEL_NS cpu_avx512
#include "infera/kernels/cpu/kernels_impl.h"
