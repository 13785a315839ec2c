#include "infera/tools/gguf_export.h"
#include "infera/base/ascii.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numbers>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/base/threads.h"
#include "infera/io/model_ref.h"
#include "infera/io/safetensors.h"
#include "infera/kernels/ggml_quants.h"
#include "infera/model/arch_registry.h"
#include "infera/model/config.h"
#include "infera/model/tensor_table.h"
#include "infera/model/weights.h"
#include "infera/tensor/dtype.h"
#include "infera/tokenizer/tokenizer.h"
#include "infera/tools/gguf_quant_mix.h"
#include "infera/tools/imatrix.h"

namespace infera {

namespace fs = std::filesystem;
using gguf::GgmlType;
using gguf::Value;
using gguf::ValueType;
using json = nlohmann::json;

namespace {

// llama.cpp token types (llama_token_type / gguf TokenType).
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// The llama.cpp mix of a quantized output type; nullopt for F32 / F16 / BF16.
std::optional<QuantMix> mix_of(GgufOutType t) {
  switch (t) {
    case GgufOutType::kF32:
    case GgufOutType::kF16:
    case GgufOutType::kBF16: return std::nullopt;
    case GgufOutType::kQ8_0: return QuantMix::kQ8_0;
    case GgufOutType::kQ4_0: return QuantMix::kQ4_0;
    case GgufOutType::kQ4_1: return QuantMix::kQ4_1;
    case GgufOutType::kQ5_0: return QuantMix::kQ5_0;
    case GgufOutType::kQ5_1: return QuantMix::kQ5_1;
    case GgufOutType::kQ4_K_S: return QuantMix::kQ4_K_S;
    case GgufOutType::kQ4_K_M: return QuantMix::kQ4_K_M;
    case GgufOutType::kQ5_K_S: return QuantMix::kQ5_K_S;
    case GgufOutType::kQ5_K_M: return QuantMix::kQ5_K_M;
    case GgufOutType::kQ6_K: return QuantMix::kQ6_K;
    case GgufOutType::kIQ4_NL: return QuantMix::kIQ4_NL;
    case GgufOutType::kIQ4_XS: return QuantMix::kIQ4_XS;
  }
  return std::nullopt;
}

// general.file_type (llama_ftype).
uint32_t file_type_of(GgufOutType t) {
  if (const auto mix = mix_of(t)) return static_cast<uint32_t>(*mix);
  switch (t) {
    case GgufOutType::kF16: return 1;  // MOSTLY_F16
    case GgufOutType::kBF16: return 32;  // MOSTLY_BF16
    default: return 0;  // ALL_F32
  }
}

// The type of every matrix before a mix picks per tensor (quantized mixes start from F32,
// as llama-quantize does from an F32 file).
GgmlType plain_type_of(GgufOutType t) {
  switch (t) {
    case GgufOutType::kF16: return GgmlType::kF16;
    case GgufOutType::kBF16: return GgmlType::kBF16;
    default: return GgmlType::kF32;
  }
}

std::optional<GgmlType> ggml_type_of(DType t) {
  switch (t) {
    case DType::kF32: return GgmlType::kF32;
    case DType::kF16: return GgmlType::kF16;
    case DType::kBF16: return GgmlType::kBF16;
    default: return std::nullopt;
  }
}

// ---- tensor data: dtype conversion and the llama q/k row permutation ----

// Source rows to f32: model/weights.h to_f32 (f32, f16, bf16; the converter reads no other dtype).
void row_to_f32(const uint8_t* src, DType dtype, size_t n, float* out) {
  to_f32(src, dtype, static_cast<int64_t>(n), out);
}

// One GGUF tensor to write: where its bytes come from and how they are transformed.
// Matrices are streamed row by row from the checkpoint (never loaded whole): GGUF row r
// is row rows[r].row of tensor rows[r].src, so one GGUF tensor can stack many HF tensors
// (per-expert weights -> one 3-D expert tensor), split one (fused gate_up_proj) or reorder
// rows (llama's q/k permutation, Qwen3.5's value heads); col_order reorders columns.
struct RowSource {
  const TensorInfo* src;
  int64_t row;
};

struct ExportTensor {
  std::string name;
  std::vector<float> values;  // small tensors computed here (norms, A_log, conv): F32 data
  std::vector<RowSource> rows;  // matrices: the source of each GGUF row
  std::vector<int64_t> col_order;  // empty = identity
  const TensorInfo* whole = nullptr;  // the rows are exactly this tensor, in order (fast copy)
  GgmlType type = GgmlType::kF32;
  int64_t cols = 1;
  std::vector<uint64_t> dims;  // GGUF ne, innermost first
  // Quantized types: the importance weights, cols per matrix (dims[2] matrices), or null.
  const std::vector<float>* imatrix = nullptr;
};

// GGUF row r of t as f32 (tmp: scratch of t.cols).
void row_values(const ExportTensor& t, int64_t r, float* out, std::vector<float>& tmp) {
  const size_t n = static_cast<size_t>(t.cols);
  if (t.rows.empty()) {
    std::memcpy(out, t.values.data() + static_cast<size_t>(r) * n, n * sizeof(float));
    return;
  }
  const RowSource& src = t.rows[static_cast<size_t>(r)];
  const DType sdt = src.src->dtype;
  const uint8_t* p = src.src->data + static_cast<size_t>(src.row) * n * dtype_size(sdt);
  if (t.col_order.empty()) {
    row_to_f32(p, sdt, n, out);
    return;
  }
  tmp.resize(n);
  row_to_f32(p, sdt, n, tmp.data());
  for (size_t i = 0; i < n; ++i) out[i] = tmp[static_cast<size_t>(t.col_order[i])];
}

// A block-quantized tensor: rows gathered in chunks of about 16M weights, quantized in
// parallel (each row on its own, as llama.cpp does), written in order.
void stream_quantized(const ExportTensor& t, gguf::ByteSink& out) {
  const auto type = static_cast<uint32_t>(t.type);
  const int64_t cols = t.cols;
  const int64_t n_rows = t.rows.empty() ? static_cast<int64_t>(t.values.size()) / cols : std::ssize(t.rows);
  const int64_t rows_per_matrix = t.dims.size() > 1 ? static_cast<int64_t>(t.dims[1]) : 1;
  const int64_t rb = kernels::ggml::row_bytes(type, cols);
  const int64_t chunk = std::max<int64_t>(1, (int64_t{16} << 20) / cols);
  std::vector<float> f32(static_cast<size_t>(std::min(chunk, n_rows) * cols));
  std::vector<uint8_t> blocks(static_cast<size_t>(std::min(chunk, n_rows) * rb));
  for (int64_t r0 = 0; r0 < n_rows; r0 += chunk) {
    const int64_t nr = std::min(chunk, n_rows - r0);
#pragma omp parallel num_threads(num_threads())
    {
      std::vector<float> tmp;
#pragma omp for schedule(dynamic, 4)
      for (int64_t i = 0; i < nr; ++i) {
        const int64_t r = r0 + i;
        float* x = f32.data() + i * cols;
        row_values(t, r, x, tmp);
        const float* qw = t.imatrix ? t.imatrix->data() + (r / rows_per_matrix) * cols : nullptr;
        kernels::ggml::quantize_rows(type, x, blocks.data() + i * rb, 1, cols, qw);
      }
    }
    out.write(blocks.data(), static_cast<size_t>(nr * rb));
  }
}

void stream_tensor(const ExportTensor& t, gguf::ByteSink& out) {
  if (kernels::ggml::can_quantize(static_cast<uint32_t>(t.type))) {
    stream_quantized(t, out);
    return;
  }
  if (t.rows.empty()) {
    if (t.type == GgmlType::kF16) {  // a computed matrix a mix leaves unquantized (rows not whole 32-blocks)
      std::vector<uint16_t> half(t.values.size());
      for (size_t i = 0; i < half.size(); ++i) half[i] = f32_to_f16(t.values[i]);
      out.write(half.data(), half.size() * 2);
      return;
    }
    INFERA_ASSERT(t.type == GgmlType::kF32, "computed tensors are F32, F16 or quantized");
    out.write(t.values.data(), t.values.size() * sizeof(float));
    return;
  }
  if (t.whole && t.col_order.empty() && ggml_type_of(t.whole->dtype) == t.type) {
    out.write(t.whole->data, t.whole->nbytes);  // same encoding: copy straight from the mapping
    return;
  }
  std::vector<float> f32(static_cast<size_t>(t.cols)), tmp(t.col_order.empty() ? 0 : static_cast<size_t>(t.cols));
  std::vector<uint16_t> half(t.type == GgmlType::kF32 ? 0 : static_cast<size_t>(t.cols));
  for (const RowSource& r : t.rows) {
    const DType sdt = r.src->dtype;
    const size_t row_bytes = static_cast<size_t>(t.cols) * dtype_size(sdt);
    const uint8_t* src_row = r.src->data + static_cast<size_t>(r.row) * row_bytes;
    if (ggml_type_of(sdt) == t.type && t.col_order.empty()) {
      out.write(src_row, row_bytes);
      continue;
    }
    row_to_f32(src_row, sdt, f32.size(), f32.data());
    if (!t.col_order.empty()) {
      for (size_t i = 0; i < f32.size(); ++i) tmp[i] = f32[static_cast<size_t>(t.col_order[i])];
      f32.swap(tmp);
    }
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

// GGUF row r -> HF row for llama's q/k. HF (rotate_half) puts pair element k of pair j of
// head h at row h*hd + k*hd/2 + j; llama.cpp's NORM rope wants it at h*hd + 2j + k
// (convert_hf_to_gguf.py LlamaModel.permute).
int64_t llama_permuted_row(int64_t rows, int heads, int64_t r) {
  const int64_t hd = rows / heads;
  const int64_t h = r / hd, i = r % hd, j = i / 2, k = i % 2;
  return h * hd + k * (hd / 2) + j;
}

// Qwen3.5 value heads: HF groups them by key head ([k0: v0..v{r-1}], [k1: ...]); llama.cpp
// broadcasts key heads tiled, so GGUF head j' = v * Hk + k holds HF head k * r + v
// (conversion/qwen.py _reorder_v_heads). Returns the HF index of GGUF element i of a run
// of n_v_heads * width elements.
int64_t v_head_source(int64_t i, int64_t n_k_heads, int64_t n_v_heads, int64_t width) {
  const int64_t r = n_v_heads / n_k_heads;
  const int64_t head = i / width, within = i % width;
  const int64_t k = head % n_k_heads, v = head / n_k_heads;
  return (k * r + v) * width + within;
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
      w.set(p + "rope.scaling.original_context_length",
            Value::u32(static_cast<uint32_t>(c.rope.original_max_position)));
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
      const std::string scheme =
          node.value("prepend_scheme", node.value("add_prefix_space", true) ? "always" : "never");
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
  const json tok_json = read_json_file((dir / "tokenizer.json").string());
  const fs::path config_path = dir / "tokenizer_config.json";
  const json tok_config = fs::exists(config_path) ? read_json_file(config_path.string()) : json::object();

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
  if (tok_json.contains("model") && tok_json["model"].contains("unk_token"))
    unk = token_content(tok_json["model"]["unk_token"]);
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
      fail(
          "{}: the byte-level pre-tokenizer regex is not one llama.cpp knows by name (qwen2, llama-bpe, gpt-2); "
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
    if (auto id = tok.token_to_id(*unk))
      w.set("tokenizer.ggml.unknown_token_id", Value::u32(static_cast<uint32_t>(*id)));
  }
  if (tok_config.contains("pad_token")) {
    if (auto pad = token_content(tok_config["pad_token"])) {
      if (auto id = tok.token_to_id(*pad))
        w.set("tokenizer.ggml.padding_token_id", Value::u32(static_cast<uint32_t>(*id)));
    }
  }
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(tok.add_bos()));
  w.set("tokenizer.ggml.add_eos_token", Value::boolean(tok.add_eos()));
  if (spm) w.set("tokenizer.ggml.add_space_prefix", Value::boolean(adds_space_prefix(tok_json)));
  if (!tok.chat_template().empty()) w.set("tokenizer.chat_template", Value::string(tok.chat_template()));
}

std::string gib(uint64_t bytes) { return fmt::format("{:.2f} GB", static_cast<double>(bytes) / 1e9); }

}  // namespace

namespace {

const std::pair<const char*, GgufOutType> kOutTypeNames[] = {
    {"f32", GgufOutType::kF32},       {"f16", GgufOutType::kF16},       {"bf16", GgufOutType::kBF16},
    {"q8_0", GgufOutType::kQ8_0},     {"q4_0", GgufOutType::kQ4_0},     {"q4_1", GgufOutType::kQ4_1},
    {"q5_0", GgufOutType::kQ5_0},     {"q5_1", GgufOutType::kQ5_1},     {"q4_k_s", GgufOutType::kQ4_K_S},
    {"q4_k_m", GgufOutType::kQ4_K_M}, {"q5_k_s", GgufOutType::kQ5_K_S}, {"q5_k_m", GgufOutType::kQ5_K_M},
    {"q6_k", GgufOutType::kQ6_K},     {"iq4_nl", GgufOutType::kIQ4_NL}, {"iq4_xs", GgufOutType::kIQ4_XS},
};

}  // namespace

std::string gguf_out_type_names() {
  std::string names;
  for (const auto& [n, t] : kOutTypeNames) names += (names.empty() ? "" : ", ") + std::string(n);
  return names;
}

GgufOutType parse_gguf_out_type(const std::string& text) {
  const std::string lower = ascii_lower(text);
  for (const auto& [n, t] : kOutTypeNames) {
    if (lower == n) return t;
  }
  fail("unknown GGUF output type '{}' (use one of {})", text, gguf_out_type_names());
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

namespace {

// mrope_section from config.json (text_config.rope_parameters or rope_scaling), padded to
// 4 entries; llama.cpp's converter writes [11, 11, 10, 0] when the field is absent.
std::vector<int32_t> mrope_sections(const fs::path& config_path) {
  const json j = read_json_file(config_path.string());
  const json& text = j.contains("text_config") && j["text_config"].is_object() ? j["text_config"] : j;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    for (const json* node : {&text, &j}) {
      if (!node->contains(key) || !(*node)[key].is_object()) continue;
      const json& r = (*node)[key];
      if (!r.contains("mrope_section") || !r["mrope_section"].is_array()) continue;
      std::vector<int32_t> out;
      for (const json& v : r["mrope_section"]) {
        if (!v.is_number_integer()) fail("{}: field '{}.mrope_section' must hold integers", config_path.string(), key);
        out.push_back(v.get<int32_t>());
      }
      out.resize(4, 0);
      return out;
    }
  }
  return {11, 11, 10, 0};
}

void add_moe_hparams(gguf::Writer& w, const ModelConfig& c, const std::string& p) {
  w.set(p + "expert_count", Value::u32(static_cast<uint32_t>(c.num_experts)));
  w.set(p + "expert_used_count", Value::u32(static_cast<uint32_t>(c.num_experts_per_tok)));
  w.set(p + "expert_feed_forward_length", Value::u32(static_cast<uint32_t>(c.moe_intermediate_size)));
}

}  // namespace

GgufExportResult export_gguf(const std::string& model_dir, const std::string& out_path,
                             const GgufExportOptions& options) {
  const fs::path dir(model_dir);
  const std::string config_path = (dir / "config.json").string();
  const ModelConfig config = load_model_config(model_dir);
  const ArchInfo& info = arch_info(config.arch);
  if (info.gguf_arch == nullptr) {
    fail("{}: model_type '{}' cannot be converted to GGUF yet (supported: {})", config_path, config.model_type,
         gguf_export_arch_names());
  }
  const std::string arch = info.gguf_arch;
  const bool hybrid = info.traits.hybrid;
  if (config.attention_bias || config.mlp_bias) {
    fail("{}: attention/MLP biases are not supported by the GGUF converter", config_path);
  }
  if (!hybrid && !config.mla && config.rope.rotary_dim != config.head_dim) {
    fail("{}: partial rotary embeddings are not supported for {}", config_path, arch);
  }
  // A transformer with experts (qwen3moe): llama.cpp runs every layer as MoE and always
  // renormalises the top-k. So does its qwen3next (the fused-projection hybrid), whose every
  // layer also has a shared expert.
  const bool transformer_moe = !hybrid && !config.mla && config.num_experts > 0;
  const bool fused_gdn = hybrid && info.traits.fused_gdn_projections;
  if (fused_gdn && (config.num_experts == 0 || config.shared_expert_intermediate_size <= 0)) {
    fail("{}: llama.cpp's {} needs experts and a shared expert in every layer", config_path, arch);
  }
  if (transformer_moe || fused_gdn) {
    for (int l = 0; l < config.num_layers; ++l) {
      if (!config.is_moe_layer(l)) {
        fail(
            "{}: layer {} is a dense MLP layer (decoder_sparse_step / mlp_only_layers); llama.cpp's {} "
            "needs every layer to be MoE",
            config_path, l, arch);
      }
    }
    if (!config.norm_topk_prob) {
      fail("{}: norm_topk_prob is false; llama.cpp's {} always renormalises the top-k weights", config_path, arch);
    }
  }
  if (config.index_n_heads > 0) {
    // llama.cpp's deepseek32 always has q_lora (the indexer query comes from it) and keeps the
    // indexer keys Hadamard-rotated by a matrix it builds for power-of-two sizes from 64 up.
    if (config.q_lora_rank <= 0) fail("{}: deepseek32 needs q_lora_rank > 0", config_path);
    const int64_t d = config.index_head_dim;
    if (d < 64 || (d & (d - 1)) != 0) {
      fail("{}: index_head_dim {} is not a power of two >= 64, which llama.cpp's deepseek32 needs", config_path, d);
    }
  }
  if (hybrid && config.linear_key_head_dim != config.linear_value_head_dim) {
    fail("{}: linear_key_head_dim ({}) != linear_value_head_dim ({}); llama.cpp's {} needs them equal", config_path,
         config.linear_key_head_dim, config.linear_value_head_dim, arch);
  }
  const bool permute_qk = info.traits.gguf_permuted_qk;
  const WeightStore store = WeightStore::open(model_dir);
  const HasTensor has = [&store](const std::string& n) { return store.find(n) != nullptr; };

  std::string name = options.name;
  if (name.empty()) name = hf_snapshot_repo_name(model_dir);  // (not its commit id)
  if (name.empty()) name = fs::path(model_dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::absolute(dir).lexically_normal().parent_path().filename().string();

  // The MTP block (Qwen3.5) goes in as one more block, blk.{num_layers}, as llama.cpp's
  // converter does; only when the checkpoint has its weights.
  const int n_mtp = hybrid && store.find("mtp.fc.weight") ? std::max(config.mtp_num_hidden_layers, 1) : 0;
  // Gated DeltaNet value heads: tiled as llama.cpp's qwen35 wants them, or kept in HF's order.
  const bool tiled = info.traits.gguf_tiled_value_heads;
  // GGUF names come from the architecture's tensor table, as this checkpoint lays it out.
  std::unordered_map<std::string, std::string> gguf_names;
  ModelConfig table_config = config;
  table_config.mtp_num_hidden_layers = n_mtp;
  for (const TensorSpec& t : tensor_table(table_config, has)) {
    if (!t.gguf.empty()) gguf_names[t.name] = t.gguf;
  }
  auto gguf_name = [&](const std::string& hf) -> const std::string& {
    auto it = gguf_names.find(hf);
    if (it == gguf_names.end()) {
      fail("{}: tensor '{}' has no GGUF name in the {} tensor table", model_dir, hf, info.name);
    }
    return it->second;
  };

  gguf::Writer writer;
  add_hparams(writer, config, arch, name, options.out_type);
  const std::string hp = arch + ".";
  if (transformer_moe) add_moe_hparams(writer, config, hp);
  // DeepSeek (deepseek2): MLA as llama.cpp's converter lays it out, MQA over the latent
  // (one KV head of kv_lora_rank + qk_rope_head_dim), the per-head widths as *_mla.
  const int n_nextn = config.mla && store.find("model.layers." + std::to_string(config.num_layers) + ".eh_proj.weight")
                          ? config.num_nextn_predict_layers
                          : 0;
  if (config.mla) {
    writer.set(hp + "block_count", Value::u32(static_cast<uint32_t>(config.num_layers + n_nextn)));
    if (n_nextn > 0) writer.set(hp + "nextn_predict_layers", Value::u32(static_cast<uint32_t>(n_nextn)));
    writer.set(hp + "leading_dense_block_count", Value::u32(static_cast<uint32_t>(config.first_k_dense_replace)));
    if (config.q_lora_rank > 0)
      writer.set(hp + "attention.q_lora_rank", Value::u32(static_cast<uint32_t>(config.q_lora_rank)));
    writer.set(hp + "attention.kv_lora_rank", Value::u32(static_cast<uint32_t>(config.kv_lora_rank)));
    writer.set(hp + "attention.head_count_kv", Value::u32(1));
    writer.set(hp + "attention.key_length",
               Value::u32(static_cast<uint32_t>(config.kv_lora_rank + config.qk_rope_head_dim)));
    writer.set(hp + "attention.value_length", Value::u32(static_cast<uint32_t>(config.kv_lora_rank)));
    writer.set(hp + "attention.key_length_mla",
               Value::u32(static_cast<uint32_t>(config.qk_nope_head_dim + config.qk_rope_head_dim)));
    writer.set(hp + "attention.value_length_mla", Value::u32(static_cast<uint32_t>(config.v_head_dim)));
    writer.set(hp + "rope.dimension_count", Value::u32(static_cast<uint32_t>(config.qk_rope_head_dim)));
    if (config.index_n_heads > 0) {
      // deepseek32: the lightning indexer (its RoPE covers the first rope.dimension_count
      // dims of each indexer head, NeoX-style; llama.cpp knows that from the architecture).
      writer.set(hp + "attention.indexer.head_count", Value::u32(static_cast<uint32_t>(config.index_n_heads)));
      writer.set(hp + "attention.indexer.key_length", Value::u32(static_cast<uint32_t>(config.index_head_dim)));
      writer.set(hp + "attention.indexer.top_k", Value::u32(static_cast<uint32_t>(config.index_topk)));
    }
    if (config.rope.scaling == RopeScaling::kYarn) {
      // llama.cpp's softmax-scale correction: mscale = 1 + yarn_log_multiplier ln(factor).
      writer.set(hp + "rope.scaling.yarn_log_multiplier", Value::f32(0.1f * config.rope.mscale_all_dim));
    }
    if (config.num_experts > 0) {
      add_moe_hparams(writer, config, hp);
      writer.set(hp + "expert_shared_count", Value::u32(static_cast<uint32_t>(config.n_shared_experts)));
      writer.set(hp + "expert_weights_scale", Value::f32(config.routed_scaling_factor));
      writer.set(hp + "expert_weights_norm", Value::boolean(config.norm_topk_prob));
      writer.set(hp + "expert_gating_func", Value::u32(2));  // LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
      if (config.n_group > 1) {
        writer.set(hp + "expert_group_count", Value::u32(static_cast<uint32_t>(config.n_group)));
        writer.set(hp + "expert_group_used_count", Value::u32(static_cast<uint32_t>(config.topk_group)));
      }
    }
  }
  if (hybrid) {
    writer.set(hp + "block_count", Value::u32(static_cast<uint32_t>(config.num_layers + n_mtp)));
    if (n_mtp > 0) writer.set(hp + "nextn_predict_layers", Value::u32(static_cast<uint32_t>(n_mtp)));
    // Qwen3.5's interleaved MRoPE sections (Qwen3-Next has plain partial RoPE).
    if (info.traits.nested_text)
      writer.set(hp + "rope.dimension_sections", Value::array_of(ValueType::kI32, mrope_sections(config_path)));
    writer.set(hp + "ssm.conv_kernel", Value::u32(static_cast<uint32_t>(config.linear_conv_kernel_dim)));
    writer.set(hp + "ssm.state_size", Value::u32(static_cast<uint32_t>(config.linear_key_head_dim)));
    writer.set(hp + "ssm.group_count", Value::u32(static_cast<uint32_t>(config.linear_num_key_heads)));
    writer.set(hp + "ssm.time_step_rank", Value::u32(static_cast<uint32_t>(config.linear_num_value_heads)));
    writer.set(hp + "ssm.inner_size",
               Value::u32(static_cast<uint32_t>(config.linear_value_head_dim * config.linear_num_value_heads)));
    std::vector<uint8_t> recurrent;
    for (int l = 0; l < config.num_layers + n_mtp; ++l)
      recurrent.push_back(config.is_linear_attention_layer(l) ? 1 : 0);
    writer.set(hp + "attention.recurrent_layers", Value::array_of(ValueType::kBool, recurrent));
    writer.set(hp + "full_attention_interval",
               Value::u32(
                   static_cast<uint32_t>(config.full_attention_interval > 0 ? config.full_attention_interval : 4)));
    if (config.num_experts > 0) {
      add_moe_hparams(writer, config, hp);
      if (config.shared_expert_intermediate_size > 0) {
        writer.set(hp + "expert_shared_feed_forward_length",
                   Value::u32(static_cast<uint32_t>(config.shared_expert_intermediate_size)));
      }
    }
  }
  add_tokenizer(writer, config, dir);

  // ---- tensors ----
  const int64_t H = config.hidden_size, hd = config.head_dim, F = config.intermediate_size, V = config.vocab_size;
  const int64_t q_out = config.num_heads * hd, kv_out = config.num_kv_heads * hd;
  const GgmlType out_mat_type = plain_type_of(options.out_type);
  // Every matrix starts in out_mat_type; quantized mixes choose per tensor once the plan is
  // complete (below).
  std::vector<ExportTensor> plan;
  std::unordered_set<std::string> used;  // HF names consumed

  auto source = [&](const std::string& hf, std::initializer_list<int64_t> shape) -> const TensorInfo& {
    const TensorInfo& t = store.get(hf, shape);
    if (!ggml_type_of(t.dtype)) {
      fail("{}/{}: tensor '{}' has dtype {}; the GGUF converter reads f32, f16 and bf16 checkpoints", model_dir, t.file,
           hf, dtype_name(t.dtype));
    }
    used.insert(hf);
    return t;
  };
  // A matrix [rows, cols] (GGUF ne {cols, rows}); row_of maps GGUF rows to source rows.
  // A matrix `name` of `rows` rows of t's (GGUF ne {cols, rows}); row_of as above.
  auto add_rows = [&](const std::string& name, const TensorInfo& t, int64_t rows, int64_t cols,
                      const std::function<int64_t(int64_t)>& row_of, std::vector<int64_t> col_order = {}) {
    ExportTensor e;
    e.name = name;
    e.type = out_mat_type;
    e.cols = cols;
    e.dims = {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
    for (int64_t r = 0; r < rows; ++r) e.rows.push_back({&t, row_of ? row_of(r) : r});
    if (!row_of) e.whole = &t;
    e.col_order = std::move(col_order);
    plan.push_back(std::move(e));
  };
  auto add_matrix = [&](const std::string& hf, int64_t rows, int64_t cols,
                        const std::function<int64_t(int64_t)>& row_of = nullptr, std::vector<int64_t> col_order = {}) {
    add_rows(gguf_name(hf), source(hf, {rows, cols}), rows, cols, row_of, std::move(col_order));
  };
  // The MoE router stays F32 whatever the type of the other matrices, as llama.cpp's
  // converter keeps it (FFN_GATE_INP) and llama-quantize leaves it: llama.cpp multiplies F16
  // weights with activations rounded to F16, which moves near-tied expert choices.
  auto add_router = [&](const std::string& hf, int64_t n_experts) {
    add_matrix(hf, n_experts, config.hidden_size);
    plan.back().type = GgmlType::kF32;
  };
  // A vector (always F32), optionally transformed: (value, GGUF index) -> value.
  auto add_vector = [&](const std::string& hf, int64_t n,
                        const std::function<float(const std::vector<float>&, int64_t)>& f = nullptr) {
    const TensorInfo& t = source(hf, {n});
    std::vector<float> src(static_cast<size_t>(n));
    row_to_f32(t.data, t.dtype, src.size(), src.data());
    ExportTensor e;
    e.name = gguf_name(hf);
    e.cols = n;
    e.dims = {static_cast<uint64_t>(n)};
    e.values.resize(src.size());
    for (int64_t i = 0; i < n; ++i) e.values[i] = f ? f(src, i) : src[i];
    plan.push_back(std::move(e));
  };
  // Zero-centred norms (Qwen3.5): stored w, applied as 1 + w; llama.cpp wants 1 + w baked in.
  const auto plus_one = [](const std::vector<float>& v, int64_t i) { return v[i] + 1.0f; };
  // Expert weights [E, rows, cols] as one GGUF tensor ne {cols, rows, E}; part(e) gives the
  // expert's source tensor and first row.
  auto add_experts = [&](const std::string& name, int64_t E, int64_t rows, int64_t cols,
                         const std::function<RowSource(int64_t)>& part) {
    ExportTensor e;
    e.name = name;
    e.type = out_mat_type;
    e.cols = cols;
    e.dims = {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), static_cast<uint64_t>(E)};
    for (int64_t x = 0; x < E; ++x) {
      const RowSource first = part(x);
      for (int64_t r = 0; r < rows; ++r) e.rows.push_back({first.src, first.row + r});
    }
    plan.push_back(std::move(e));
  };

  if (config.rope.scaling == RopeScaling::kLlama3) {
    ExportTensor e;
    e.name = "rope_freqs.weight";
    e.values = llama3_rope_factors(config);
    e.cols = static_cast<int64_t>(e.values.size());
    e.dims = {static_cast<uint64_t>(e.cols)};
    plan.push_back(std::move(e));
  }

  const std::string lm = text_prefix(config, has);
  add_matrix(lm + "embed_tokens.weight", V, H);

  // Per-expert tensors [E, rows, cols] of the MoE block under `p` ("model.layers.3.").
  auto add_per_expert = [&](const std::string& p) {
    const int64_t E = config.num_experts, I = config.moe_intermediate_size;
    for (const char* part : {"gate", "up", "down"}) {
      const bool down = std::string(part) == "down";
      const std::string first = p + "mlp.experts.0." + part + "_proj.weight";
      add_experts(gguf_name(first), E, down ? H : I, down ? I : H, [&, part, down](int64_t x) {
        const std::string hf = p + "mlp.experts." + std::to_string(x) + "." + part + "_proj.weight";
        return RowSource{&source(hf, {down ? H : I, down ? I : H}), 0};
      });
    }
  };

  if (config.mla) {
    const int64_t nh = config.num_heads, R = config.kv_lora_rank, P = config.qk_rope_head_dim;
    const int64_t nope = config.qk_nope_head_dim, Vd = config.v_head_dim, qk = nope + P, kvw = nope + Vd;
    auto add_block = [&](const std::string& p, int layer) {
      const std::string a = p + "self_attn.";
      add_vector(p + "input_layernorm.weight", H);
      if (config.q_lora_rank > 0) {
        add_matrix(a + "q_a_proj.weight", config.q_lora_rank, H);
        add_vector(a + "q_a_layernorm.weight", config.q_lora_rank);
        add_matrix(a + "q_b_proj.weight", nh * qk, config.q_lora_rank);
      } else {
        add_matrix(a + "q_proj.weight", nh * qk, H);
      }
      add_matrix(a + "kv_a_proj_with_mqa.weight", R + P, H);
      add_vector(a + "kv_a_layernorm.weight", R);
      {
        // kv_b_proj [nh (nope + V), R] split per head as llama.cpp's converter does:
        // attn_k_b [nh, R, nope] (each head's k_nope rows transposed), attn_v_b [nh, V, R].
        const std::string kvb = a + "kv_b_proj.weight";
        const TensorInfo& t = source(kvb, {nh * kvw, R});
        std::vector<float> w(static_cast<size_t>(nh * kvw * R));
        row_to_f32(t.data, t.dtype, w.size(), w.data());
        ExportTensor k;
        k.name = gguf_name(kvb);
        k.cols = nope;
        k.dims = {static_cast<uint64_t>(nope), static_cast<uint64_t>(R), static_cast<uint64_t>(nh)};
        k.values.reserve(static_cast<size_t>(nh * R * nope));
        for (int64_t h = 0; h < nh; ++h)
          for (int64_t r = 0; r < R; ++r)
            for (int64_t j = 0; j < nope; ++j) k.values.push_back(w[static_cast<size_t>((h * kvw + j) * R + r)]);
        std::string vname = k.name;
        vname.replace(vname.rfind("attn_k_b"), 8, "attn_v_b");
        plan.push_back(std::move(k));
        ExportTensor v;
        v.name = vname;
        v.type = out_mat_type;
        v.cols = R;
        v.dims = {static_cast<uint64_t>(R), static_cast<uint64_t>(Vd), static_cast<uint64_t>(nh)};
        for (int64_t h = 0; h < nh; ++h)
          for (int64_t j = 0; j < Vd; ++j) v.rows.push_back({&t, h * kvw + nope + j});
        plan.push_back(std::move(v));
      }
      add_matrix(a + "o_proj.weight", H, nh * Vd);
      if (config.index_n_heads > 0) {
        const int64_t nI = config.index_n_heads, dI = config.index_head_dim;
        add_matrix(a + "indexer.wq_b.weight", nI * dI, config.q_lora_rank);
        add_matrix(a + "indexer.wk.weight", dI, H);
        add_vector(a + "indexer.k_norm.weight", dI);
        add_vector(a + "indexer.k_norm.bias", dI);
        add_matrix(a + "indexer.weights_proj.weight", nI, H);
      }
      add_vector(p + "post_attention_layernorm.weight", H);
      if (!config.is_moe_layer(layer)) {
        add_matrix(p + "mlp.gate_proj.weight", F, H);
        add_matrix(p + "mlp.up_proj.weight", F, H);
        add_matrix(p + "mlp.down_proj.weight", H, F);
        return;
      }
      const int64_t E = config.num_experts, S = config.moe_intermediate_size * config.n_shared_experts;
      add_router(p + "mlp.gate.weight", E);
      add_vector(p + "mlp.gate.e_score_correction_bias", E);
      add_per_expert(p);
      if (S > 0) {
        add_matrix(p + "mlp.shared_experts.gate_proj.weight", S, H);
        add_matrix(p + "mlp.shared_experts.up_proj.weight", S, H);
        add_matrix(p + "mlp.shared_experts.down_proj.weight", H, S);
      }
    };
    for (int l = 0; l < config.num_layers; ++l) add_block("model.layers." + std::to_string(l) + ".", l);
    for (int m = 0; m < n_nextn; ++m) {
      const int layer = config.num_layers + m;
      const std::string p = "model.layers." + std::to_string(layer) + ".";
      add_block(p, layer);
      add_matrix(p + "eh_proj.weight", H, 2 * H);
      add_vector(p + "enorm.weight", H);
      add_vector(p + "hnorm.weight", H);
      add_vector(p + "shared_head.norm.weight", H);
      if (store.find(p + "embed_tokens.weight")) add_matrix(p + "embed_tokens.weight", V, H);
      if (store.find(p + "shared_head.head.weight")) add_matrix(p + "shared_head.head.weight", V, H);
    }
  } else if (!hybrid) {
    for (int l = 0; l < config.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add_vector(p + "input_layernorm.weight", H);
      const int nh = config.num_heads, nkv = config.num_kv_heads;
      add_matrix(p + "self_attn.q_proj.weight", q_out, H,
                 permute_qk
                     ? std::function<int64_t(int64_t)>([&](int64_t r) { return llama_permuted_row(q_out, nh, r); })
                     : nullptr);
      add_matrix(p + "self_attn.k_proj.weight", kv_out, H,
                 permute_qk
                     ? std::function<int64_t(int64_t)>([&](int64_t r) { return llama_permuted_row(kv_out, nkv, r); })
                     : nullptr);
      add_matrix(p + "self_attn.v_proj.weight", kv_out, H);
      add_matrix(p + "self_attn.o_proj.weight", H, q_out);
      if (config.qk_norm) {
        add_vector(p + "self_attn.q_norm.weight", hd);
        add_vector(p + "self_attn.k_norm.weight", hd);
      }
      add_vector(p + "post_attention_layernorm.weight", H);
      if (transformer_moe) {
        add_router(p + "mlp.gate.weight", config.num_experts);
        add_per_expert(p);
      } else {
        add_matrix(p + "mlp.gate_proj.weight", F, H);
        add_matrix(p + "mlp.up_proj.weight", F, H);
        add_matrix(p + "mlp.down_proj.weight", H, F);
      }
    }
  } else {
    const int64_t Hk = config.linear_num_key_heads, Hv = config.linear_num_value_heads;
    const int64_t dk = config.linear_key_head_dim, dv = config.linear_value_head_dim, K = config.linear_conv_kernel_dim;
    const int64_t KD = Hk * dk, VD = Hv * dv, CD = 2 * KD + VD;
    // Value-head reorder (identity when Hk == Hv or not tiled) for rows / elements in units
    // of `width`.
    auto vmap = [Hk, Hv, tiled](int64_t width) {
      return [Hk, Hv, width, tiled](int64_t i) { return tiled ? v_head_source(i, Hk, Hv, width) : i; };
    };
    // One decoder block; `p` the HF prefix, `b` the GGUF prefix, full = full attention.
    auto add_block = [&](const std::string& p, bool full) {
      add_vector(p + "input_layernorm.weight", H, plus_one);
      if (full) {
        add_matrix(p + "self_attn.q_proj.weight", 2 * q_out, H);
        add_matrix(p + "self_attn.k_proj.weight", kv_out, H);
        add_matrix(p + "self_attn.v_proj.weight", kv_out, H);
        add_matrix(p + "self_attn.o_proj.weight", H, q_out);
        add_vector(p + "self_attn.q_norm.weight", hd, plus_one);
        add_vector(p + "self_attn.k_norm.weight", hd, plus_one);
      } else {
        const std::string a = p + "linear_attn.";
        if (fused_gdn) {
          // in_proj_qkvz, per key-head group g: q (dk) | k (dk) | v (r dv) | z (r dv), as
          // llama.cpp's converter de-interleaves it: attn_qkv = every q | every k | every v
          // (value heads in HF's order), attn_gate = the z rows; in_proj_ba is ssm_ba as is.
          const std::string qkvz = a + "in_proj_qkvz.weight";
          const TensorInfo& t = source(qkvz, {CD + VD, H});
          const int64_t rv = Hv / Hk * dv, group = 2 * dk + 2 * rv;
          const std::string qkv = gguf_name(qkvz);
          add_rows(qkv, t, CD, H, [=](int64_t r) {
            if (r < 2 * KD) return (r % KD / dk) * group + (r < KD ? 0 : dk) + r % dk;  // q, k
            return ((r - 2 * KD) / rv) * group + 2 * dk + (r - 2 * KD) % rv;  // v
          });
          std::string gate = qkv;
          gate.replace(gate.rfind("attn_qkv"), 8, "attn_gate");
          add_rows(gate, t, VD, H, [=](int64_t r) { return (r / rv) * group + 2 * dk + rv + r % rv; });
          add_matrix(a + "in_proj_ba.weight", 2 * Hv, H);
        } else {
          add_matrix(a + "in_proj_qkv.weight", CD, H,
                     [&, vm = vmap(dv)](int64_t r) { return r < 2 * KD ? r : 2 * KD + vm(r - 2 * KD); });
          add_matrix(a + "in_proj_z.weight", VD, H, vmap(dv));
          add_matrix(a + "in_proj_b.weight", Hv, H, vmap(1));
          add_matrix(a + "in_proj_a.weight", Hv, H, vmap(1));
        }
        {
          // conv1d.weight [CD, 1, K] -> ne {K, CD}, value channels reordered.
          const TensorInfo& t = source(a + "conv1d.weight", {CD, 1, K});
          std::vector<float> w(static_cast<size_t>(CD * K));
          row_to_f32(t.data, t.dtype, w.size(), w.data());
          ExportTensor e;
          e.name = gguf_name(a + "conv1d.weight");
          e.cols = K;
          e.dims = {static_cast<uint64_t>(K), static_cast<uint64_t>(CD)};
          const auto vm = vmap(dv);
          for (int64_t c = 0; c < CD; ++c) {
            const int64_t src = c < 2 * KD ? c : 2 * KD + vm(c - 2 * KD);
            e.values.insert(e.values.end(), w.begin() + src * K, w.begin() + (src + 1) * K);
          }
          plan.push_back(std::move(e));
        }
        const auto vm1 = vmap(1);
        add_vector(a + "dt_bias", Hv, [vm1](const std::vector<float>& v, int64_t i) { return v[vm1(i)]; });
        add_vector(a + "A_log", Hv, [vm1](const std::vector<float>& v, int64_t i) { return -std::exp(v[vm1(i)]); });
        add_vector(a + "norm.weight", dv);  // RMSNormGated: plain weight
        std::vector<int64_t> cols;  // the value-head columns' sources (none: in place)
        for (int64_t i = 0; tiled && i < VD; ++i) cols.push_back(v_head_source(i, Hk, Hv, dv));
        add_matrix(a + "out_proj.weight", H, VD, nullptr, std::move(cols));
      }
      add_vector(p + "post_attention_layernorm.weight", H, plus_one);
      if (config.num_experts == 0) {
        add_matrix(p + "mlp.gate_proj.weight", F, H);
        add_matrix(p + "mlp.up_proj.weight", F, H);
        add_matrix(p + "mlp.down_proj.weight", H, F);
        return;
      }
      const int64_t E = config.num_experts, I = config.moe_intermediate_size,
                    S = config.shared_expert_intermediate_size;
      add_router(p + "mlp.gate.weight", E);
      if (stored_expert_layout(config, p + "mlp.", has) == ExpertLayout::kFused) {
        const TensorInfo& gu = source(p + "mlp.experts.gate_up_proj", {E, 2 * I, H});
        const TensorInfo& dn = source(p + "mlp.experts.down_proj", {E, H, I});
        // The table names the gate half; the up half is the matching ffn_up_exps.
        const std::string gate = gguf_name(p + "mlp.experts.gate_up_proj");
        std::string up = gate;
        up.replace(up.rfind("ffn_gate_exps"), 13, "ffn_up_exps");
        add_experts(gate, E, I, H, [&gu, I](int64_t x) { return RowSource{&gu, x * 2 * I}; });
        add_experts(up, E, I, H, [&gu, I](int64_t x) { return RowSource{&gu, x * 2 * I + I}; });
        add_experts(gguf_name(p + "mlp.experts.down_proj"), E, H, I, [&dn, H](int64_t x) {
          return RowSource{&dn, x * H};
        });
      } else {
        add_per_expert(p);
      }
      if (S > 0) {
        // shared_expert_gate [1, H] -> a vector ne {H} (llama.cpp's ffn_gate_inp_shexp).
        const TensorInfo& g = source(p + "mlp.shared_expert_gate.weight", {1, H});
        ExportTensor e;
        e.name = gguf_name(p + "mlp.shared_expert_gate.weight");
        e.cols = H;
        e.dims = {static_cast<uint64_t>(H)};
        e.values.resize(static_cast<size_t>(H));
        row_to_f32(g.data, g.dtype, e.values.size(), e.values.data());
        plan.push_back(std::move(e));
        add_matrix(p + "mlp.shared_expert.gate_proj.weight", S, H);
        add_matrix(p + "mlp.shared_expert.up_proj.weight", S, H);
        add_matrix(p + "mlp.shared_expert.down_proj.weight", H, S);
      }
    };
    for (int l = 0; l < config.num_layers; ++l) {
      add_block(lm + "layers." + std::to_string(l) + ".", !config.is_linear_attention_layer(l));
    }
    if (n_mtp > 0) {
      if (n_mtp > 1) fail("{}: {} MTP layers; llama.cpp loads a single MTP block", config_path, n_mtp);
      add_block("mtp.layers.0.", true);
      add_matrix("mtp.fc.weight", H, 2 * H);
      add_vector("mtp.pre_fc_norm_embedding.weight", H, plus_one);
      add_vector("mtp.pre_fc_norm_hidden.weight", H, plus_one);
      add_vector("mtp.norm.weight", H, plus_one);
    }
  }
  add_vector(lm + "norm.weight", H,
             hybrid ? std::function<float(const std::vector<float>&, int64_t)>(plus_one) : nullptr);
  if (!config.tie_word_embeddings) {
    if (store.find("lm_head.weight")) {
      add_matrix("lm_head.weight", V, H);
    } else {
      fail("{}: config.json says tie_word_embeddings is false but there is no 'lm_head.weight' tensor", model_dir);
    }
  }
  // Anything left over would be silently dropped: refuse instead.
  for (const std::string& n : store.names()) {
    if (used.count(n)) continue;
    if (n.ends_with("rotary_emb.inv_freq")) continue;  // recomputed by every runtime
    if (n == "lm_head.weight" && config.tie_word_embeddings) continue;  // tied copy
    if (hybrid && n.starts_with("model.visual.")) continue;  // Qwen3.5 vision tower (text-only GGUF)
    fail("{}: tensor '{}' has no GGUF counterpart for model_type {} (biases and extra heads are not supported)",
         model_dir, n, config.model_type);
  }

  std::unordered_map<std::string, std::vector<float>> imatrix;
  if (const auto mix = mix_of(options.out_type)) {
    if (options.imatrix) {
      imatrix = imatrix_importance(*options.imatrix);
    } else if (!options.imatrix_path.empty()) {
      imatrix = load_imatrix_importance(options.imatrix_path);
    }
    QuantMixModel model;
    const Value* blocks = writer.find(hp + "block_count");
    model.n_layer = blocks ? static_cast<int>(blocks->to_u64()) : config.num_layers;
    model.n_head = config.num_heads;
    const Value* kv = writer.find(hp + "attention.head_count_kv");
    model.n_head_kv = kv ? static_cast<int>(kv->to_u64()) : config.num_kv_heads;
    // llama.cpp's own llama architecture is the one whose q/k rows its converter permutes.
    model.llama_70b = permute_qk && model.n_layer == 80 && model.n_head != model.n_head_kv;
    model.n_expert = config.num_experts;
    model.has_imatrix = options.imatrix != nullptr || !options.imatrix_path.empty();
    std::vector<QuantMixTensor> tensors;
    tensors.reserve(plan.size());
    for (const ExportTensor& e : plan) tensors.push_back({e.name, e.dims, e.type});
    // q4_0 keeps what it wrote before the mixes: every matrix Q4_0 (llama-quantize --pure).
    const bool pure = options.out_type == GgufOutType::kQ4_0;
    const std::vector<GgmlType> types = choose_mix_types(*mix, model, tensors, pure);
    for (size_t i = 0; i < plan.size(); ++i) {
      ExportTensor& e = plan[i];
      e.type = types[i];
      if (!kernels::ggml::can_quantize(static_cast<uint32_t>(e.type))) continue;
      auto it = imatrix.find(e.name);
      if (it == imatrix.end()) continue;
      const uint64_t matrices = e.dims.size() > 2 ? e.dims[2] : 1;
      if (it->second.size() != e.dims[0] * matrices) {
        // As llama-quantize: a mismatch is an error, except for the token embedding (which
        // an imatrix run often records with another shape); that one goes without.
        if (e.name == "token_embd.weight") continue;
        fail("{}: importance matrix for '{}' has {} values, the tensor needs {}",
             options.imatrix ? std::string("the calibration") : options.imatrix_path, e.name, it->second.size(),
             e.dims[0] * matrices);
      }
      e.imatrix = &it->second;
    }
  }

  for (const ExportTensor& e : plan) {
    const ExportTensor* ep = &e;
    writer.add_tensor(e.name, e.type, e.dims, [ep](gguf::ByteSink& out) { stream_tensor(*ep, out); });
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
