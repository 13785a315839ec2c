// The AVX2 path of the quantized kernels (maddubs/madd), see quant_impl.h.
#define INFERA_QUANT_AVX512 0
#define INFERA_QUANT_NS quant_avx2
#include "infera/kernels/cpu/quant_impl.h"
