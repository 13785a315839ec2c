// Helpers binding checkpoint tensors to kernel views.
#pragma once

#include <string>
#include <vector>

#include "infera/io/safetensors.h"
#include "infera/kernels/kernels.h"

namespace infera {

// A 2-D tensor used in place (no copy) as a kernel weight matrix.
kernels::MatRef as_matrix(const TensorInfo& t);
int64_t matrix_bytes(const kernels::MatRef& m);
// Small 1-D tensors (norm weights, biases) converted to f32.
std::vector<float> load_vector(const WeightStore& store, const std::string& name, int64_t n);
// Row `row` of an embedding table [V, H] converted to f32.
void embedding_row(const TensorInfo& table, int64_t row, float* out);
void to_f32(const void* src, DType dtype, int64_t n, float* out);

}  // namespace infera
