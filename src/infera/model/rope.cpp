#include "infera/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace infera {
namespace {

// Dimension index whose wavelength completes `num_rotations` turns over `max_pos`
// positions (YaRN paper, eq. 17; HF _compute_yarn_parameters).
double yarn_correction_dim(double num_rotations, int dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2.0 * std::numbers::pi))) / (2.0 * std::log(base));
}

}  // namespace

RopeTables compute_rope_tables(const RopeConfig& rope, int rot_dim) {
  RopeTables t;
  const int half = rot_dim / 2;
  t.inv_freq.resize(half);
  for (int i = 0; i < half; ++i) {
    t.inv_freq[i] = static_cast<float>(std::pow(static_cast<double>(rope.theta), -2.0 * i / rot_dim));
  }
  switch (rope.scaling) {
    case RopeScaling::kNone: break;
    case RopeScaling::kLinear:
      for (float& f : t.inv_freq) f /= rope.factor;
      break;
    case RopeScaling::kLlama3: {
      const double old_ctx = rope.original_max_position;
      const double low_wavelen = old_ctx / rope.low_freq_factor;
      const double high_wavelen = old_ctx / rope.high_freq_factor;
      for (float& f : t.inv_freq) {
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen < high_wavelen) continue;
        if (wavelen > low_wavelen) {
          f = static_cast<float>(f / rope.factor);
        } else {
          const double smooth =
              (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
          f = static_cast<float>((1.0 - smooth) * f / rope.factor + smooth * f);
        }
      }
      break;
    }
    case RopeScaling::kYarn: {
      const double base = rope.theta;
      const double max_pos = rope.original_max_position;
      double low = std::floor(yarn_correction_dim(rope.beta_fast, rot_dim, base, max_pos));
      double high = std::ceil(yarn_correction_dim(rope.beta_slow, rot_dim, base, max_pos));
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(rot_dim - 1));
      if (low == high) high += 0.001;
      for (int i = 0; i < half; ++i) {
        const double pos_freq = std::pow(base, 2.0 * i / rot_dim);
        const double extrapolation = 1.0 / pos_freq;
        const double interpolation = 1.0 / (rope.factor * pos_freq);
        const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        const double extrapolation_weight = 1.0 - ramp;
        t.inv_freq[i] =
            static_cast<float>(interpolation * (1.0 - extrapolation_weight) + extrapolation * extrapolation_weight);
      }
      t.attn_factor = rope.attention_factor;
      break;
    }
  }
  for (size_t i = 0; i < rope.freq_factors.size() && i < t.inv_freq.size(); ++i) t.inv_freq[i] /= rope.freq_factors[i];
  return t;
}

void pairs_to_halves(float* x, int64_t rows, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  static thread_local std::vector<float> row;  // (per layer of every forward: no allocation once sized)
  row.resize(static_cast<size_t>(head_dim));
  for (int64_t r = 0; r < rows; ++r) {
    float* h = x + r * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      row[i] = h[2 * i];
      row[half + i] = h[2 * i + 1];
    }
    std::copy(row.begin(), row.end(), h);
  }
}

}  // namespace infera
