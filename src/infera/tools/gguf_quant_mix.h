// The per-tensor types of llama.cpp's quantization mixes (llama-quantize's
// llama_tensor_get_type, as of the llama.cpp that node-llama-cpp 3.22.1 ships), so that
// `infera convert --type q4_k_m` writes the tensor types llama-quantize writes:
//   - only tensors of 2+ dimensions whose name ends in "weight" are quantized, never norms,
//     MoE routers (ffn_gate_inp), conv1d weights and the like; the rest keep their type;
//   - output.weight (and token_embd.weight when the embeddings are tied) gets Q6_K (Q8_0
//     when its rows are not whole 256-blocks; the Q8_0 mix keeps Q8_0);
//   - attn_v (and attn_qkv / attn_kv_b) and ffn_down get more bits in some layers
//     (use_more_bits: the first and last eighth and every third layer between) for the _M
//     mixes, Q5_K for IQ4 with grouped-query attention, Q8_0 with 8 experts; and so on;
//   - a row that is not a whole number of the type's blocks falls back (Q4_K -> Q5_0,
//     Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL; F16 when not even 32-blocks).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "infera/io/gguf.h"

namespace infera {

// llama.cpp's llama_ftype mixes this converter writes (the values are llama_ftype numbers,
// written as general.file_type).
enum class QuantMix : uint32_t {
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 7,
  kQ5_0 = 8,
  kQ5_1 = 9,
  kQ4_K_S = 14,
  kQ4_K_M = 15,
  kQ5_K_S = 16,
  kQ5_K_M = 17,
  kQ6_K = 18,
  kIQ4_NL = 25,
  kIQ4_XS = 30,
};

// "q4_k_m", ... -> the mix; nullopt for other names.
std::optional<QuantMix> parse_quant_mix(const std::string& name);

// What the choice depends on besides the tensors themselves.
struct QuantMixModel {
  // llama.cpp's LLM_TYPE_70B (its llama architecture with 80 layers and grouped-query
  // attention): attn_v gets Q5_K where the mix says Q4_K.
  bool llama_70b = false;
  int n_layer = 0;  // block_count (every block, MTP / NextN ones included)
  int n_head = 0;  // of layer 0
  int n_head_kv = 0;
  int n_expert = 0;
  bool has_imatrix = false;
};

struct QuantMixTensor {
  std::string name;  // GGUF name
  std::vector<uint64_t> ne;  // innermost first
  gguf::GgmlType type = gguf::GgmlType::kF32;  // the type it has unquantized
};

// Whether llama-quantize quantizes this tensor at all.
bool mix_quantizes(const QuantMixTensor& t);

// The type of each tensor under `mix` (same order as `tensors`). pure: llama-quantize's
// --pure, every quantized tensor in the mix's base type (only the fallbacks apply).
std::vector<gguf::GgmlType> choose_mix_types(QuantMix mix, const QuantMixModel& model,
                                             const std::vector<QuantMixTensor>& tensors, bool pure = false);

}  // namespace infera
