#include "infera/model/gguf_loader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
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
#include "infera/model/tensor_table.h"

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

std::string supported_gguf_archs() {
  std::string s;
  for (const ArchInfo& a : arch_registry()) {
    if (a.gguf_arch && a.runnable() && !a.traits.hybrid) s += (s.empty() ? "" : ", ") + std::string(a.gguf_arch);
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
    if (!a.runnable() || a.traits.hybrid) {
      fail("{}: GGUF architecture '{}' ({}) cannot be run from a GGUF file yet (supported: {})", f.path(), arch,
           a.display_name, supported_gguf_archs());
    }
    return a;
  }
  fail("{}: GGUF architecture '{}' is not supported (supported: {})", f.path(), arch, supported_gguf_archs());
}

ModelConfig config_from(const GgufFiles& f) {
  const ArchInfo& row = gguf_arch_row(f);
  const Keys k(f, std::string(row.gguf_arch) + ".");
  const Keys tok(f, "tokenizer.ggml.");
  json j;
  j["model_type"] = std::string(row.model_types.front());
  j["hidden_size"] = k.required("embedding_length");
  j["num_hidden_layers"] = k.required("block_count") - k.count("nextn_predict_layers").value_or(0);
  const int64_t heads = k.required("attention.head_count");
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = k.count("attention.head_count_kv").value_or(heads);
  if (auto head_dim = k.count("attention.key_length")) {
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
  if (auto rot = k.count("rope.dimension_count")) {
    const int64_t head_dim =
        j.contains("head_dim") ? j["head_dim"].get<int64_t>() : j["hidden_size"].get<int64_t>() / heads;
    if (*rot != head_dim) j["partial_rotary_factor"] = static_cast<double>(*rot) / static_cast<double>(head_dim);
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
    } else {
      fail("{}: rope scaling type '{}' is not supported (supported: none, linear, yarn)", f.path(), *type);
    }
    const auto factor = k.number("rope.scaling.factor");
    if (!factor)
      fail("{}: {}.rope.scaling.type is '{}' but rope.scaling.factor is missing", f.path(), row.gguf_arch, *type);
    s["factor"] = *factor;
    j["rope_scaling"] = s;
  }
  if (f.tensor("rope_freqs.weight")) {
    fail("{}: rope_freqs.weight (Llama 3 rope scaling stored as per-frequency factors) is not supported yet", f.path());
  }
  j["tie_word_embeddings"] = f.tensor("output.weight") == nullptr;
  if (k.count("expert_count").value_or(0) > 0) {
    j["num_experts"] = k.required("expert_count");
    j["num_experts_per_tok"] = k.required("expert_used_count");
    j["moe_intermediate_size"] = k.required("expert_feed_forward_length");
    // llama.cpp renormalises the top-k weights of qwen3moe; the key, when present, says so.
    j["norm_topk_prob"] = k.boolean("expert_weights_norm").value_or(true);
  }
  if (auto bos = tok.count("bos_token_id")) j["bos_token_id"] = *bos;
  // Generation ends at any of llama.cpp's end-of-generation ids the file names.
  json eos = json::array();
  for (const char* key : {"eos_token_id", "eot_token_id", "eom_token_id"}) {
    if (auto id = tok.count(key); id && *id >= 0 && *id < vocab && std::find(eos.begin(), eos.end(), *id) == eos.end())
      eos.push_back(*id);
  }
  if (!eos.empty()) j["eos_token_id"] = eos;
  return parse_model_config(j, f.path());
}

const char* type_name(gguf::GgmlType t) { return gguf::ggml_type_traits(t).name; }

DType plain_dtype(gguf::GgmlType t) {
  switch (t) {
    case gguf::GgmlType::kF32: return DType::kF32;
    case gguf::GgmlType::kF16: return DType::kF16;
    case gguf::GgmlType::kBF16: return DType::kBF16;
    default: return DType::kSentinel;
  }
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

}  // namespace

bool is_gguf_path(const std::string& path) {
  std::error_code ec;
  return std::string_view(path).ends_with(".gguf") && std::filesystem::is_regular_file(path, ec);
}

ModelConfig gguf_model_config(const std::string& path) {
  const GgufFiles files(path, false);
  return config_from(files);
}

namespace {

// Binds (or, with `summary`, only checks) every tensor of the table.
WeightStore bind_gguf(const std::string& path, const ModelConfig& cfg, bool load_into_memory,
                      GgufWeightsSummary* summary, LoadProgress* progress = nullptr) {
  auto owner = std::make_shared<GgufOwner>();
  owner->files = std::make_unique<GgufFiles>(path, load_into_memory, progress);
  const GgufFiles& f = *owner->files;
  // "converting": the bound tensors' bytes (a little less than the files').
  if (progress) progress->begin("converting", static_cast<int64_t>(f.bytes()));
  std::set<std::string> counted;  // GGUF tensors summarised
  const bool unpermute_qk = arch_info(cfg.arch).traits.gguf_permuted_qk;
  std::map<std::string, size_t> converted;  // ggml type -> bytes dequantized to f32
  std::vector<TensorInfo> out;
  for (const TensorSpec& spec : tensor_table(cfg)) {
    if (spec.gguf.empty()) fail("{}: tensor '{}' has no GGUF counterpart in Infera's tables", path, spec.name);
    const gguf::Tensor* t = f.tensor(spec.gguf);
    if (!t) {
      if (spec.mtp) continue;
      fail("{}: GGUF tensor '{}' is missing (Infera's '{}')", path, spec.gguf, spec.name);
    }
    // Shapes: a GGUF ne is the Hugging Face shape reversed; a stacked expert tensor has the
    // expert count outermost.
    const int64_t e = spec.role == WeightRole::kExpert && spec.shape.size() == 2 ? expert_index(spec.name) : -1;
    std::vector<int64_t> want(spec.shape.rbegin(), spec.shape.rend());
    if (e >= 0) want.push_back(cfg.num_experts);
    std::vector<int64_t> have(t->ne.begin(), t->ne.end());
    while (have.size() > want.size() && have.back() == 1) have.pop_back();
    while (want.size() > have.size() && want.back() == 1) want.pop_back();
    if (have != want) {
      fail("{}: tensor '{}' has ne {}, the metadata implies {}", path, t->name, shape_string(have), shape_string(want));
    }
    const int64_t cols = spec.shape.back();
    const int64_t rows = spec.numel() / std::max<int64_t>(cols, 1);
    const uint32_t type = static_cast<uint32_t>(t->type);
    const int64_t row_bytes = static_cast<int64_t>(t->nbytes / std::max<uint64_t>(t->n_elements() / cols, 1));
    const uint8_t* src = t->data + (e >= 0 ? e * rows * row_bytes : 0);
    const bool is_q = spec.name.ends_with("self_attn.q_proj.weight");
    const bool is_k = spec.name.ends_with("self_attn.k_proj.weight");
    const bool permute = unpermute_qk && (is_q || is_k);

    const DType plain = plain_dtype(t->type);
    if (plain == DType::kSentinel && !kernels::ggml::can_dequantize(type)) {
      fail(
          "{}: tensor '{}' has type {}, which Infera cannot compute with (supported: F32, F16, BF16, Q4_0, Q4_1, "
          "Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)",
          path, t->name, type_name(t->type));
    }
    if (summary) {
      summary->parameters += rows * cols;
      const bool as_f32 = plain == DType::kSentinel && (spec.shape.size() < 2 || !kernels::ggml::has_matmul(type));
      summary->resident_bytes += as_f32 ? rows * cols * 4 : rows * row_bytes;
      if (counted.insert(t->name).second) {
        ++summary->tensors;
        ++summary->types[type_name(t->type)];
      }
      continue;
    }
    TensorInfo info;
    info.name = spec.name;
    info.shape = spec.shape;
    info.file = spec.gguf;
    // Matrices of llama.cpp's block types stay in their blocks (the kernels compute with
    // them as llama.cpp does); vectors of them, never seen in practice, become f32.
    const bool blocks = plain == DType::kSentinel && spec.shape.size() >= 2 && kernels::ggml::has_matmul(type);
    if (plain != DType::kSentinel || blocks) {
      info.dtype = blocks ? DType::kGgml : plain;
      info.ggml_type = blocks ? type : 0;
      info.nbytes = static_cast<size_t>(rows * row_bytes);
      if (!permute) {
        info.data = src;
      } else {
        uint8_t* dst = owner->allocate(info.nbytes);
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(dst + r * row_bytes, src + unpermuted_source_row(r, cfg.head_dim) * row_bytes,
                      static_cast<size_t>(row_bytes));
        }
        info.data = dst;
      }
    } else {
      info.dtype = DType::kF32;
      info.nbytes = static_cast<size_t>(rows * cols) * sizeof(float);
      auto* dst = reinterpret_cast<float*>(owner->allocate(info.nbytes));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t from = permute ? unpermuted_source_row(r, cfg.head_dim) : r;
        kernels::ggml::dequantize_row(type, src + from * row_bytes, dst + r * cols, cols);
      }
      info.data = reinterpret_cast<const uint8_t*>(dst);
      converted[type_name(t->type)] += info.nbytes;
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
