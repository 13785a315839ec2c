// Quantizing one weight matrix into the formats of kernels/quant.h, with a clipping
// search per row (W8A8) or per group (int4): among candidate scales, the one with the
// least squared error weighted by per-input-channel importance (E[x_k^2] from calibration
// data; all ones when data-free) wins. Plain min/max scaling is one of the candidates, so
// the search is never worse than it on its own metric.
#pragma once

#include <cstdint>
#include <vector>

#include "infera/kernels/quant.h"

namespace infera::quant {

struct QuantizedMatrix {
  kernels::QuantScheme scheme = kernels::QuantScheme::kW8A8;
  int64_t rows = 0, cols = 0, group_size = 0;  // group_size == cols for W8A8
  std::vector<uint8_t> qweight;  // int8 [rows, cols] or packed int4 [rows, cols / 2]
  std::vector<uint8_t> scales;  // f32 [rows] (W8A8) or f16 [rows, cols / group_size]

  kernels::QuantMatRef view() const;
};

// w: f32 [rows, cols]. importance: [cols] non-negative weights of each input channel in
// the error (nullptr: uniform). group_size ignored for W8A8; for int4 it must divide cols
// (callers fall back before calling). Rows run in parallel.
QuantizedMatrix quantize_matrix(const float* w, int64_t rows, int64_t cols, kernels::QuantScheme scheme,
                                int64_t group_size, const float* importance = nullptr);

// Σ_rows Σ_k importance_k (w - dequant(q))^2 of the matrix above (for scale searches).
double weighted_error(const float* w, const QuantizedMatrix& q, const float* importance);

// The bound the scheme guarantees for every element: |w - dequant(q)| <= bound(row, col).
// For a scale s chosen by the search: s / 2 inside the clipping range; elements clipped
// by a candidate below max|w| err by at most (max|w| - clip) + s / 2 (see the .cpp).
float max_abs_error_bound(const float* w, const QuantizedMatrix& q, int64_t row, int64_t col);

}  // namespace infera::quant
