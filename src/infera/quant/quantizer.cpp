#include "infera/quant/quantizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "infera/base/error.h"
#include "infera/base/threads.h"

namespace infera::quant {

using kernels::QuantScheme;

kernels::QuantMatRef QuantizedMatrix::view() const {
  return kernels::QuantMatRef{scheme, rows, cols, group_size, qweight.data(), scales.data()};
}

namespace {

// Clipping candidates: the fraction of the plain min/max scale tried. 1.0 first, so ties
// keep min/max. Below ~0.8 clipping costs more on outliers than it gains on the rest.
constexpr float kClipInt8[] = {1.0f, 0.99f, 0.98f, 0.96f, 0.94f, 0.92f, 0.9f, 0.85f};
constexpr float kClipInt4[] = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f};

inline float imp(const float* importance, int64_t k) { return importance ? importance[k] : 1.0f; }

// Best int8 scale of one row (symmetric, q in [-127, 127]).
float search_int8(const float* w, int64_t k, const float* importance, int64_t col0) {
  float amax = 0.0f;
  for (int64_t t = 0; t < k; ++t) amax = std::max(amax, std::fabs(w[t]));
  if (amax == 0.0f) return 0.0f;
  float best_s = amax / 127.0f;
  double best_err = INFINITY;
  for (float a : kClipInt8) {
    const float s = amax * a / 127.0f;
    const float inv = 1.0f / s;
    double err = 0.0;
    for (int64_t t = 0; t < k; ++t) {
      const float q = std::clamp(std::nearbyint(w[t] * inv), -127.0f, 127.0f);
      const float e = w[t] - q * s;
      err += static_cast<double>(imp(importance, col0 + t)) * e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_s = s;
    }
  }
  return best_s;
}

inline int nibble_of(float w, float inv) {
  return static_cast<int>(std::clamp(std::nearbyint(w * inv), -8.0f, 7.0f)) + 8;
}

// Best f16 scale of one int4 group: candidates around amax / 7 and around m / -8 (m the
// element of largest magnitude, so it lands on -8 and the asymmetric range is used in
// full, as llama.cpp's Q4_0 does), each scaled by the clip fractions.
uint16_t search_int4(const float* w, int64_t g, const float* importance, int64_t col0) {
  float amax = 0.0f, m = 0.0f;
  for (int64_t t = 0; t < g; ++t) {
    if (std::fabs(w[t]) > amax) {
      amax = std::fabs(w[t]);
      m = w[t];
    }
  }
  if (amax == 0.0f) return 0;
  uint16_t best = f32_to_f16(m / -8.0f);
  double best_err = INFINITY;
  for (float base : {m / -8.0f, amax / 7.0f}) {
    for (float a : kClipInt4) {
      const uint16_t h = f32_to_f16(base * a);
      const float s = f16_to_f32(h);  // score the scale the kernel will really use
      if (s == 0.0f || !std::isfinite(s)) continue;
      const float inv = 1.0f / s;
      double err = 0.0;
      for (int64_t t = 0; t < g; ++t) {
        const float e = w[t] - static_cast<float>(nibble_of(w[t], inv) - 8) * s;
        err += static_cast<double>(imp(importance, col0 + t)) * e * e;
      }
      if (err < best_err) {
        best_err = err;
        best = h;
      }
    }
  }
  return best;
}

}  // namespace

QuantizedMatrix quantize_matrix(const float* w, int64_t rows, int64_t cols, QuantScheme scheme, int64_t group_size,
                                const float* importance) {
  QuantizedMatrix q;
  q.scheme = scheme;
  q.rows = rows;
  q.cols = cols;
  const bool int4 = kernels::scheme_is_int4(scheme);
  q.group_size = int4 ? group_size : cols;
  if (int4) {
    INFERA_ASSERT(group_size > 0 && cols % group_size == 0 && group_size % 32 == 0, "int4 group must divide the row");
    q.qweight.assign(static_cast<size_t>(rows * cols / 2), 0);
    q.scales.assign(static_cast<size_t>(rows * (cols / group_size) * 2), 0);
  } else {
    q.qweight.assign(static_cast<size_t>(rows * cols), 0);
    q.scales.assign(static_cast<size_t>(rows * 4), 0);
  }
  const int64_t groups = cols / q.group_size;
#pragma omp parallel for schedule(dynamic, 16) num_threads(num_threads())
  for (int64_t r = 0; r < rows; ++r) {
    const float* wr = w + r * cols;
    if (!int4) {
      const float s = search_int8(wr, cols, importance, 0);
      std::memcpy(q.scales.data() + r * 4, &s, 4);
      auto* qr = reinterpret_cast<int8_t*>(q.qweight.data()) + r * cols;
      const float inv = s == 0.0f ? 0.0f : 1.0f / s;
      for (int64_t t = 0; t < cols; ++t)
        qr[t] = static_cast<int8_t>(std::clamp(std::nearbyint(wr[t] * inv), -127.0f, 127.0f));
      continue;
    }
    auto* sr = reinterpret_cast<uint16_t*>(q.scales.data()) + r * groups;
    uint8_t* qr = q.qweight.data() + r * (cols / 2);
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int64_t c0 = gi * q.group_size;
      const uint16_t h = search_int4(wr + c0, q.group_size, importance, c0);
      sr[gi] = h;
      const float s = f16_to_f32(h);
      const float inv = s == 0.0f ? 0.0f : 1.0f / s;
      // Q4_0 order inside each 32-column run: byte j = col j (low) | col j + 16 (high).
      for (int64_t run = c0; run < c0 + q.group_size; run += 32) {
        for (int j = 0; j < 16; ++j) {
          const int lo = nibble_of(wr[run + j], inv), hi = nibble_of(wr[run + j + 16], inv);
          qr[run / 2 + j] = static_cast<uint8_t>(lo | (hi << 4));
        }
      }
    }
  }
  return q;
}

double weighted_error(const float* w, const QuantizedMatrix& q, const float* importance) {
  const kernels::QuantMatRef v = q.view();
  std::vector<float> row(static_cast<size_t>(q.cols));
  double err = 0.0;
  for (int64_t r = 0; r < q.rows; ++r) {
    kernels::dequantize_row(v, r, row.data());
    for (int64_t t = 0; t < q.cols; ++t) {
      const double e = w[r * q.cols + t] - row[t];
      err += imp(importance, t) * e * e;
    }
  }
  return err;
}

// Rounding inside the representable range errs by at most |s| / 2; an element beyond it
// (only where the search chose to clip) is clamped to the largest level in its direction,
// at least 7 |s| (int4: [-8, 7]) or 127 |s| (int8).
float max_abs_error_bound(const float* w, const QuantizedMatrix& q, int64_t row, int64_t col) {
  const float s = std::fabs(kernels::ref::qscale_at(q.view(), row, col));
  const float top = (kernels::scheme_is_int4(q.scheme) ? 7.0f : 127.0f) * s;
  const float x = std::fabs(w[row * q.cols + col]);
  return std::max(0.5f * s, x - top) * (1.0f + 1e-6f) + 1e-30f;
}

}  // namespace infera::quant
