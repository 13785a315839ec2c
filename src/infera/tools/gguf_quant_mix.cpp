#include "infera/tools/gguf_quant_mix.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string_view>

#include "infera/base/error.h"

namespace infera {

using gguf::GgmlType;

namespace {

enum class Category {
  kTokenEmbd,
  kAttnQ,
  kAttnV,
  kAttnK,
  kAttnQkv,
  kAttnKvB,
  kAttnOutput,
  kFfnUp,
  kFfnGate,
  kFfnDown,
  kOutput,
  kOther
};

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// The broad role of a tensor, from its name (the same substring tests, in the same order,
// as llama.cpp's tensor_get_category).
Category category_of(std::string_view name) {
  if (name == "output.weight") return Category::kOutput;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Category::kTokenEmbd;
  if (contains(name, "attn_qkv.weight")) return Category::kAttnQkv;
  if (contains(name, "attn_kv_b.weight")) return Category::kAttnKvB;
  if (contains(name, "attn_v.weight")) return Category::kAttnV;
  if (contains(name, "attn_k.weight")) return Category::kAttnK;
  if (contains(name, "attn_q.weight")) return Category::kAttnQ;
  if (contains(name, "attn_output.weight")) return Category::kAttnOutput;
  if (contains(name, "ffn_up")) return Category::kFfnUp;
  if (contains(name, "ffn_gate")) return Category::kFfnGate;
  if (contains(name, "ffn_down")) return Category::kFfnDown;
  return Category::kOther;
}

bool attn_v_like(Category c) { return c == Category::kAttnV || c == Category::kAttnQkv || c == Category::kAttnKvB; }

GgmlType default_type(QuantMix mix) {
  switch (mix) {
    case QuantMix::kQ4_0: return GgmlType::kQ4_0;
    case QuantMix::kQ4_1: return GgmlType::kQ4_1;
    case QuantMix::kQ8_0: return GgmlType::kQ8_0;
    case QuantMix::kQ5_0: return GgmlType::kQ5_0;
    case QuantMix::kQ5_1: return GgmlType::kQ5_1;
    case QuantMix::kQ4_K_S:
    case QuantMix::kQ4_K_M: return GgmlType::kQ4_K;
    case QuantMix::kQ5_K_S:
    case QuantMix::kQ5_K_M: return GgmlType::kQ5_K;
    case QuantMix::kQ6_K: return GgmlType::kQ6_K;
    case QuantMix::kIQ4_NL: return GgmlType::kIQ4_NL;
    case QuantMix::kIQ4_XS: return GgmlType::kIQ4_XS;
  }
  return GgmlType::kF32;
}

int64_t block_of(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS: return 256;
    default: return 32;
  }
}

// Layers that get more bits in the _M mixes: the first and last eighth, every third between.
bool use_more_bits(int i_layer, int n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

// "blk.N." -> N; -1 for tensors outside the blocks.
int layer_of(const std::string& name) {
  int layer = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return -1;
  return layer;
}

struct State {
  QuantMix mix;
  const QuantMixModel& model;
  bool tied_embeddings = true;
  int n_attention_wv = 0, i_attention_wv = 0, i_ffn_down = 0;
};

GgmlType mix_type(State& s, const QuantMixTensor& t, Category cat) {
  const QuantMix m = s.mix;
  const QuantMixModel& model = s.model;
  const int n_gqa = model.n_head_kv > 0 ? model.n_head / model.n_head_kv : 0;
  GgmlType type = default_type(m);
  if (cat == Category::kOutput || (s.tied_embeddings && cat == Category::kTokenEmbd)) {
    if (static_cast<int64_t>(t.ne[0]) % block_of(type) != 0) {
      type = GgmlType::kQ8_0;
    } else if (type != GgmlType::kQ8_0) {
      type = GgmlType::kQ6_K;
    }
  } else if (cat == Category::kTokenEmbd) {
    // Unchanged for every mix written here.
  } else if (attn_v_like(cat)) {
    if ((m == QuantMix::kIQ4_NL || m == QuantMix::kIQ4_XS) && n_gqa >= 4) {
      type = GgmlType::kQ5_K;
    } else if ((m == QuantMix::kQ4_K_M || m == QuantMix::kQ5_K_M) &&
               use_more_bits(s.i_attention_wv, s.n_attention_wv)) {
      type = GgmlType::kQ6_K;
    } else if (m == QuantMix::kQ4_K_S && s.i_attention_wv < 4) {
      type = GgmlType::kQ5_K;
    }
    if (model.llama_70b && type == GgmlType::kQ4_K) type = GgmlType::kQ5_K;
    if (model.n_expert == 8) type = GgmlType::kQ8_0;
    ++s.i_attention_wv;
  } else if (cat == Category::kAttnK) {
    if (model.n_expert == 8) type = GgmlType::kQ8_0;
  } else if (cat == Category::kFfnDown) {
    int i_layer = s.i_ffn_down;
    const int n_layer = model.n_layer;
    if (model.n_expert > 1) {
      // Experts are not one tensor per layer in order: take the layer from the name.
      i_layer = layer_of(t.name);
      if (i_layer < 0 || i_layer >= n_layer) fail("tensor '{}': no layer in [0, {}) in its name", t.name, n_layer);
    }
    if (m == QuantMix::kQ4_K_M) {
      if (use_more_bits(i_layer, n_layer)) type = GgmlType::kQ6_K;
    } else if (i_layer < n_layer / 8 && (m == QuantMix::kIQ4_NL || m == QuantMix::kIQ4_XS) && !model.has_imatrix) {
      type = GgmlType::kQ5_K;
    } else if (m == QuantMix::kQ5_K_M && use_more_bits(i_layer, n_layer)) {
      type = GgmlType::kQ6_K;
    } else if (m == QuantMix::kQ4_K_S && i_layer < n_layer / 8) {
      type = GgmlType::kQ5_K;
    } else if ((m == QuantMix::kQ4_0 || m == QuantMix::kQ5_0) && model.has_imatrix && i_layer < n_layer / 8) {
      type = m == QuantMix::kQ4_0 ? GgmlType::kQ4_1 : GgmlType::kQ5_1;
    }
    ++s.i_ffn_down;
  } else if (cat == Category::kAttnOutput) {
    if (model.n_expert == 8 &&
        (m == QuantMix::kIQ4_NL || m == QuantMix::kQ4_K_S || m == QuantMix::kQ4_K_M || m == QuantMix::kIQ4_XS)) {
      type = GgmlType::kQ5_K;
    }
  }
  return type;
}

// Rows that are not whole blocks of `type`: the next type with 32-weight blocks, else F16.
GgmlType fallback(const QuantMixTensor& t, GgmlType type) {
  const int64_t cols = static_cast<int64_t>(t.ne[0]);
  if (cols % block_of(type) == 0) return type;
  switch (type) {
    case GgmlType::kIQ4_XS: type = GgmlType::kIQ4_NL; break;
    case GgmlType::kQ4_K: type = GgmlType::kQ5_0; break;
    case GgmlType::kQ5_K: type = GgmlType::kQ5_1; break;
    case GgmlType::kQ6_K: type = GgmlType::kQ8_0; break;
    default: break;  // 32-weight types: llama-quantize refuses these rows; F16 as before
  }
  return cols % block_of(type) == 0 ? type : GgmlType::kF16;
}

}  // namespace

std::optional<QuantMix> parse_quant_mix(const std::string& name) {
  static const std::pair<const char*, QuantMix> kNames[] = {
      {"q4_0", QuantMix::kQ4_0},     {"q4_1", QuantMix::kQ4_1},     {"q5_0", QuantMix::kQ5_0},
      {"q5_1", QuantMix::kQ5_1},     {"q8_0", QuantMix::kQ8_0},     {"q4_k_s", QuantMix::kQ4_K_S},
      {"q4_k_m", QuantMix::kQ4_K_M}, {"q5_k_s", QuantMix::kQ5_K_S}, {"q5_k_m", QuantMix::kQ5_K_M},
      {"q6_k", QuantMix::kQ6_K},     {"iq4_nl", QuantMix::kIQ4_NL}, {"iq4_xs", QuantMix::kIQ4_XS},
  };
  for (const auto& [n, mix] : kNames) {
    if (name == n) return mix;
  }
  return std::nullopt;
}

bool mix_quantizes(const QuantMixTensor& t) {
  if (t.ne.size() < 2) return false;
  size_t dims = t.ne.size();
  while (dims > 1 && t.ne[dims - 1] == 1) --dims;  // ggml_n_dims ignores trailing 1s
  if (dims < 2) return false;
  const std::string_view n = t.name;
  if (!n.ends_with("weight")) return false;
  static const char* const kNever[] = {"_norm.weight",
                                       "ffn_gate_inp.weight",
                                       "ffn_gate_tid2eid.weight",
                                       "altup",
                                       "laurel",
                                       "per_layer_model_proj",
                                       "ssm_conv1d",
                                       "shortconv.conv.weight",
                                       "indexer.k_proj.weight",
                                       "indexer.q_proj.weight",
                                       "time_mix_first.weight",
                                       "time_mix_w0.weight",
                                       "time_mix_w1.weight",
                                       "time_mix_w2.weight",
                                       "time_mix_v0.weight",
                                       "time_mix_v1.weight",
                                       "time_mix_v2.weight",
                                       "time_mix_a0.weight",
                                       "time_mix_a1.weight",
                                       "time_mix_a2.weight",
                                       "time_mix_g1.weight",
                                       "time_mix_g2.weight",
                                       "time_mix_decay_w1.weight",
                                       "time_mix_decay_w2.weight",
                                       "time_mix_lerp_fused.weight",
                                       "attn_rel_b.weight",
                                       ".position_embd",
                                       "sam.pos_embd",
                                       "sam.neck.",
                                       "sam.net_",
                                       ".rel_pos",
                                       ".patch_embd",
                                       ".patch_merger",
                                       "a.rvq.codebook",
                                       "mm.a.code_embd"};
  for (const char* part : kNever) {
    if (contains(n, part)) return false;
  }
  return n != "position_embd.weight" && n != "token_types.weight";
}

std::vector<GgmlType> choose_mix_types(QuantMix mix, const QuantMixModel& model,
                                       const std::vector<QuantMixTensor>& tensors, bool pure) {
  State s{mix, model};
  std::vector<Category> cats(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    cats[i] = category_of(tensors[i].name);
    if (attn_v_like(cats[i])) ++s.n_attention_wv;
    if (cats[i] == Category::kOutput) s.tied_embeddings = false;
  }
  // llama-quantize decides in its tensor order (by block number, tensors outside the blocks
  // first, then by name): the per-layer counters follow that order.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = layer_of(tensors[a].name), lb = layer_of(tensors[b].name);
    if (la != lb) return la < lb;
    return tensors[a].name < tensors[b].name;
  });
  std::vector<GgmlType> types(tensors.size());
  for (const size_t i : order) {
    const QuantMixTensor& t = tensors[i];
    if (!mix_quantizes(t)) {
      types[i] = t.type;
      continue;
    }
    types[i] = fallback(t, pure ? default_type(mix) : mix_type(s, t, cats[i]));
  }
  return types;
}

}  // namespace infera
