// RoPE frequency tables with the scaling variants of config.json (linear, llama3, yarn).
#pragma once

#include <vector>

#include "infera/model/config.h"

namespace infera {

struct RopeTables {
  std::vector<float> inv_freq;  // [rot_dim / 2]
  float attn_factor = 1.0f;  // multiplies cos and sin (YaRN)
};

RopeTables compute_rope_tables(const RopeConfig& rope, int rot_dim);

}  // namespace infera
