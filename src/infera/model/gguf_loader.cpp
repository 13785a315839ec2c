#include "infera/model/gguf_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/load_progress.h"
#include "infera/base/log.h"
#include "infera/io/gguf.h"
#include "infera/kernels/ggml_quants.h"
#include "infera/model/arch_registry.h"
#include "infera/model/quantized_weights.h"
#include "infera/model/tensor_table.h"
#include "infera/model/weights.h"

namespace infera {

namespace {

using nlohmann::json;

// Every part of a (possibly split) GGUF model; metadata comes from the first part.
class GgufFiles {
 public:
  // `progress` (load_into_memory only): reading the parts is its "reading" step.
  GgufFiles(const std::string& path, bool load_into_memory, LoadProgress* progress = nullptr) : path_(path) {
    const std::vector<std::string> parts = gguf::split_paths(path);
    if (progress && load_into_memory) progress->begin("reading", files_bytes(parts));
    for (const std::string& p : parts) {
      readers_.push_back(std::make_unique<gguf::Reader>(p, load_into_memory, load_into_memory ? progress : nullptr));
      bytes_ += readers_.back()->file_size();
    }
    if (progress && load_into_memory) progress->end();
    for (const auto& r : readers_) {
      for (const gguf::Tensor& t : r->tensors()) {
        if (!tensors_.emplace(t.name, &t).second) fail("{}: tensor '{}' is stored in two parts", path_, t.name);
      }
    }
  }

  const std::string& path() const { return path_; }
  const gguf::Reader& first() const { return *readers_.front(); }
  const gguf::Value* find(const std::string& key) const { return first().find(key); }
  const gguf::Tensor* tensor(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : it->second;
  }
  size_t bytes() const { return bytes_; }
  // Every tensor of every part, by name.
  const std::map<std::string, const gguf::Tensor*>& tensors() const { return tensors_; }

 private:
  static int64_t files_bytes(const std::vector<std::string>& parts) {
    int64_t n = 0;
    for (const std::string& p : parts) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(p, ec);
      if (!ec) n += static_cast<int64_t>(size);
    }
    return n;
  }

  std::string path_;
  std::vector<std::unique_ptr<gguf::Reader>> readers_;
  std::map<std::string, const gguf::Tensor*> tensors_;
  size_t bytes_ = 0;
};

// Reads typed metadata with errors naming the file and the key.
class Keys {
 public:
  Keys(const GgufFiles& f, std::string prefix) : f_(f), prefix_(std::move(prefix)) {}

  const gguf::Value* find(const std::string& key) const { return f_.find(prefix_ + key); }
  // A count that may be stored per layer (an array): every layer must agree.
  std::optional<int64_t> count(const std::string& key) const {
    const gguf::Value* v = find(key);
    if (!v) return std::nullopt;
    try {
      if (v->is_array()) {
        const std::vector<int64_t> all = v->i64_array();
        if (all.empty()) fail("empty array");
        if (std::any_of(all.begin(), all.end(), [&](int64_t x) { return x != all.front(); })) {
          fail("{}{} differs between layers, which Infera does not support", prefix_, key);
        }
        return all.front();
      }
      return v->to_i64();
    } catch (const Error& e) {
      fail("{}: metadata '{}{}': {}", f_.path(), prefix_, key, e.what());
    }
  }
  int64_t required(const std::string& key) const {
    auto v = count(key);
    if (!v) fail("{}: GGUF metadata key '{}{}' is missing", f_.path(), prefix_, key);
    if (*v <= 0) fail("{}: GGUF metadata key '{}{}' must be positive, is {}", f_.path(), prefix_, key, *v);
    return *v;
  }
  std::optional<double> number(const std::string& key) const {
    const gguf::Value* v = find(key);
    if (!v) return std::nullopt;
    try {
      return v->to_f64();
    } catch (const Error& e) {
      fail("{}: metadata '{}{}': {}", f_.path(), prefix_, key, e.what());
    }
  }
  std::optional<std::string> string(const std::string& key) const {
    const gguf::Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type() != gguf::ValueType::kString)
      fail("{}: metadata '{}{}' must be a string, is {}", f_.path(), prefix_, key, v->describe());
    return v->str();
  }
  std::optional<bool> boolean(const std::string& key) const {
    const gguf::Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type() != gguf::ValueType::kBool)
      fail("{}: metadata '{}{}' must be a bool, is {}", f_.path(), prefix_, key, v->describe());
    return v->to_bool();
  }

 private:
  const GgufFiles& f_;
  std::string prefix_;
};

const char* type_name(gguf::GgmlType t) { return gguf::ggml_type_traits(t).name; }

DType plain_dtype(gguf::GgmlType t) {
  switch (t) {
    case gguf::GgmlType::kF32: return DType::kF32;
    case gguf::GgmlType::kF16: return DType::kF16;
    case gguf::GgmlType::kBF16: return DType::kBF16;
    default: return DType::kSentinel;
  }
}

// Row `row` of a GGUF tensor (rows of `cols` values, `row_bytes` each) as f32.
void read_row_f32(const gguf::Tensor& t, int64_t row, int64_t cols, int64_t row_bytes, float* dst) {
  const uint8_t* src = t.data + row * row_bytes;
  if (const DType plain = plain_dtype(t.type); plain != DType::kSentinel)
    to_f32(src, plain, cols, dst);
  else
    kernels::ggml::dequantize_row(static_cast<uint32_t>(t.type), src, dst, cols);
}

int64_t row_bytes_of(const gguf::Tensor& t, int64_t cols) {
  return static_cast<int64_t>(t.nbytes / std::max<uint64_t>(t.n_elements() / cols, 1));
}

void require_computable(const std::string& path, const gguf::Tensor& t) {
  if (plain_dtype(t.type) == DType::kSentinel && !kernels::ggml::can_dequantize(static_cast<uint32_t>(t.type))) {
    fail(
        "{}: tensor '{}' has type {}, which Infera cannot compute with (supported: F32, F16, BF16, Q4_0, Q4_1, "
        "Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)",
        path, t.name, type_name(t.type));
  }
}

std::string supported_gguf_archs() {
  std::string s;
  for (const ArchInfo& a : arch_registry()) {
    if (a.gguf_arch && a.runnable()) s += (s.empty() ? "" : ", ") + std::string(a.gguf_arch);
  }
  return s;
}

const ArchInfo& gguf_arch_row(const GgufFiles& f) {
  const gguf::Value* v = f.find("general.architecture");
  if (!v) fail("{}: GGUF metadata key 'general.architecture' is missing", f.path());
  if (v->type() != gguf::ValueType::kString) {
    fail("{}: general.architecture must be a string, is {}", f.path(), v->describe());
  }
  const std::string& arch = v->str();
  for (const ArchInfo& a : arch_registry()) {
    if (!a.gguf_arch || arch != a.gguf_arch) continue;
    if (!a.runnable()) {
      fail("{}: GGUF architecture '{}' ({}) cannot be run from a GGUF file yet (supported: {})", f.path(), arch,
           a.display_name, supported_gguf_archs());
    }
    return a;
  }
  fail("{}: GGUF architecture '{}' is not supported (supported: {})", f.path(), arch, supported_gguf_archs());
}

// Qwen3.5 hybrids (traits.hybrid): the Gated DeltaNet sizes (ssm.*), which layers are full
// attention, the shared expert and the MTP block (nextn_predict_layers).
void hybrid_keys(const GgufFiles& f, const Keys& k, const ArchInfo& row, json& j) {
  j["linear_conv_kernel_dim"] = k.required("ssm.conv_kernel");
  j["linear_key_head_dim"] = k.required("ssm.state_size");
  const int64_t hk = k.required("ssm.group_count"), hv = k.required("ssm.time_step_rank");
  j["linear_num_key_heads"] = hk;
  j["linear_num_value_heads"] = hv;
  const int64_t inner = k.required("ssm.inner_size");
  if (inner % hv != 0)
    fail("{}: {}.ssm.inner_size {} is not a multiple of ssm.time_step_rank {}", f.path(), row.gguf_arch, inner, hv);
  j["linear_value_head_dim"] = inner / hv;
  const int64_t layers = j["num_hidden_layers"].get<int64_t>();
  if (const gguf::Value* rec = k.find("attention.recurrent_layers"); rec && rec->is_array()) {
    // One flag per block (the MTP block last): the trunk's layers are the first ones.
    const std::vector<int64_t> flags = rec->i64_array();
    if (static_cast<int64_t>(flags.size()) < layers)
      fail("{}: {}.attention.recurrent_layers lists {} layers, block_count says {}", f.path(), row.gguf_arch,
           flags.size(), layers);
    json types = json::array();
    for (int64_t i = 0; i < layers; ++i) types.push_back(flags[i] ? "linear_attention" : "full_attention");
    j["layer_types"] = types;
  } else {
    j["full_attention_interval"] = k.required("full_attention_interval");
  }
  j["attn_output_gate"] = true;  // llama.cpp's Qwen3.5 attention is always gated
  if (auto shared = k.count("expert_shared_feed_forward_length")) j["shared_expert_intermediate_size"] = *shared;
  j["mtp_num_hidden_layers"] = k.count("nextn_predict_layers").value_or(0);
}

// DeepSeek (traits.mla): llama.cpp stores MLA as MQA over the latent (key_length
// kv_lora_rank + rope dims, value_length kv_lora_rank), the per-head widths as *_mla.
void mla_keys(const GgufFiles& f, const Keys& k, const ArchInfo& row, json& j) {
  const auto key_mla = k.count("attention.key_length_mla"), value_mla = k.count("attention.value_length_mla");
  if (!key_mla || !value_mla) {
    fail(
        "{}: {}.attention.key_length_mla / value_length_mla are missing: a GGUF written before llama.cpp split "
        "kv_b_proj into attn_k_b / attn_v_b, which Infera does not read (convert the model again)",
        f.path(), row.gguf_arch);
  }
  const int64_t rope = k.required("rope.dimension_count");
  if (*key_mla <= rope) fail("{}: key_length_mla {} leaves no non-rotary dims (rope {})", f.path(), *key_mla, rope);
  j["qk_rope_head_dim"] = rope;
  j["qk_nope_head_dim"] = *key_mla - rope;
  j["v_head_dim"] = *value_mla;
  j["kv_lora_rank"] = k.required("attention.kv_lora_rank");
  j["q_lora_rank"] = k.count("attention.q_lora_rank").value_or(0);
  j["num_key_value_heads"] = j["num_attention_heads"];  // head_count_kv 1 is the latent, not a head count
  j["first_k_dense_replace"] = k.count("leading_dense_block_count").value_or(0);
  j["num_nextn_predict_layers"] = k.count("nextn_predict_layers").value_or(0);
  if (k.count("expert_count").value_or(0) > 0) {
    j["n_routed_experts"] = k.required("expert_count");
    j["num_experts_per_tok"] = k.required("expert_used_count");
    j["moe_intermediate_size"] = k.required("expert_feed_forward_length");
    j["n_shared_experts"] = k.count("expert_shared_count").value_or(0);
    j["routed_scaling_factor"] = k.number("expert_weights_scale").value_or(1.0);
    j["norm_topk_prob"] = k.boolean("expert_weights_norm").value_or(false);  // llama.cpp's default
    // llama_expert_gating_func_type: 1 softmax (llama.cpp's default for DeepSeek-V2), 2 sigmoid.
    const int64_t gating = k.count("expert_gating_func").value_or(1);
    if (gating != 1 && gating != 2)
      fail("{}: {}.expert_gating_func {} is not supported (1 softmax, 2 sigmoid)", f.path(), row.gguf_arch, gating);
    j["scoring_func"] = gating == 2 ? "sigmoid" : "softmax";
    j["n_group"] = k.count("expert_group_count").value_or(1);
    j["topk_group"] = k.count("expert_group_used_count").value_or(1);
  }
  if (auto heads = k.count("attention.indexer.head_count"); heads && *heads > 0) {
    j["index_n_heads"] = *heads;
    j["index_head_dim"] = k.required("attention.indexer.key_length");
    j["index_topk"] = k.required("attention.indexer.top_k");
  }
}

// Whether the file tiles the Gated DeltaNet value heads (llama.cpp's qwen35 / qwen35moe, with more
// value than key heads; with as many, the tiled and grouped orders agree).
bool value_heads_tiled_in_file(const ModelConfig& c) {
  return arch_info(c.arch).traits.gguf_tiled_value_heads && c.linear_num_value_heads != c.linear_num_key_heads;
}

ModelConfig config_from(const GgufFiles& f) {
  const ArchInfo& row = gguf_arch_row(f);
  const Keys k(f, std::string(row.gguf_arch) + ".");
  const Keys tok(f, "tokenizer.ggml.");
  json j;
  j["model_type"] = std::string(row.model_types.front());
  j["hidden_size"] = k.required("embedding_length");
  // block_count counts the MTP blocks (nextn_predict_layers) after the trunk's.
  const int64_t blocks = k.required("block_count"), nextn = k.count("nextn_predict_layers").value_or(0);
  if (nextn < 0 || nextn >= blocks) {
    fail(
        "{}: {}.nextn_predict_layers {} must be at least 0 and below block_count {} (the MTP blocks follow the "
        "trunk's)",
        f.path(), row.gguf_arch, nextn, blocks);
  }
  j["num_hidden_layers"] = blocks - nextn;
  const int64_t heads = k.required("attention.head_count");
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = k.count("attention.head_count_kv").value_or(heads);
  if (auto head_dim = k.count("attention.key_length"); head_dim && !row.traits.mla) {
    j["head_dim"] = *head_dim;
    if (auto v = k.count("attention.value_length"); v && *v != *head_dim) {
      fail("{}: attention.key_length {} and value_length {} differ, which {} does not support", f.path(), *head_dim, *v,
           row.display_name);
    }
  }
  // The vocabulary: the key, else the tokenizer's size, else the embedding's rows.
  int64_t vocab = k.count("vocab_size").value_or(0);
  if (vocab <= 0) {
    if (const gguf::Value* tokens = tok.find("tokens"); tokens && tokens->is_array())
      vocab = static_cast<int64_t>(tokens->array_size());
  }
  if (vocab <= 0) {
    if (const gguf::Tensor* e = f.tensor("token_embd.weight"); e && e->ne.size() == 2)
      vocab = static_cast<int64_t>(e->ne[1]);
  }
  if (vocab <= 0)
    fail("{}: cannot tell the vocabulary size (no {}vocab_size, tokens or token_embd)", f.path(), row.gguf_arch);
  j["vocab_size"] = vocab;
  if (auto ctx = k.count("context_length")) j["max_position_embeddings"] = *ctx;
  if (auto ff = k.count("feed_forward_length"); ff && *ff > 0) j["intermediate_size"] = *ff;
  if (auto eps = k.number("attention.layer_norm_rms_epsilon"))
    j["rms_norm_eps"] = *eps;
  else
    fail("{}: GGUF metadata key '{}.attention.layer_norm_rms_epsilon' is missing", f.path(), row.gguf_arch);
  j["rope_theta"] = k.number("rope.freq_base").value_or(10000.0);
  if (auto rot = k.count("rope.dimension_count"); rot && !row.traits.mla) {
    const int64_t head_dim =
        j.contains("head_dim") ? j["head_dim"].get<int64_t>() : j["hidden_size"].get<int64_t>() / heads;
    // Always said: the hybrids' default (0.25) is not the whole head.
    if (*rot != head_dim || row.traits.hybrid)
      j["partial_rotary_factor"] = static_cast<double>(*rot) / static_cast<double>(head_dim);
  }
  if (auto type = k.string("rope.scaling.type"); type && *type != "none") {
    json s;
    if (*type == "linear") {
      s["type"] = "linear";
    } else if (*type == "yarn") {
      s["type"] = "yarn";
      if (auto orig = k.count("rope.scaling.original_context_length")) s["original_max_position_embeddings"] = *orig;
      if (auto b = k.number("rope.scaling.yarn_beta_fast")) s["beta_fast"] = *b;
      if (auto b = k.number("rope.scaling.yarn_beta_slow")) s["beta_slow"] = *b;
      if (row.traits.mla) {
        // llama.cpp's DeepSeek softmax scale is (1 + yarn_log_multiplier ln(factor))^2 and its
        // rope mscale cancels: HF's mscale = mscale_all_dim = yarn_log_multiplier / 0.1.
        const float mscale = static_cast<float>(k.number("rope.scaling.yarn_log_multiplier").value_or(0.0)) / 0.1f;
        s["mscale"] = mscale;
        s["mscale_all_dim"] = mscale;
      }
    } else {
      fail("{}: rope scaling type '{}' is not supported (supported: none, linear, yarn)", f.path(), *type);
    }
    const auto factor = k.number("rope.scaling.factor");
    if (!factor)
      fail("{}: {}.rope.scaling.type is '{}' but rope.scaling.factor is missing", f.path(), row.gguf_arch, *type);
    s["factor"] = *factor;
    j["rope_scaling"] = s;
  }
  j["tie_word_embeddings"] = f.tensor("output.weight") == nullptr;
  if (row.traits.mla) {
    mla_keys(f, k, row, j);
  } else if (k.count("expert_count").value_or(0) > 0) {
    j["num_experts"] = k.required("expert_count");
    j["num_experts_per_tok"] = k.required("expert_used_count");
    j["moe_intermediate_size"] = k.required("expert_feed_forward_length");
    // llama.cpp renormalises the top-k weights of qwen3moe; the key, when present, says so.
    j["norm_topk_prob"] = k.boolean("expert_weights_norm").value_or(true);
  }
  if (row.traits.hybrid) hybrid_keys(f, k, row, j);
  if (auto bos = tok.count("bos_token_id")) j["bos_token_id"] = *bos;
  // Generation ends at any of llama.cpp's end-of-generation ids the file names.
  json eos = json::array();
  for (const char* key : {"eos_token_id", "eot_token_id", "eom_token_id"}) {
    if (auto id = tok.count(key); id && *id >= 0 && *id < vocab && std::find(eos.begin(), eos.end(), *id) == eos.end())
      eos.push_back(*id);
  }
  if (!eos.empty()) j["eos_token_id"] = eos;
  ModelConfig cfg = parse_model_config(j, f.path());
  cfg.qk_rows_pairs_adjacent = arch_info(cfg.arch).traits.gguf_permuted_qk;
  cfg.gdn_value_heads_tiled = value_heads_tiled_in_file(cfg);
  if (const gguf::Tensor* t = f.tensor("rope_freqs.weight")) {
    // Llama 3 scaling as llama.cpp stores it: one divisor per rotated pair.
    const int64_t n = cfg.rope.rotary_dim / 2;
    if (t->n_elements() != static_cast<uint64_t>(n))
      fail("{}: rope_freqs.weight has {} values, the rotary dims need {}", f.path(), t->n_elements(), n);
    require_computable(f.path(), *t);
    cfg.rope.freq_factors.resize(static_cast<size_t>(n));
    read_row_f32(*t, 0, n, static_cast<int64_t>(t->nbytes), cfg.rope.freq_factors.data());
    for (float x : cfg.rope.freq_factors) {
      if (!(x > 0)) fail("{}: rope_freqs.weight holds {}; the factors must be positive", f.path(), x);
    }
  }
  return cfg;
}

// Owns what the store's tensors point into: the files and the converted copies.
struct GgufOwner {
  std::unique_ptr<GgufFiles> files;
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  uint8_t* allocate(size_t n) {
    buffers.push_back(std::make_unique_for_overwrite<uint8_t[]>(n));
    return buffers.back().get();
  }
};

// The expert index of a per-expert Hugging Face name ("...mlp.experts.5.up_proj.weight"), or -1.
int64_t expert_index(const std::string& name) {
  const size_t at = name.find(".experts.");
  if (at == std::string::npos) return -1;
  size_t pos = at + 9;
  int64_t e = 0;
  bool any = false;
  while (pos < name.size() && name[pos] >= '0' && name[pos] <= '9') {
    e = e * 10 + (name[pos++] - '0');
    any = true;
  }
  return any && pos < name.size() && name[pos] == '.' ? e : -1;
}

// llama: HF row of q/k within each head of `hd` rows, from the GGUF's adjacent-pair order.
// GGUF row 2i holds HF row i and GGUF row 2i + 1 holds HF row hd/2 + i.
int64_t unpermuted_source_row(int64_t hf_row, int64_t hd) {
  const int64_t head = hf_row / hd, r = hf_row % hd, half = hd / 2;
  return head * hd + (r < half ? 2 * r : 2 * (r - half) + 1);
}

// Qwen3.5's Gated DeltaNet value heads (GgufForm::kValueHeads, tensor_table.h): the GGUF
// index of Hugging Face index i along an axis of n rows (or elements, or columns) that ends
// in the value heads: runs of `width` per head (1 for the per-head vectors and gates, the
// value head dim otherwise); in_proj_qkv and conv1d start with the q and k channels, in place.
struct ValueHeads {
  int64_t offset = 0, width = 1, hk = 1, hv = 1;
  ValueHeads(const ModelConfig& c, int64_t n, int64_t unit = 1)
      : hk(c.linear_num_key_heads), hv(c.linear_num_value_heads) {
    const int64_t w = n == hv ? 1 : c.linear_value_head_dim;
    offset = (n - hv * w) / unit;
    width = w / unit;
  }
  int64_t gguf_index(int64_t i) const {
    if (i < offset) return i;
    const int64_t j = i - offset;
    return offset + tiled_value_head(j / width, hk, hv) * width + j % width;
  }
};

void require_ne(const std::string& path, const gguf::Tensor& t, std::vector<int64_t> want) {
  std::vector<int64_t> have(t.ne.begin(), t.ne.end());
  while (have.size() > want.size() && have.back() == 1) have.pop_back();
  while (want.size() > have.size() && want.back() == 1) want.pop_back();
  if (have != want) {
    fail("{}: tensor '{}' has ne {}, the metadata implies {}", path, t.name, shape_string(have), shape_string(want));
  }
}

// DeepSeek's kv_b_proj [nh (nope + V), R] from llama.cpp's attn_k_b (ne {nope, R, nh}: each
// head's k_nope rows transposed) and attn_v_b (ne {R, V, nh}), as f32.
void join_kv_b(const ModelConfig& c, const gguf::Tensor& k_b, const gguf::Tensor& v_b, float* out) {
  const int64_t nh = c.num_heads, R = c.kv_lora_rank, nope = c.qk_nope_head_dim, V = c.v_head_dim;
  const int64_t kvw = nope + V;
  std::vector<float> row(static_cast<size_t>(std::max(nope, R)));
  const int64_t k_row_bytes = row_bytes_of(k_b, nope), v_row_bytes = row_bytes_of(v_b, R);
  for (int64_t h = 0; h < nh; ++h) {
    for (int64_t r = 0; r < R; ++r) {
      read_row_f32(k_b, h * R + r, nope, k_row_bytes, row.data());
      for (int64_t j = 0; j < nope; ++j) out[(h * kvw + j) * R + r] = row[j];
    }
    for (int64_t j = 0; j < V; ++j) read_row_f32(v_b, h * V + j, R, v_row_bytes, out + (h * kvw + nope + j) * R);
  }
}

}  // namespace

bool is_gguf_path(const std::string& path) { return gguf::is_gguf_file(path); }

ModelConfig gguf_model_config(const std::string& path) {
  const GgufFiles files(path, false);
  return config_from(files);
}

namespace {

// The layout a GGUF presents to the tables: the text model under "model.", and experts per
// expert (views of the stacked *_exps tensors), whatever the architecture's checkpoints use.
// Qwen3-Next's GDN input projections: q | k | v and z split (attn_qkv, attn_gate), b and a
// still fused (ssm_ba): the table then has in_proj_qkv, in_proj_z, in_proj_b and in_proj_a.
bool gguf_layout_has(const std::string& name) {
  return name == "model.embed_tokens.weight" || name.ends_with(".mlp.experts.0.gate_proj.weight") ||
         name.ends_with(".linear_attn.in_proj_qkv.weight") || name.ends_with(".linear_attn.in_proj_z.weight");
}

// attn_k_b's sibling `name` (attn_v_b, attn_kv_b) in the same block.
std::string kv_b_sibling(const std::string& k_b, const char* name) {
  const size_t at = k_b.rfind("attn_k_b");
  return at == std::string::npos ? std::string() : std::string(k_b).replace(at, 8, name);
}

// Every tensor of the file must be one the model reads, as llama.cpp's loader requires: one
// left over means the metadata describes another network than the tensors hold (a
// block_count or nextn_predict_layers that disagrees with them), which would run, wrongly.
// Checked from the names alone, before any tensor is read or converted (a large file
// --no-mmap would otherwise be read whole first).
void check_no_leftovers(const std::string& path, const ModelConfig& cfg, const GgufFiles& f) {
  std::set<std::string> used = {"rope_freqs.weight"};  // (rope_freqs: read by config_from)
  for (const TensorSpec& spec : tensor_table(cfg, gguf_layout_has)) {
    used.insert(spec.gguf);
    if (spec.gguf_form == GgufForm::kKvBSplit) {
      used.insert(kv_b_sibling(spec.gguf, "attn_v_b"));
      // Some converters (ik_llama.cpp's) keep the unsplit attn_kv_b beside attn_k_b /
      // attn_v_b: the same weights again, left unread rather than refused.
      used.insert(kv_b_sibling(spec.gguf, "attn_kv_b"));
    }
  }
  std::vector<std::string> unused;
  for (const auto& [name, t] : f.tensors()) {
    if (!used.contains(name)) unused.push_back(name);
  }
  if (!unused.empty()) {
    fail(
        "{}: {} GGUF tensor{} not part of the {} model the metadata describes ({} layers{}), e.g. '{}': the "
        "metadata and the tensors disagree",
        path, unused.size(), unused.size() == 1 ? " is" : "s are", arch_info(cfg.arch).display_name, cfg.num_layers,
        cfg.num_mtp_layers() > 0 ? fmt::format(" + {} MTP", cfg.num_mtp_layers()) : "", unused.front());
  }
}

// Binds (or, with `summary`, only checks) every tensor of the table.
WeightStore bind_gguf(const std::string& path, const ModelConfig& cfg, bool load_into_memory,
                      GgufWeightsSummary* summary, LoadProgress* progress = nullptr) {
  // (read into memory: the names are checked on the mapped files first, before the reading)
  if (load_into_memory) check_no_leftovers(path, cfg, GgufFiles(path, false));
  auto owner = std::make_shared<GgufOwner>();
  owner->files = std::make_unique<GgufFiles>(path, load_into_memory, progress);
  const GgufFiles& f = *owner->files;
  if (!load_into_memory) check_no_leftovers(path, cfg, f);
  // "converting": the bound tensors' bytes (a little less than the files').
  if (progress) progress->begin("converting", static_cast<int64_t>(f.bytes()));
  std::set<std::string> counted;  // GGUF tensors summarised
  // llama.cpp's llama q / k rows (rotary pairs adjacent) stay as stored, views of the file like
  // every other matrix, where the config says so (ModelConfig::qk_rows_pairs_adjacent, set by
  // gguf_model_config: the model puts q and k back in Hugging Face's order). A copy in that
  // order stayed resident beside the panels packed from it, and kept the file's pages it read.
  const bool unpermute_qk = arch_info(cfg.arch).traits.gguf_permuted_qk;
  std::map<std::string, size_t> converted;  // ggml type -> bytes dequantized to f32
  // The file pages a copy (rows moved, or converted to f32) read are given back after it:
  // nothing reads them again, and they would stay in the resident set (a mapping's dropped, a
  // file read into memory's mapped back: release_file_pages).
  const FileMappings maps = summary ? FileMappings{} : FileMappings::current();
  std::vector<TensorInfo> out;
  for (const TensorSpec& spec : tensor_table(cfg, gguf_layout_has)) {
    if (spec.gguf.empty()) fail("{}: tensor '{}' has no GGUF counterpart in Infera's tables", path, spec.name);
    const gguf::Tensor* t = f.tensor(spec.gguf);
    if (!t) {
      if (spec.mtp) continue;
      fail("{}: GGUF tensor '{}' is missing (Infera's '{}')", path, spec.gguf, spec.name);
    }
    const GgufForm form = spec.gguf_form;
    const int64_t cols = spec.shape.back();
    const int64_t rows = spec.numel() / std::max<int64_t>(cols, 1);
    // Shapes: a GGUF ne is the Hugging Face shape reversed; a stacked expert tensor has the
    // expert count outermost.
    const int64_t e = spec.role == WeightRole::kExpert && spec.shape.size() == 2 ? expert_index(spec.name) : -1;
    const gguf::Tensor* v_b = nullptr;  // kKvBSplit: the V half
    if (form == GgufForm::kKvBSplit) {
      const std::string v_name = kv_b_sibling(spec.gguf, "attn_v_b");
      if (v_name.empty()) fail("{}: '{}' is not an attn_k_b tensor", path, spec.gguf);
      v_b = f.tensor(v_name);
      if (!v_b) fail("{}: GGUF tensor '{}' is missing (the V half of Infera's '{}')", path, v_name, spec.name);
      require_ne(path, *t, {cfg.qk_nope_head_dim, cfg.kv_lora_rank, cfg.num_heads});
      require_ne(path, *v_b, {cfg.kv_lora_rank, cfg.v_head_dim, cfg.num_heads});
      require_computable(path, *v_b);
    } else if (form == GgufForm::kConv) {
      require_ne(path, *t, {cols, rows});  // [C, 1, K] stored as ne {K, C}
    } else if (form == GgufForm::kBaHalf) {
      require_ne(path, *t, {cols, 2 * rows});  // in_proj_b / in_proj_a: half of ssm_ba's rows
    } else if (form == GgufForm::kQkvzSplit) {
      fail("{}: '{}' is a fused Qwen3-Next projection, which GGUF files store split", path, spec.name);
    } else {
      std::vector<int64_t> want(spec.shape.rbegin(), spec.shape.rend());
      if (e >= 0) want.push_back(cfg.num_experts);
      require_ne(path, *t, want);
    }
    require_computable(path, *t);
    const uint32_t type = static_cast<uint32_t>(t->type);
    const int64_t row_bytes = form == GgufForm::kKvBSplit ? 0 : row_bytes_of(*t, cols);
    const uint8_t* src = t->data + (e >= 0 ? e * rows * row_bytes : 0);
    const bool is_q = spec.name.ends_with("self_attn.q_proj.weight");
    const bool is_k = spec.name.ends_with("self_attn.k_proj.weight");
    const bool permute = unpermute_qk && (is_q || is_k) && !cfg.qk_rows_pairs_adjacent;
    // Tiled value heads move back (nothing moves when key and value heads are as many), in the
    // vectors and conv channels; the projection matrices only where the config does not say the
    // layer takes them tiled (ModelConfig::gdn_value_heads_tiled: views of the file then).
    const bool value_heads = value_heads_tiled_in_file(cfg);
    const bool move_matrices = value_heads && !cfg.gdn_value_heads_tiled;
    // Which row of the GGUF holds each row of the Hugging Face tensor.
    std::function<int64_t(int64_t)> row_from;
    if (permute) {
      row_from = [&cfg](int64_t r) { return unpermuted_source_row(r, cfg.head_dim); };
    } else if (form == GgufForm::kValueHeads && spec.shape.size() >= 2) {
      if (move_matrices) row_from = [vh = ValueHeads(cfg, rows)](int64_t r) { return vh.gguf_index(r); };
    } else if (form == GgufForm::kConv) {
      if (value_heads) row_from = [vh = ValueHeads(cfg, rows)](int64_t r) { return vh.gguf_index(r); };
    } else if (form == GgufForm::kBaHalf) {
      // Value head h of key-head group g = h / r is row g 2r + j (b) or g 2r + r + j (a).
      const int64_t r = cfg.linear_num_value_heads / cfg.linear_num_key_heads;
      const int64_t half = spec.slot == "gdn_a" ? r : 0;
      row_from = [r, half](int64_t h) { return (h / r) * 2 * r + half + h % r; };
    }

    const DType plain = plain_dtype(t->type);
    const bool blocks = plain == DType::kSentinel && spec.shape.size() >= 2 && kernels::ggml::has_matmul(type);
    // out_proj's value-head columns move in the stored encoding when each head is whole blocks.
    const int64_t unit = plain != DType::kSentinel ? 1 : kernels::ggml::block_size(type);
    const bool col_perm = form == GgufForm::kValueHeadColumns && move_matrices;
    const bool keep = (plain != DType::kSentinel || blocks) && !(col_perm && cfg.linear_value_head_dim % unit != 0) &&
                      (form == GgufForm::kAsIs || form == GgufForm::kValueHeadColumns || form == GgufForm::kBaHalf ||
                       (form == GgufForm::kValueHeads && spec.shape.size() >= 2) || form == GgufForm::kConv);
    if (summary) {
      summary->parameters += rows * cols;
      summary->resident_bytes += keep ? rows * row_bytes : rows * cols * 4;
      const bool first = counted.insert(t->name).second;
      // (a group leaves the MTP head out: it never splits those)
      if (first && keep && blocks && !spec.mtp &&
          (spec.split == TpSplit::kColumns || (spec.split == TpSplit::kExperts && spec.slot == "ffn_down_exps")))
        summary->column_splits.push_back({spec.gguf, spec.slot, cols, type});
      for (const gguf::Tensor* x : {t, v_b}) {
        if (x && (x == t ? first : counted.insert(x->name).second)) {
          ++summary->tensors;
          ++summary->types[type_name(x->type)];
        }
      }
      continue;
    }
    TensorInfo info;
    info.name = spec.name;
    info.shape = spec.shape;
    info.file = spec.gguf;
    if (keep) {
      // Matrices of llama.cpp's block types stay in their blocks (the kernels compute with
      // them as llama.cpp does).
      info.dtype = blocks ? DType::kGgml : plain;
      info.ggml_type = blocks ? type : 0;
      info.nbytes = static_cast<size_t>(rows * row_bytes);
      if (!row_from && !col_perm) {
        info.data = src;
      } else {
        uint8_t* dst = owner->allocate(info.nbytes);
        const int64_t units = cols / unit, unit_bytes = row_bytes / units;
        const ValueHeads vh(cfg, cols, unit);
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* from = src + (row_from ? row_from(r) : r) * row_bytes;
          uint8_t* to = dst + r * row_bytes;
          if (!col_perm) {
            std::memcpy(to, from, static_cast<size_t>(row_bytes));
            continue;
          }
          for (int64_t u = 0; u < units; ++u)
            std::memcpy(to + u * unit_bytes, from + vh.gguf_index(u) * unit_bytes, static_cast<size_t>(unit_bytes));
        }
        info.data = dst;
        release_file_pages(src, static_cast<size_t>(rows * row_bytes), maps);
      }
    } else {
      // f32: vectors of block types (never seen in practice), the transformed vectors, kv_b,
      // and out_proj columns whose heads split a block.
      info.dtype = DType::kF32;
      info.nbytes = static_cast<size_t>(rows * cols) * sizeof(float);
      auto* dst = reinterpret_cast<float*>(owner->allocate(info.nbytes));
      if (form == GgufForm::kKvBSplit) {
        join_kv_b(cfg, *t, *v_b, dst);
      } else {
        std::vector<float> row(static_cast<size_t>(cols));
        const ValueHeads vh(cfg, cols);
        const bool per_element =
            spec.shape.size() == 1 && value_heads && (form == GgufForm::kValueHeads || form == GgufForm::kNegExp);
        for (int64_t r = 0; r < rows; ++r) {
          float* d = dst + r * cols;
          read_row_f32(*t, (row_from ? row_from(r) : r) + (e >= 0 ? e * rows : 0), cols, row_bytes,
                       col_perm || per_element ? row.data() : d);
          if (col_perm || per_element) {
            for (int64_t i = 0; i < cols; ++i) d[i] = row[vh.gguf_index(i)];
          }
          for (int64_t i = 0; i < cols && form == GgufForm::kPlusOne; ++i) d[i] -= 1.0f;
          for (int64_t i = 0; i < cols && form == GgufForm::kNegExp; ++i) d[i] = std::log(-d[i]);
        }
      }
      info.data = reinterpret_cast<const uint8_t*>(dst);
      if (plain == DType::kSentinel) converted[type_name(t->type)] += info.nbytes;
      if (form == GgufForm::kKvBSplit) {
        for (const gguf::Tensor* x : {t, v_b}) release_file_pages(x->data, static_cast<size_t>(x->nbytes), maps);
      } else {
        release_file_pages(src, static_cast<size_t>(rows * row_bytes), maps);
      }
    }
    out.push_back(std::move(info));
    if (progress) progress->advance(rows * row_bytes);
  }
  if (progress) progress->end();
  for (const auto& [type, bytes] : converted) {
    LOG_INFO("{}: {} tensors dequantized to f32 at load ({:.1f} MiB)", path, type, bytes / 1048576.0);
  }
  const size_t bytes = f.bytes();
  if (summary) summary->file_bytes = static_cast<int64_t>(bytes);
  return WeightStore::from_tensors(path, std::move(out), std::move(owner), bytes);
}

}  // namespace

WeightStore open_gguf_weights(const std::string& path, const ModelConfig& cfg, bool load_into_memory,
                              LoadProgress* progress) {
  return bind_gguf(path, cfg, load_into_memory, nullptr, progress);
}

GgufWeightsSummary inspect_gguf_weights(const std::string& path, const ModelConfig& cfg) {
  GgufWeightsSummary summary;
  bind_gguf(path, cfg, false, &summary);
  return summary;
}

}  // namespace infera
