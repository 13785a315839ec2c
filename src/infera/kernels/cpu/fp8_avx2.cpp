// The AVX2 path of the FP8 (W8A16) kernel (8 lanes, F16C decoding), see fp8_impl.h.
// GCC 12 headers warn about their own undefined-vector idiom inside the F16C conversions.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define INFERA_FP8_AVX512 0
#define INFERA_FP8_NS fp8_avx2
#include "infera/kernels/cpu/fp8_impl.h"
