// Activation statistics over calibration text, and the smoothing (per-input-channel
// scaling) they choose.
//
// Statistics: the float model runs over the calibration tokens with a linear() observer
// (kernels/quant.h) recording, per linear layer and input channel k, E[x_k^2], E|x_k| and
// max|x_k|.
//
// Smoothing folds a per-channel factor s_k between a linear layer and the op feeding it:
// W' = W diag(s), x' = x / s, exact in real arithmetic. The op before is an RMSNorm weight
// (q/k/v after input_layernorm, gate/up after post_attention_layernorm) or up_proj's rows
// (down_proj's input is silu(gate) * up). o_proj is left alone (under GQA its input
// channels are shared value heads, so no single v row carries one channel).
//   4-bit schemes (AWQ-style): s = E|x|^alpha, alpha searched on a grid to minimize the
//     importance-weighted weight error sum_k E[x_k^2] * sum_n (w - deq(q(w s)) / s)^2;
//     alpha = 0 (no smoothing) is a candidate, so smoothing never loses on this metric.
//   W8A8 (SmoothQuant-style): s = max|x|^alpha / max|w|^(1 - alpha), alpha on a grid, the
//     metric adding the activation rounding error (per-token step max_k |x_k / s_k| / 127).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "infera/kernels/quant.h"

namespace infera {
class Model;
}

namespace infera::quant {

struct ChannelStats {
  std::vector<double> sum_sq, sum_abs;  // [k]
  std::vector<float> max_abs;  // [k]
  int64_t count = 0;  // tokens seen

  std::vector<float> mean_sq() const;  // E[x^2] (the clipping search's importance)
  std::vector<float> mean_abs() const;
};

// Linear-layer name (checkpoint tensor name) -> statistics of its input.
using ActivationStats = std::map<std::string, ChannelStats>;

// The calibration text file `calib_file` tokenized with the model directory's tokenizer,
// cut to at most `max_tokens` tokens. Throws infera::Error (naming --calib / --calib-tokens)
// for an unreadable or empty file, a file that tokenizes to nothing, or max_tokens < 1.
std::vector<int32_t> calibration_tokens(const std::string& model_dir, const std::string& calib_file,
                                        int64_t max_tokens);

// Routed experts: expert matrix name (checkpoint name; a fused [E, rows, cols] tensor's own
// name, its gate and up halves sharing one entry) -> statistics per expert index, each over
// the tokens routed to that expert (count 0 and empty sums for an expert no token reached).
using ExpertActivationStats = std::map<std::string, std::vector<ChannelStats>>;

// Runs `model` over `tokens` in windows of `ctx` tokens (each window a fresh sequence) and
// records the inputs of every linear layer; with `experts`, also the inputs of every routed
// expert (model/blocks.h set_expert_observer; the MoE layers then run their per-expert
// schedule).
ActivationStats collect_activation_stats(Model& model, const std::vector<int32_t>& tokens, int32_t ctx,
                                         ExpertActivationStats* experts = nullptr);

}  // namespace infera::quant
