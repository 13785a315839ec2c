// RoPE frequency tables with the scaling variants of config.json (linear, llama3, yarn).
#pragma once

#include <cstdint>
#include <vector>

#include "infera/model/config.h"

namespace infera {

struct RopeTables {
  std::vector<float> inv_freq;  // [rot_dim / 2]
  float attn_factor = 1.0f;  // multiplies cos and sin (YaRN)
};

RopeTables compute_rope_tables(const RopeConfig& rope, int rot_dim);

// rows of x [rows, head_dim] (q or k heads) from llama.cpp's order of a llama GGUF's q / k rows
// (element 2i, 2i + 1 = Hugging Face's i, head_dim / 2 + i) to Hugging Face's, in place
// (ModelConfig::qk_rows_pairs_adjacent).
void pairs_to_halves(float* x, int64_t rows, int64_t head_dim);

}  // namespace infera
