// Helpers binding checkpoint tensors to kernel views.
#pragma once

#include <functional>
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

// MTP layers the checkpoint stores: mtp.fc (plain or quantized) and mtp.layers.{n}.*; 0 when
// there is no MTP head. Qwen3-Next's config.json does not declare its head; the tensors do.
int stored_mtp_layers(const std::function<bool(const std::string& name)>& has_tensor);
int stored_mtp_layers(const WeightStore& store);

}  // namespace infera
