// The AVX-512 VNNI path of the quantized kernels (vpdpbusd), see quant_impl.h.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define INFERA_QUANT_AVX512 1
#define INFERA_QUANT_NS quant_avx512
#include "infera/kernels/cpu/quant_impl.h"
