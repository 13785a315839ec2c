#include "infera/model/gguf_export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/io/safetensors.h"
#include "infera/model/config.h"
#include "infera/tensor/dtype.h"
#include "infera/tokenizer/tokenizer.h"

namespace infera {

namespace fs = std::filesystem;
using gguf::GgmlType;
using gguf::Value;
using gguf::ValueType;
using json = nlohmann::json;

namespace {

// ---- names as data: HF -> llama.cpp (llama-arch.cpp's LLM_TENSOR_NAMES) ----

struct NameRule {
  std::string_view hf;
  std::string_view gguf;
};

constexpr NameRule kGlobalNames[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

// Per block, in the order the GGUF lists them ("model.layers.N." + hf -> "blk.N." + gguf).
constexpr NameRule kBlockNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},  // qwen3
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},  // qwen3
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

bool is_qk_norm_rule(const NameRule& r) { return r.hf.find("_norm.weight") != std::string_view::npos && r.hf.starts_with("self_attn."); }

// llama.cpp token types (llama_token_type / gguf TokenType).
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// general.file_type (llama_ftype).
uint32_t file_type_of(GgufOutType t) {
  switch (t) {
    case GgufOutType::kF32: return 0;   // ALL_F32
    case GgufOutType::kF16: return 1;   // MOSTLY_F16
    case GgufOutType::kBF16: return 32; // MOSTLY_BF16
  }
  return 0;
}

GgmlType ggml_type_of(GgufOutType t) {
  switch (t) {
    case GgufOutType::kF32: return GgmlType::kF32;
    case GgufOutType::kF16: return GgmlType::kF16;
    case GgufOutType::kBF16: return GgmlType::kBF16;
  }
  return GgmlType::kF32;
}

std::optional<GgmlType> ggml_type_of(DType t) {
  switch (t) {
    case DType::kF32: return GgmlType::kF32;
    case DType::kF16: return GgmlType::kF16;
    case DType::kBF16: return GgmlType::kBF16;
    default: return std::nullopt;
  }
}

json read_json_file(const fs::path& path) {
  std::ifstream f(path);
  if (!f) fail("{}: cannot open", path.string());
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", path.string(), e.what());
  }
}

// ---- tensor data: dtype conversion and the llama q/k row permutation ----

void row_to_f32(const uint8_t* src, DType dtype, size_t n, float* out) {
  switch (dtype) {
    case DType::kF32: std::memcpy(out, src, n * 4); return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      return;
    default: INFERA_ASSERT(false, "unsupported source dtype");
  }
}

// One GGUF tensor to write: where its bytes come from and how they are transformed.
struct ExportTensor {
  std::string name;
  const TensorInfo* src = nullptr;  // nullptr: `values` holds the (F32) data
  std::vector<float> values;
  GgmlType type = GgmlType::kF32;
  int64_t rows = 1, cols = 1;  // src viewed as [rows, cols]
  bool one_dim = false;        // a vector: ne = {cols}
  int permute_heads = 0;       // > 0: undo HF's rotate_half row order within each of this many heads

  // GGUF dims, innermost first: a [rows, cols] matrix is ne = {cols, rows}.
  std::vector<uint64_t> ne() const {
    if (one_dim) return {static_cast<uint64_t>(cols)};
    return {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
  }
};

// GGUF row r -> HF row. HF (rotate_half) puts pair element k of pair j of head h at row
// h*hd + k*hd/2 + j; llama.cpp's NORM rope wants it at h*hd + 2j + k
// (convert_hf_to_gguf.py LlamaModel.permute).
int64_t source_row(const ExportTensor& t, int64_t r) {
  if (t.permute_heads == 0) return r;
  const int64_t hd = t.rows / t.permute_heads;
  const int64_t h = r / hd, i = r % hd, j = i / 2, k = i % 2;
  return h * hd + k * (hd / 2) + j;
}

void stream_tensor(const ExportTensor& t, gguf::ByteSink& out) {
  if (!t.src) {
    out.write(t.values.data(), t.values.size() * sizeof(float));
    return;
  }
  const DType sdt = t.src->dtype;
  const size_t esize = dtype_size(sdt);
  const size_t row_bytes = static_cast<size_t>(t.cols) * esize;
  if (ggml_type_of(sdt) == t.type && t.permute_heads == 0) {
    out.write(t.src->data, t.src->nbytes);  // same encoding: copy straight from the mapping
    return;
  }
  std::vector<float> f32(static_cast<size_t>(t.cols));
  std::vector<uint16_t> half(t.type == GgmlType::kF32 ? 0 : static_cast<size_t>(t.cols));
  for (int64_t r = 0; r < t.rows; ++r) {
    const uint8_t* src_row = t.src->data + static_cast<size_t>(source_row(t, r)) * row_bytes;
    if (ggml_type_of(sdt) == t.type) {
      out.write(src_row, row_bytes);
      continue;
    }
    row_to_f32(src_row, sdt, f32.size(), f32.data());
    switch (t.type) {
      case GgmlType::kF32: out.write(f32.data(), f32.size() * 4); break;
      case GgmlType::kF16:
        for (size_t i = 0; i < f32.size(); ++i) half[i] = f32_to_f16(f32[i]);
        out.write(half.data(), half.size() * 2);
        break;
      case GgmlType::kBF16:
        for (size_t i = 0; i < f32.size(); ++i) half[i] = f32_to_bf16(f32[i]);
        out.write(half.data(), half.size() * 2);
        break;
      default: INFERA_ASSERT(false, "unsupported output type");
    }
  }
}

// ---- hyperparameters ----

void add_hparams(gguf::Writer& w, const ModelConfig& c, const std::string& arch, const std::string& name,
                 GgufOutType out_type) {
  w.set("general.architecture", Value::string(arch));
  w.set("general.type", Value::string("model"));
  w.set("general.name", Value::string(name));
  w.set("general.file_type", Value::u32(file_type_of(out_type)));
  w.set("general.quantization_version", Value::u32(2));  // GGML_QNT_VERSION, written by every llama.cpp converter
  const std::string p = arch + ".";
  w.set(p + "vocab_size", Value::u32(static_cast<uint32_t>(c.vocab_size)));
  w.set(p + "context_length", Value::u32(static_cast<uint32_t>(c.max_position_embeddings)));
  w.set(p + "embedding_length", Value::u32(static_cast<uint32_t>(c.hidden_size)));
  w.set(p + "block_count", Value::u32(static_cast<uint32_t>(c.num_layers)));
  w.set(p + "feed_forward_length", Value::u32(static_cast<uint32_t>(c.intermediate_size)));
  w.set(p + "rope.dimension_count", Value::u32(static_cast<uint32_t>(c.rope.rotary_dim)));
  w.set(p + "rope.freq_base", Value::f32(c.rope.theta));
  w.set(p + "attention.head_count", Value::u32(static_cast<uint32_t>(c.num_heads)));
  w.set(p + "attention.head_count_kv", Value::u32(static_cast<uint32_t>(c.num_kv_heads)));
  w.set(p + "attention.key_length", Value::u32(static_cast<uint32_t>(c.head_dim)));
  w.set(p + "attention.value_length", Value::u32(static_cast<uint32_t>(c.head_dim)));
  w.set(p + "attention.layer_norm_rms_epsilon", Value::f32(c.rms_norm_eps));
  switch (c.rope.scaling) {
    case RopeScaling::kNone:
    case RopeScaling::kLlama3:  // carried by the rope_freqs.weight tensor instead
      break;
    case RopeScaling::kLinear:
      w.set(p + "rope.scaling.type", Value::string("linear"));
      w.set(p + "rope.scaling.factor", Value::f32(c.rope.factor));
      break;
    case RopeScaling::kYarn:
      w.set(p + "rope.scaling.type", Value::string("yarn"));
      w.set(p + "rope.scaling.factor", Value::f32(c.rope.factor));
      w.set(p + "rope.scaling.original_context_length", Value::u32(static_cast<uint32_t>(c.rope.original_max_position)));
      w.set(p + "rope.scaling.yarn_beta_fast", Value::f32(c.rope.beta_fast));
      w.set(p + "rope.scaling.yarn_beta_slow", Value::f32(c.rope.beta_slow));
      // llama.cpp derives 0.1 ln(factor) + 1 itself when this key is absent; write it only
      // when config.json sets attention_factor explicitly (as convert_hf_to_gguf.py does).
      break;
  }
}

// ---- tokenizer ----

std::optional<std::string> token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

bool is_byte_token(std::string_view t) {
  auto hex = [](char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'A' && ch <= 'F') || (ch >= 'a' && ch <= 'f'); };
  return t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && hex(t[3]) && hex(t[4]);
}

// SentencePiece's "add dummy prefix": a Prepend("▁") normalizer or a Metaspace
// pre-tokenizer that prepends.
bool adds_space_prefix(const json& tok) {
  bool found = false;
  auto visit = [&](const json& node, auto&& self) -> void {
    if (!node.is_object()) return;
    const std::string type = node.value("type", "");
    if (type == "Prepend" && node.value("prepend", "") == "▁") found = true;
    if (type == "Metaspace") {
      const std::string scheme = node.value("prepend_scheme", node.value("add_prefix_space", true) ? "always" : "never");
      if (scheme != "never") found = true;
    }
    for (const char* key : {"normalizers", "pretokenizers"}) {
      if (node.contains(key) && node[key].is_array()) {
        for (const json& child : node[key]) self(child, self);
      }
    }
  };
  if (tok.contains("normalizer")) visit(tok["normalizer"], visit);
  if (tok.contains("pre_tokenizer")) visit(tok["pre_tokenizer"], visit);
  return found;
}

void add_tokenizer(gguf::Writer& w, const ModelConfig& c, const fs::path& dir) {
  const Tokenizer tok = Tokenizer::load(dir.string());
  const json tok_json = read_json_file(dir / "tokenizer.json");
  const fs::path config_path = dir / "tokenizer_config.json";
  const json tok_config = fs::exists(config_path) ? read_json_file(config_path) : json::object();

  const int32_t n_tok = tok.vocab_size();
  if (n_tok > c.vocab_size) {
    fail("{}: the tokenizer has {} tokens but config.json vocab_size is {}; the embedding cannot cover them",
         dir.string(), n_tok, c.vocab_size);
  }
  // Added tokens (tokenizer.json "added_tokens") keep their special flag.
  std::vector<int8_t> added(static_cast<size_t>(c.vocab_size), 0);
  if (tok_json.contains("added_tokens") && tok_json["added_tokens"].is_array()) {
    for (const json& a : tok_json["added_tokens"]) {
      const int64_t id = a.value("id", int64_t{-1});
      if (id >= 0 && id < c.vocab_size) added[static_cast<size_t>(id)] = 1;
    }
  }
  std::optional<std::string> unk;
  if (tok_json.contains("model") && tok_json["model"].contains("unk_token")) unk = token_content(tok_json["model"]["unk_token"]);
  const bool spm = tok.kind() == Tokenizer::Kind::kSentencePieceBpe;

  std::vector<std::string> tokens(static_cast<size_t>(c.vocab_size));
  std::vector<float> scores(static_cast<size_t>(c.vocab_size), 0.0f);
  std::vector<int32_t> types(static_cast<size_t>(c.vocab_size), kNormal);
  int normal_rank = 0;
  for (int32_t id = 0; id < c.vocab_size; ++id) {
    const size_t i = static_cast<size_t>(id);
    const std::string_view text = id < n_tok ? tok.token_text(id) : std::string_view{};
    if (text.empty()) {
      // Unused ids (config vocab larger than the tokenizer), named as llama.cpp's converter names them.
      tokens[i] = "[PAD" + std::to_string(id) + "]";
      types[i] = kUnused;
      scores[i] = spm ? -1000.0f : 0.0f;
      continue;
    }
    tokens[i] = std::string(text);
    if (unk && text == *unk) {
      types[i] = kUnknown;
    } else if (tok.is_special(id)) {
      types[i] = kControl;
    } else if (added[i]) {
      types[i] = text.starts_with("<|") && text.ends_with("|>") ? kControl : kUserDefined;
    } else if (spm && is_byte_token(text)) {
      types[i] = kByte;
    } else if (spm) {
      // SentencePiece BPE scores are -(rank of the piece): ids of an SP-derived
      // tokenizer.json are in that order, and merge priority follows it.
      scores[i] = -static_cast<float>(normal_rank++);
    }
  }

  if (spm) {
    w.set("tokenizer.ggml.model", Value::string("llama"));
    w.set("tokenizer.ggml.pre", Value::string("default"));
    w.set("tokenizer.ggml.tokens", Value::string_array(std::move(tokens)));
    w.set("tokenizer.ggml.scores", Value::array_of(ValueType::kF32, scores));
    w.set("tokenizer.ggml.token_type", Value::array_of(ValueType::kI32, types));
  } else {
    const std::string pre = tok.pretokenizer_name();
    if (pre.empty() || pre == "default") {
      fail("{}: the byte-level pre-tokenizer regex is not one llama.cpp knows by name (qwen2, llama-bpe, gpt-2); "
           "a GGUF without the right tokenizer.ggml.pre would tokenize differently",
           (dir / "tokenizer.json").string());
    }
    std::vector<std::string> merges;
    merges.reserve(tok.merges().size());
    for (const auto& [left, right] : tok.merges()) merges.push_back(left + " " + right);
    w.set("tokenizer.ggml.model", Value::string("gpt2"));
    w.set("tokenizer.ggml.pre", Value::string(pre));
    w.set("tokenizer.ggml.tokens", Value::string_array(std::move(tokens)));
    w.set("tokenizer.ggml.token_type", Value::array_of(ValueType::kI32, types));
    w.set("tokenizer.ggml.merges", Value::string_array(std::move(merges)));
  }

  // Special ids: the tokenizer's own, else config.json's (as gguf-py's SpecialVocab does).
  int64_t bos = tok.bos_id() >= 0 ? tok.bos_id() : c.bos_token_id;
  int64_t eos = tok.eos_id() >= 0 ? tok.eos_id() : (c.eos_token_ids.empty() ? -1 : c.eos_token_ids[0]);
  if (bos >= 0) w.set("tokenizer.ggml.bos_token_id", Value::u32(static_cast<uint32_t>(bos)));
  if (eos >= 0) w.set("tokenizer.ggml.eos_token_id", Value::u32(static_cast<uint32_t>(eos)));
  if (spm && unk) {
    if (auto id = tok.token_to_id(*unk)) w.set("tokenizer.ggml.unknown_token_id", Value::u32(static_cast<uint32_t>(*id)));
  }
  if (tok_config.contains("pad_token")) {
    if (auto pad = token_content(tok_config["pad_token"])) {
      if (auto id = tok.token_to_id(*pad)) w.set("tokenizer.ggml.padding_token_id", Value::u32(static_cast<uint32_t>(*id)));
    }
  }
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(tok.add_bos()));
  w.set("tokenizer.ggml.add_eos_token", Value::boolean(tok.add_eos()));
  if (spm) w.set("tokenizer.ggml.add_space_prefix", Value::boolean(adds_space_prefix(tok_json)));
  if (!tok.chat_template().empty()) w.set("tokenizer.chat_template", Value::string(tok.chat_template()));
}

std::string gib(uint64_t bytes) { return fmt::format("{:.2f} GB", static_cast<double>(bytes) / 1e9); }

}  // namespace

GgufOutType parse_gguf_out_type(const std::string& text) {
  if (text == "f32") return GgufOutType::kF32;
  if (text == "f16") return GgufOutType::kF16;
  if (text == "bf16") return GgufOutType::kBF16;
  fail("unknown GGUF output type '{}' (use f32, f16 or bf16)", text);
}

std::string gguf_tensor_name(const std::string& hf_name, bool qk_norm) {
  for (const NameRule& r : kGlobalNames) {
    if (hf_name == r.hf) return std::string(r.gguf);
  }
  constexpr std::string_view kPrefix = "model.layers.";
  if (!std::string_view(hf_name).starts_with(kPrefix)) return "";
  const size_t dot = hf_name.find('.', kPrefix.size());
  if (dot == std::string::npos || dot == kPrefix.size()) return "";
  const std::string layer = hf_name.substr(kPrefix.size(), dot - kPrefix.size());
  if (layer.find_first_not_of("0123456789") != std::string::npos) return "";
  const std::string_view rest = std::string_view(hf_name).substr(dot + 1);
  for (const NameRule& r : kBlockNames) {
    if (rest == r.hf && (qk_norm || !is_qk_norm_rule(r))) return "blk." + layer + "." + std::string(r.gguf);
  }
  return "";
}

std::vector<float> llama3_rope_factors(const ModelConfig& c) {
  // convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: the wavelength of each
  // frequency picks no scaling (short), full `factor` (long) or a smooth blend.
  const int dim = c.rope.rotary_dim;
  const double factor = c.rope.factor;
  const double low = c.rope.low_freq_factor, high = c.rope.high_freq_factor;
  const double old_context = c.rope.original_max_position;
  const double low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
  std::vector<float> factors;
  for (int i = 0; i < dim; i += 2) {
    // float32 like torch.arange(..., dtype=float32) in the reference.
    const float freq = 1.0f / std::pow(c.rope.theta, static_cast<float>(i) / static_cast<float>(dim));
    const double wavelen = 2.0 * std::numbers::pi / freq;
    if (wavelen < high_freq_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_freq_wavelen) {
      factors.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (old_context / wavelen - low) / (high - low);
      factors.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / factor + smooth)));
    }
  }
  return factors;
}

GgufExportResult export_gguf(const std::string& model_dir, const std::string& out_path,
                             const GgufExportOptions& options) {
  const fs::path dir(model_dir);
  const ModelConfig config = load_model_config(model_dir);
  std::string arch;
  switch (config.arch) {
    case Arch::kLlama: arch = "llama"; break;
    case Arch::kQwen3: arch = "qwen3"; break;
    default:
      fail("{}: model_type '{}' cannot be converted to GGUF yet (supported: llama, qwen3)",
           (dir / "config.json").string(), config.model_type);
  }
  if (config.attention_bias || config.mlp_bias) {
    fail("{}: attention/MLP biases are not supported by the GGUF converter", (dir / "config.json").string());
  }
  if (config.rope.rotary_dim != config.head_dim) {
    fail("{}: partial rotary embeddings are not supported for {}", (dir / "config.json").string(), arch);
  }
  const bool is_llama = config.arch == Arch::kLlama;
  const WeightStore store = WeightStore::open(model_dir);

  std::string name = options.name;
  if (name.empty()) name = fs::path(model_dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::absolute(dir).lexically_normal().parent_path().filename().string();

  gguf::Writer writer;
  add_hparams(writer, config, arch, name, options.out_type);
  add_tokenizer(writer, config, dir);

  // ---- tensors ----
  const int64_t H = config.hidden_size, hd = config.head_dim, F = config.intermediate_size, V = config.vocab_size;
  const int64_t q_out = config.num_heads * hd, kv_out = config.num_kv_heads * hd;
  std::vector<ExportTensor> plan;
  std::vector<std::string> used;  // HF names consumed

  auto add = [&](const std::string& hf, std::initializer_list<int64_t> shape, int permute_heads = 0) {
    const TensorInfo& t = store.get(hf, shape);
    if (!ggml_type_of(t.dtype)) {
      fail("{}/{}: tensor '{}' has dtype {}; the GGUF converter reads f32, f16 and bf16 checkpoints", model_dir,
           t.file, hf, dtype_name(t.dtype));
    }
    ExportTensor e;
    e.name = gguf_tensor_name(hf, config.qk_norm);
    INFERA_ASSERT(!e.name.empty(), "no GGUF name for " + hf);
    e.src = &t;
    e.one_dim = shape.size() == 1;
    e.rows = shape.size() == 1 ? 1 : *shape.begin();
    e.cols = shape.size() == 1 ? *shape.begin() : *(shape.begin() + 1);
    // Norms and other 1-D tensors stay F32 (llama.cpp's converter does the same).
    e.type = shape.size() == 1 ? GgmlType::kF32 : ggml_type_of(options.out_type);
    e.permute_heads = permute_heads;
    plan.push_back(std::move(e));
    used.push_back(hf);
  };

  if (config.rope.scaling == RopeScaling::kLlama3) {
    ExportTensor e;
    e.name = "rope_freqs.weight";
    e.values = llama3_rope_factors(config);
    e.cols = static_cast<int64_t>(e.values.size());
    e.one_dim = true;
    e.type = GgmlType::kF32;
    plan.push_back(std::move(e));
  }
  add("model.embed_tokens.weight", {V, H});
  for (int l = 0; l < config.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H});
    add(p + "self_attn.q_proj.weight", {q_out, H}, is_llama ? config.num_heads : 0);
    add(p + "self_attn.k_proj.weight", {kv_out, H}, is_llama ? config.num_kv_heads : 0);
    add(p + "self_attn.v_proj.weight", {kv_out, H});
    add(p + "self_attn.o_proj.weight", {H, q_out});
    if (config.qk_norm) {
      add(p + "self_attn.q_norm.weight", {hd});
      add(p + "self_attn.k_norm.weight", {hd});
    }
    add(p + "post_attention_layernorm.weight", {H});
    add(p + "mlp.gate_proj.weight", {F, H});
    add(p + "mlp.up_proj.weight", {F, H});
    add(p + "mlp.down_proj.weight", {H, F});
  }
  add("model.norm.weight", {H});
  if (!config.tie_word_embeddings) {
    if (store.find("lm_head.weight")) {
      add("lm_head.weight", {V, H});
    } else {
      fail("{}: config.json says tie_word_embeddings is false but there is no 'lm_head.weight' tensor", model_dir);
    }
  }
  // Anything left over would be silently dropped: refuse instead.
  for (const std::string& n : store.names()) {
    if (std::find(used.begin(), used.end(), n) != used.end()) continue;
    if (n.ends_with("rotary_emb.inv_freq")) continue;                   // recomputed by every runtime
    if (n == "lm_head.weight" && config.tie_word_embeddings) continue;  // tied copy
    fail("{}: tensor '{}' has no GGUF counterpart for model_type {} (biases and extra heads are not supported)",
         model_dir, n, config.model_type);
  }

  for (const ExportTensor& e : plan) {
    const ExportTensor* ep = &e;
    writer.add_tensor(e.name, e.type, e.ne(), [ep](gguf::ByteSink& out) { stream_tensor(*ep, out); });
  }

  gguf::Writer::Progress progress;
  if (options.show_progress) {
    // Only worth a meter for big models; redraw when the percentage changes.
    progress = [last_percent = -1](size_t done, size_t total, uint64_t bytes, uint64_t total_bytes) mutable {
      if (total_bytes < (uint64_t{64} << 20)) return;
      const int percent = static_cast<int>(100 * bytes / total_bytes);
      if (percent == last_percent && done != total) return;
      last_percent = percent;
      std::fprintf(stderr, "\rconverting: %3d%%, %zu/%zu tensors, %s of %s", percent, done, total, gib(bytes).c_str(),
                   gib(total_bytes).c_str());
      if (done == total) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    };
  }
  writer.write(out_path, progress);
  GgufExportResult result;
  result.n_tensors = plan.size();
  result.file_bytes = fs::file_size(out_path);
  return result;
}

}  // namespace infera
