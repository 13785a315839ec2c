// config.json -> ModelConfig. Every config key Infera reads is read here, and nowhere else.
// Defaults follow the Hugging Face config classes (LlamaConfig, Qwen3Config,
// Qwen3MoeConfig), so a field left out means what it means to transformers.
#include "infera/model/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/model/arch_registry.h"
#include "infera/model/config_reader.h"
#include "infera/model/gguf_loader.h"

namespace infera {
namespace {

using json = nlohmann::json;

// HF get_mscale (DeepSeek-style yarn attention scaling).
double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// rope_scaling (transformers <= 4.x) or rope_parameters (transformers 5: also carries
// rope_theta and partial_rotary_factor).
// default_partial: partial_rotary_factor when the config does not say (the hybrid
// families default to 0.25, everything else rotates the whole head).
void parse_rope(const ConfigReader& r, ModelConfig& c, double default_partial) {
  const std::string& src = r.source();
  const json* scaling = r.find("rope_scaling");
  const char* scaling_key = "rope_scaling";
  if (!scaling) {
    scaling = r.find("rope_parameters");
    scaling_key = "rope_parameters";
  }
  if (scaling && !scaling->is_object()) r.wrong_type(scaling_key, "an object or null", *scaling);

  // Values inside the scaling object, with errors naming "rope_scaling.<key>".
  auto sub_number = [&](const char* key) -> std::optional<double> {
    if (!scaling) return std::nullopt;
    auto it = scaling->find(key);
    if (it == scaling->end() || it->is_null()) return std::nullopt;
    if (!it->is_number())
      fail("{}: field '{}.{}' must be a number, got {} {}", src, scaling_key, key, it->type_name(), it->dump());
    return it->get<double>();
  };
  auto required_sub = [&](const char* key, const std::string& type) {
    auto v = sub_number(key);
    if (!v) fail("{}: field '{}.{}' is required for rope type '{}'", src, scaling_key, key, type);
    return *v;
  };

  double theta = r.number("rope_theta", 10000.0);
  if (auto t = sub_number("rope_theta")) theta = *t;
  if (!(theta > 0)) fail("{}: field 'rope_theta' must be positive, got {}", src, theta);
  c.rope.theta = static_cast<float>(theta);

  double partial = r.number("partial_rotary_factor", default_partial);
  if (auto p = sub_number("partial_rotary_factor")) partial = *p;
  if (!(partial > 0 && partial <= 1)) fail("{}: field 'partial_rotary_factor' must be in (0, 1], got {}", src, partial);
  c.rope.rotary_dim = static_cast<int>(c.head_dim * partial);
  if (c.rope.rotary_dim <= 0 || c.rope.rotary_dim % 2 != 0) {
    fail("{}: head_dim {} * partial_rotary_factor {} gives {} rotary dims; it must be a positive even number", src,
         c.head_dim, partial, c.rope.rotary_dim);
  }

  if (!scaling) return;
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto it = scaling->find(key);
    if (it == scaling->end() || it->is_null()) continue;
    if (!it->is_string()) fail("{}: field '{}.{}' must be a string, got {}", src, scaling_key, key, it->dump());
    type = it->get<std::string>();
    break;
  }
  if (type.empty()) {
    // rope_parameters may legitimately hold only rope_theta; rope_scaling must say its type.
    if (scaling_key == std::string_view("rope_parameters")) return;
    fail("{}: field '{}' has no 'rope_type' (one of default, linear, llama3, yarn)", src, scaling_key);
  }
  if (type == "default") return;

  const double factor = required_sub("factor", type);
  if (!(factor > 0)) fail("{}: field '{}.factor' must be positive, got {}", src, scaling_key, factor);
  c.rope.factor = static_cast<float>(factor);

  if (type == "linear") {
    c.rope.scaling = RopeScaling::kLinear;
  } else if (type == "llama3") {
    c.rope.scaling = RopeScaling::kLlama3;
    c.rope.low_freq_factor = static_cast<float>(required_sub("low_freq_factor", type));
    c.rope.high_freq_factor = static_cast<float>(required_sub("high_freq_factor", type));
    c.rope.original_max_position = static_cast<int>(required_sub("original_max_position_embeddings", type));
    if (!(c.rope.high_freq_factor > c.rope.low_freq_factor) || c.rope.low_freq_factor <= 0) {
      fail("{}: field '{}' needs 0 < low_freq_factor < high_freq_factor, got {} and {}", src, scaling_key,
           c.rope.low_freq_factor, c.rope.high_freq_factor);
    }
    if (c.rope.original_max_position <= 0) {
      fail("{}: field '{}.original_max_position_embeddings' must be positive", src, scaling_key);
    }
  } else if (type == "yarn") {
    c.rope.scaling = RopeScaling::kYarn;
    // transformers falls back to max_position_embeddings when it is absent.
    const double original = sub_number("original_max_position_embeddings").value_or(c.max_position_embeddings);
    c.rope.original_max_position = static_cast<int>(original);
    if (c.rope.original_max_position <= 0) {
      fail("{}: field '{}.original_max_position_embeddings' must be positive", src, scaling_key);
    }
    c.rope.beta_fast = static_cast<float>(sub_number("beta_fast").value_or(32.0));
    c.rope.beta_slow = static_cast<float>(sub_number("beta_slow").value_or(1.0));
    const auto mscale = sub_number("mscale");
    const auto mscale_all_dim = sub_number("mscale_all_dim");
    c.rope.mscale = static_cast<float>(mscale.value_or(0.0));
    c.rope.mscale_all_dim = static_cast<float>(mscale_all_dim.value_or(0.0));
    if (auto af = sub_number("attention_factor")) {
      c.rope.attention_factor = static_cast<float>(*af);
    } else if (mscale && mscale_all_dim && *mscale != 0 && *mscale_all_dim != 0) {
      c.rope.attention_factor = static_cast<float>(yarn_mscale(factor, *mscale) / yarn_mscale(factor, *mscale_all_dim));
    } else {
      c.rope.attention_factor = static_cast<float>(yarn_mscale(factor, 1.0));
    }
  } else {
    fail("{}: field '{}' has unsupported rope type '{}' (supported: default, linear, llama3, yarn)", src, scaling_key,
         type);
  }
}

// The Qwen MoE keys. norm_topk_default: norm_topk_prob when absent (Qwen3MoeConfig false,
// Qwen3.5 and Qwen3-Next true); shared_default: shared_expert_intermediate_size when absent
// (every Qwen3-Next MoE block has a shared expert, Qwen3NextConfig default 512 wide).
void parse_moe(const ConfigReader& r, ModelConfig& c, bool norm_topk_default = false, int shared_default = 0) {
  const std::string& src = r.source();
  c.num_experts = r.req_positive("num_experts");
  c.num_experts_per_tok = r.req_positive("num_experts_per_tok");
  c.moe_intermediate_size = r.req_positive("moe_intermediate_size");
  c.norm_topk_prob = r.boolean("norm_topk_prob", norm_topk_default);
  c.decoder_sparse_step = r.opt_positive("decoder_sparse_step", 1);
  if (c.num_experts_per_tok > c.num_experts) {
    fail("{}: num_experts_per_tok ({}) exceeds num_experts ({})", src, c.num_experts_per_tok, c.num_experts);
  }
  if (const json* layers = r.find("mlp_only_layers")) {
    if (!layers->is_array()) r.wrong_type("mlp_only_layers", "a list of layer indices", *layers);
    for (const auto& e : *layers) {
      const int64_t i = r.as_int("mlp_only_layers", e);
      if (i < 0 || i >= c.num_layers) {
        fail("{}: field 'mlp_only_layers' holds layer {}, outside 0..{}", src, i, c.num_layers - 1);
      }
      c.mlp_only_layers.push_back(static_cast<int>(i));
    }
  }
  c.shared_expert_intermediate_size = shared_default;
  if (auto shared = r.opt_int("shared_expert_intermediate_size")) {
    if (*shared < 0) fail("{}: field 'shared_expert_intermediate_size' must be >= 0, got {}", src, *shared);
    c.shared_expert_intermediate_size = static_cast<int>(*shared);
  }
  bool any_dense = false;
  for (int i = 0; i < c.num_layers; ++i) any_dense = any_dense || !c.is_moe_layer(i);
  // The dense MLP size matters only when some layer is dense.
  c.intermediate_size = any_dense ? r.req_positive("intermediate_size") : r.opt_positive("intermediate_size", 0);
}

// ---- Hybrid attention families (qwen3_next, qwen3_5, qwen3_5_moe) ----------------------
// Defaults follow Qwen3NextConfig / Qwen3_5(Moe)TextConfig.
void parse_hybrid(const ConfigReader& r, ModelConfig& c) {
  const std::string& src = r.source();
  if (const json* types = r.find("layer_types")) {
    if (!types->is_array()) r.wrong_type("layer_types", "a list of \"linear_attention\" / \"full_attention\"", *types);
    if (static_cast<int>(types->size()) != c.num_layers) {
      fail("{}: field 'layer_types' lists {} layers but num_hidden_layers is {}", src, types->size(), c.num_layers);
    }
    for (const auto& t : *types) {
      const std::string name = t.is_string() ? t.get<std::string>() : t.dump();
      if (name == "linear_attention")
        c.layer_types.push_back(ModelConfig::LayerType::kLinearAttention);
      else if (name == "full_attention")
        c.layer_types.push_back(ModelConfig::LayerType::kFullAttention);
      else
        fail("{}: field 'layer_types' holds '{}' (expected \"linear_attention\" or \"full_attention\")", src, name);
    }
  } else {
    // Without layer_types every full_attention_interval-th layer is full attention.
    c.full_attention_interval = r.opt_positive("full_attention_interval", 4);
    for (int i = 0; i < c.num_layers; ++i) {
      c.layer_types.push_back((i + 1) % c.full_attention_interval == 0 ? ModelConfig::LayerType::kFullAttention
                                                                       : ModelConfig::LayerType::kLinearAttention);
    }
  }
  c.attn_output_gate = r.boolean("attn_output_gate", true);
  c.linear_conv_kernel_dim = r.opt_positive("linear_conv_kernel_dim", 4);
  c.linear_key_head_dim = r.opt_positive("linear_key_head_dim", 128);
  c.linear_value_head_dim = r.opt_positive("linear_value_head_dim", 128);
  c.linear_num_key_heads = r.opt_positive("linear_num_key_heads", 16);
  c.linear_num_value_heads = r.opt_positive("linear_num_value_heads", 32);
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0) {
    fail("{}: linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})", src,
         c.linear_num_value_heads, c.linear_num_key_heads);
  }
  c.mamba_ssm_dtype = r.opt_string("mamba_ssm_dtype").value_or("float32");
  // Qwen3-Next has no mtp_num_hidden_layers key (its checkpoints still ship mtp.* tensors).
  if (auto mtp = r.opt_int("mtp_num_hidden_layers")) {
    if (*mtp < 0) fail("{}: field 'mtp_num_hidden_layers' must be >= 0, got {}", src, *mtp);
    c.mtp_num_hidden_layers = static_cast<int>(*mtp);
  }
}

// ---- DeepSeek-V3 / V3.2 (MLA + group-limited MoE) --------------------------------------
// Defaults follow DeepseekV3Config.
void parse_deepseek(const ConfigReader& r, ModelConfig& c) {
  const std::string& src = r.source();
  c.mla = true;
  auto non_negative = [&](const char* key, int fallback) {
    auto v = r.opt_int(key);
    if (!v) return fallback;
    if (*v < 0) fail("{}: field '{}' must be >= 0, got {}", src, key, *v);
    return static_cast<int>(*v);
  };
  // Absent: DeepseekV3Config's 1536; null (V2-Lite style) or 0: q projected directly.
  c.q_lora_rank = r.is_null("q_lora_rank") ? 0 : non_negative("q_lora_rank", 1536);
  c.kv_lora_rank = r.req_positive("kv_lora_rank");
  c.qk_nope_head_dim = r.req_positive("qk_nope_head_dim");
  c.qk_rope_head_dim = r.req_positive("qk_rope_head_dim");
  c.v_head_dim = r.req_positive("v_head_dim");
  c.num_experts = non_negative("n_routed_experts", 0);
  c.n_shared_experts = non_negative("n_shared_experts", 0);
  if (c.num_experts > 0) {
    c.num_experts_per_tok = r.req_positive("num_experts_per_tok");
    c.moe_intermediate_size = r.req_positive("moe_intermediate_size");
    if (c.num_experts_per_tok > c.num_experts) {
      fail("{}: num_experts_per_tok ({}) exceeds n_routed_experts ({})", src, c.num_experts_per_tok, c.num_experts);
    }
  }
  c.norm_topk_prob = r.boolean("norm_topk_prob", true);
  c.first_k_dense_replace = non_negative("first_k_dense_replace", 0);
  c.moe_layer_freq = r.opt_positive("moe_layer_freq", 1);
  c.n_group = non_negative("n_group", 0);
  c.topk_group = non_negative("topk_group", 0);
  c.routed_scaling_factor = static_cast<float>(r.number("routed_scaling_factor", 1.0));
  c.scoring_func = r.opt_string("scoring_func").value_or("sigmoid");
  c.topk_method = r.opt_string("topk_method").value_or("noaux_tc");
  c.num_nextn_predict_layers = non_negative("num_nextn_predict_layers", 0);
  c.index_n_heads = non_negative("index_n_heads", 0);
  c.index_head_dim = non_negative("index_head_dim", 0);
  c.index_topk = non_negative("index_topk", 0);
}

}  // namespace

// ---- The registry rows' read_config hooks (model/arch_registry.h) ----

void read_dense_config(const ConfigReader& r, ModelConfig& c) {
  c.intermediate_size = r.req_positive("intermediate_size");
}

void read_qwen3_moe_config(const ConfigReader& r, ModelConfig& c) { parse_moe(r, c); }

void read_qwen35_config(const ConfigReader& r, ModelConfig& c) {
  parse_hybrid(r, c);
  read_dense_config(r, c);
}

// Qwen3.5 always renormalises the top-k weights.
void read_qwen35_moe_config(const ConfigReader& r, ModelConfig& c) {
  parse_hybrid(r, c);
  parse_moe(r, c, true);
}

// Qwen3NextConfig: norm_topk_prob true and a 512-wide shared expert unless said otherwise.
void read_qwen3_next_config(const ConfigReader& r, ModelConfig& c) {
  parse_hybrid(r, c);
  parse_moe(r, c, true, 512);
}

void read_deepseek_config(const ConfigReader& r, ModelConfig& c) {
  parse_deepseek(r, c);
  c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  // Layers [0, first_k_dense_replace) are dense.
  c.intermediate_size = c.first_k_dense_replace > 0 || c.num_experts == 0 ? r.req_positive("intermediate_size")
                                                                          : r.opt_positive("intermediate_size", 0);
}

bool ModelConfig::is_linear_attention_layer(int layer) const {
  return layer >= 0 && layer < static_cast<int>(layer_types.size()) &&
         layer_types[layer] == LayerType::kLinearAttention;
}

int ModelConfig::num_full_attention_layers() const {
  int n = 0;
  for (int i = 0; i < num_layers; ++i) n += is_linear_attention_layer(i) ? 0 : 1;
  return n;
}

int64_t ModelConfig::kv_values_per_token_per_layer() const {
  // DeepSeek-V3.2 keeps the lightning indexer's key beside the latent.
  if (mla) return static_cast<int64_t>(kv_lora_rank) + qk_rope_head_dim + (index_n_heads > 0 ? index_head_dim : 0);
  return 2LL * num_kv_heads * head_dim;
}

bool ModelConfig::is_moe_layer(int layer) const {
  if (num_experts <= 0) return false;
  if (mla) return layer >= first_k_dense_replace && layer % moe_layer_freq == 0;  // DeepSeek
  for (int l : mlp_only_layers) {
    if (l == layer) return false;
  }
  return (layer + 1) % decoder_sparse_step == 0;
}

ModelConfig parse_model_config(const json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: expected a JSON object, got {}", source, j.type_name());
  ConfigReader r(j, source);
  ModelConfig c;

  // The wrapper's model_type names the architecture; text_config's is a fallback.
  std::optional<std::string> model_type;
  if (auto it = j.find("model_type"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) r.wrong_type("model_type", "a string", *it);
    model_type = it->get<std::string>();
  } else {
    model_type = r.opt_string("model_type");
  }
  if (!model_type) fail("{}: required field 'model_type' is missing (supported: {})", source, known_model_types());
  c.model_type = *model_type;
  const ArchInfo* info = find_arch(c.model_type);
  if (!info) fail("{}: unsupported model_type '{}' (supported: {})", source, c.model_type, known_model_types());
  c.arch = info->arch;
  const bool hybrid = info->traits.hybrid;
  const bool qwen3_family = info->traits.qwen3_defaults;

  c.hidden_size = r.req_positive("hidden_size");
  c.num_layers = r.req_positive("num_hidden_layers");
  c.num_heads = r.req_positive("num_attention_heads");
  c.num_kv_heads = r.opt_positive("num_key_value_heads", c.num_heads);
  c.vocab_size = r.req_positive("vocab_size");
  // LlamaConfig defaults to 2048 positions, Qwen3Config / Qwen3MoeConfig to 32768.
  c.max_position_embeddings = r.opt_positive("max_position_embeddings", qwen3_family ? 32768 : 2048);
  if (c.num_heads % c.num_kv_heads != 0) {
    fail("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", source, c.num_heads,
         c.num_kv_heads);
  }
  if (auto head_dim = r.opt_int("head_dim")) {
    c.head_dim = r.positive("head_dim", *head_dim);
  } else if (info->traits.mla) {
    // MLA: the q/k head is [nope | rope]; set below from qk_*_head_dim.
    c.head_dim = 0;
  } else if (qwen3_family) {
    // Qwen3Config's own default (q dim = heads * 128 need not equal hidden_size); the
    // hybrid families default to 256.
    c.head_dim = hybrid ? 256 : 128;
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      fail("{}: hidden_size ({}) is not divisible by num_attention_heads ({}) and 'head_dim' is not given", source,
           c.hidden_size, c.num_heads);
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }

  // The architecture's own keys (the registry row's read_config hook).
  if (!info->read_config) fail("{}: architecture '{}' has no config reader", source, info->name);
  info->read_config(r, c);
  // Counts that size the tensor table before any checkpoint is read: a config (or GGUF
  // metadata) claiming a million layers would otherwise take minutes and gigabytes listing
  // tensors that cannot be there. The bounds are far above any published model (DeepSeek-V3:
  // 61 layers x 256 experts; Qwen3.5-397B-A17B: 60 x 512).
  const int64_t mtp = int64_t{c.mtp_num_hidden_layers} + c.num_nextn_predict_layers, layers = c.num_layers + mtp;
  if (layers > kMaxLayers) {
    fail("{}: {} layers ({} + {} MTP); Infera reads models of at most {} layers", source, layers, c.num_layers, mtp,
         kMaxLayers);
  }
  if (layers * c.num_experts > kMaxExpertsInAll) {
    fail("{}: {} layers x {} experts; Infera reads models of at most {} experts in all", source, layers, c.num_experts,
         kMaxExpertsInAll);
  }

  const double eps = r.number("rms_norm_eps", 1e-6);
  if (!(eps > 0 && eps < 1)) fail("{}: field 'rms_norm_eps' must be in (0, 1), got {}", source, eps);
  c.rms_norm_eps = static_cast<float>(eps);

  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.attention_bias = r.boolean("attention_bias", false);
  c.mlp_bias = r.boolean("mlp_bias", false);
  c.qk_norm = qwen3_family;
  if (auto act = r.opt_string("hidden_act"); act && *act != "silu") {
    fail("{}: field 'hidden_act' is '{}'; only 'silu' is supported for {}", source, *act, c.model_type);
  }
  if (r.boolean("use_sliding_window", false)) {
    fail("{}: field 'use_sliding_window' is true; sliding-window attention is not supported", source);
  }

  parse_rope(r, c, hybrid ? 0.25 : 1.0);
  if (info->traits.mla) c.rope.rotary_dim = c.qk_rope_head_dim;  // only the k_pe/q_pe part rotates
  c.partial_rotary_factor = c.head_dim > 0 ? static_cast<float>(c.rope.rotary_dim) / c.head_dim : 1.0f;

  if (auto dtype = r.opt_string("torch_dtype"))
    c.torch_dtype = *dtype;
  else if (auto d = r.opt_string("dtype"))
    c.torch_dtype = *d;  // transformers 5 name
  if (auto bos = r.opt_int("bos_token_id")) c.bos_token_id = static_cast<int>(*bos);
  c.eos_token_ids = r.int_list("eos_token_id");
  return c;
}

ModelConfig load_model_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (is_gguf_path(model_dir)) return gguf_model_config(model_dir);
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    if (fs::exists(model_dir, ec))
      fail("{}: not a directory (expected a model directory holding config.json)", model_dir);
    fail("{}: model directory not found", model_dir);
  }
  const std::string path = (fs::path(model_dir) / "config.json").string();
  const json j = read_json_file(path, "cannot read it (a Hugging Face model directory needs config.json)");
  return parse_model_config(j, path);
}

}  // namespace infera
