// The AVX2 path of the quantized kernels on a CPU with AVX-VNNI (the 256-bit VEX vpdpbusd),
// see quant_impl.h and quant_panels_avx2.h.
#define INFERA_QUANT_AVX512 0
#define INFERA_QUANT_AVXVNNI 1
#define INFERA_QUANT_NS quant_avxvnni
#include "infera/kernels/cpu/quant_impl.h"
