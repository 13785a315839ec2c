// Ascend msModelSlim checkpoints (what MindIE and vllm-ascend serve): quant_model_description.json
// names each stored tensor's quantization type, the weights sit in quant_model_weights.safetensors
// (or model.safetensors, sharded or not). The format plugs into the pre-quantized seam
// (model/prequant.h) as make_modelslim_format (model/prequant_formats.h). Layer types read here (docs/prequant.md):
//
//   FLOAT         the tensor as stored (bf16/f16/f32).
//   W8A8          static: <p>.weight int8 [O, I], <p>.input_scale / <p>.input_offset [1] (calibrated),
//                 <p>.deq_scale [O] (f32, or int64 holding the f32 bits), <p>.quant_bias int32 [O];
//                 x_q = sat_int8(round(x / input_scale + input_offset)),
//                 y = deq_scale · (Σ x_q·w + quant_bias) in int32 (the bias and the activation
//                 offset's correction are folded into quant_bias). Runs exactly so
//                 (kernels::QuantExtras static activations).
//   W8A8_DYNAMIC  <p>.weight int8 [O, I], <p>.weight_scale [O, 1], <p>.weight_offset [O, 1] (zeros);
//                 int8 activations per token: Infera's w8a8 on the stored bytes.
//   W4A8_DYNAMIC  <p>.weight int8 [O/2, I], two's-complement int4 packed along the output (row 2j in
//                 the low nibble, 2j+1 in the high one), <p>.weight_scale [O, 1] per channel,
//                 <p>.scale_bias (a kernel term of Ascend's, derivable from the weights: not used);
//                 the legacy per-group form adds <p>.weight_scale_second [O, I/G] (and stores one int4
//                 per byte [O, I] unless version is "1.0.0"). Infera's w4a8 with the channel scale
//                 (times the group scale) in f16 per group.
//
// MoE experts: per expert (mlp.experts.E.{gate,up,down}_proj.*, what msModelSlim writes, also
// for models whose float release fuses them: its adapters split the 3-D tensors into one
// module per expert before quantizing), or fused, every tensor above with the experts first:
// mlp.experts.gate_up_proj.{weight [E, 2F, I] (W4A8: [E, F, I]), weight_scale [E, 2F, 1], ...}
// (each expert's gate then up outputs) and mlp.experts.down_proj.*, the weight also accepted
// under the fused name itself (as the float layout names it). A fused tensor is the [E · O, I]
// matrix of its experts' rows, bound as one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "infera/io/safetensors.h"
#include "infera/kernels/quant.h"
#include "infera/model/prequant.h"

namespace infera::prequant {

inline constexpr const char* kSlimDescriptionFile = "quant_model_description.json";

struct SlimDescription {
  std::string file;  // for messages
  std::map<std::string, std::string> types;  // tensor name -> type ("FLOAT", "W8A8", ...)
  std::string version;  // "1.0.0" for msModelSlim v1 outputs
  int64_t group_size = 0;  // 0: per channel
  std::string model_quant_type;  // a summary only; never used per layer
  // The type of the module whose weight is `weight_name` ("<module>.weight", or a fused expert
  // tensor "...mlp.experts.gate_up_proj" described as itself or as "<name>.weight"); "" when
  // the description does not name it.
  std::string type_of(const std::string& weight_name) const;
  // Whether description key `key` is a layer's weight: "<module>.weight", or a fused expert
  // weight stored under its own name (its scales then "<key>.weight_scale").
  bool is_weight(const std::string& key) const;
};

bool has_slim_description(const std::string& dir);
// Parses <dir>/quant_model_description.json; throws infera::Error naming the file and the key
// for a value that is not a string (reserved keys excepted) or an unknown type.
SlimDescription read_slim_description(const std::string& dir);
SlimDescription parse_slim_description(const nlohmann::json& j, const std::string& file);

// Everything inconsistent between the description and the tensors, one line each (empty: none):
// a described tensor the weights do not store, a quantized weight without its scale tensors or
// with scale tensors of the wrong shape or dtype, sibling tensors described with another type,
// an int8 weight the description does not name, a type Infera does not run.
std::vector<std::string> check_slim(const SlimDescription& d, const WeightStore& store);

// W4A8 int4 packed along the output ([O/2, I] bytes) -> values in [-8, 7], [O, I].
std::vector<int8_t> unpack_slim_int4(const int8_t* packed, int64_t rows, int64_t cols);

// The f32 weights the layer computes with (the reference tests compare against): W8A8 and
// W8A8_DYNAMIC w·scale (static: deq_scale / input_scale), W4A8 int4·scale.
std::vector<float> dequantize_slim(const WeightStore& store, const std::string& name, int64_t rows, int64_t cols,
                                   const SlimDescription& d);

}  // namespace infera::prequant
