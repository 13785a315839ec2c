// Random blocks of a ggml block type for the kernel and MoE tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "infera/kernels/ggml_quants.h"
#include "infera/tensor/dtype.h"

namespace infera::kernels::ggml {

// Random bytes with every f16 field a finite value of moderate size.
inline std::vector<uint8_t> random_blocks(uint32_t type, int64_t nb, std::mt19937& rng) {
  std::vector<uint8_t> bytes(static_cast<size_t>(nb * type_size(type)));
  for (auto& x : bytes) x = static_cast<uint8_t>(rng());
  std::vector<int> half_offsets;
  switch (type) {
    case kQ4_0:
    case kQ5_0:
    case kQ8_0:
    case kIQ4_NL:
    case kIQ4_XS: half_offsets = {0}; break;
    case kQ4_1:
    case kQ5_1:
    case kQ4_K:
    case kQ5_K: half_offsets = {0, 2}; break;
    case kQ6_K: half_offsets = {208}; break;
    case kQ3_K: half_offsets = {108}; break;
    case kQ2_K: half_offsets = {80, 82}; break;
  }
  std::uniform_real_distribution<float> d(-0.05f, 0.05f);
  for (int64_t i = 0; i < nb; ++i) {
    for (int off : half_offsets) {
      const uint16_t v = f32_to_f16(d(rng));
      std::memcpy(bytes.data() + i * type_size(type) + off, &v, 2);
    }
  }
  return bytes;
}

}  // namespace infera::kernels::ggml
