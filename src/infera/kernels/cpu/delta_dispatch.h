// Per-ISA function tables of the Gated DeltaNet kernels (delta.h). delta_scalar.cpp,
// delta_avx2.cpp and delta_avx512.cpp compile the same source, delta_impl.h, with their
// own flags; delta.cpp checks arguments and picks a table (best_isa(), INFERA_ISA cap).
#pragma once

#include <cstdint>

#include "infera/kernels/delta.h"

namespace infera::kernels {

struct DeltaTable {
  void (*recurrent)(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t n_tokens,
                    const DeltaShape& shape, float* state, float* out);
  void (*chunked)(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t n_tokens,
                  const DeltaShape& shape, float* state, float* out, int64_t chunk);
  void (*conv1d_silu)(float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t kernel, float* state);
  void (*rmsnorm_gated)(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps);
};

namespace cpu_scalar {
const DeltaTable& delta_table();
}
namespace cpu_avx2 {
const DeltaTable& delta_table();
}
namespace cpu_avx512 {
const DeltaTable& delta_table();
}

}  // namespace infera::kernels
