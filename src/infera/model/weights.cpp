#include "infera/model/weights.h"

#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "infera/base/error.h"
#include "infera/base/load_progress.h"
#include "infera/kernels/ggml_quants.h"

namespace infera {

kernels::MatRef as_matrix(const TensorInfo& t) {
  if (t.shape.size() != 2) fail("{}: tensor '{}' should be 2-D", t.file, t.name);
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16 && t.dtype != DType::kGgml) {
    fail("{}: tensor '{}' has dtype {}; matrices must be f32, bf16 or f16", t.file, t.name, dtype_name(t.dtype));
  }
  return kernels::MatRef{t.data, t.dtype, t.shape[0], t.shape[1], t.ggml_type};
}

int64_t matrix_bytes(const kernels::MatRef& m) { return m.rows * kernels::row_bytes(m); }

void to_f32(const void* src, DType dtype, int64_t n, float* out) {
  switch (dtype) {
    case DType::kF32: std::memcpy(out, src, n * sizeof(float)); return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(s[i]);
      return;
    }
    default: fail("cannot convert {} to f32", dtype_name(dtype));
  }
}

std::vector<float> load_vector(const WeightStore& store, const std::string& name, int64_t n) {
  const TensorInfo& t = store.get(name, {n});
  std::vector<float> v(n);
  to_f32(t.data, t.dtype, n, v.data());
  return v;
}

void embedding_row(const TensorInfo& table, int64_t row, float* out) {
  const int64_t h = table.shape[1];
  if (table.dtype == DType::kGgml) {
    const int64_t rb = kernels::ggml::row_bytes(table.ggml_type, h);
    kernels::ggml::dequantize_row(table.ggml_type, table.data + row * rb, out, h);
    return;
  }
  const uint8_t* p = table.data + row * h * static_cast<int64_t>(dtype_size(table.dtype));
  to_f32(p, table.dtype, h, out);
}

int stored_mtp_layers(const std::function<bool(const std::string& name)>& has_tensor) {
  if (!has_tensor("mtp.fc.weight") && !has_tensor("mtp.fc.weight.qweight")) return 0;
  int n = 0;
  while (has_tensor("mtp.layers." + std::to_string(n) + ".input_layernorm.weight")) ++n;
  return n;
}

int stored_mtp_layers(const WeightStore& store) {
  return stored_mtp_layers([&store](const std::string& name) { return store.find(name) != nullptr; });
}

}  // namespace infera

namespace infera {

// ---- SafetensorsSource ----

SafetensorsSource::SafetensorsSource(std::shared_ptr<const WeightStore> store, QuantizationConfig qc)
    : store_(std::move(store)), qc_(std::move(qc)), lanes_(panel_lanes_for(*store_)) {}

SafetensorsSource::SafetensorsSource(WeightStore store, QuantizationConfig qc)
    : SafetensorsSource(std::make_shared<const WeightStore>(std::move(store)), std::move(qc)) {}

std::unique_ptr<SafetensorsSource> SafetensorsSource::open(const std::string& dir, bool load_into_memory,
                                                           LoadProgress* progress) {
  WeightStore store = WeightStore::open(dir, load_into_memory, progress);
  // A checkpoint written by `infera quantize` says in config.json how each layer is stored.
  QuantizationConfig qc = read_quantization_config(store.dir());
  return std::make_unique<SafetensorsSource>(std::move(store), std::move(qc));
}

std::unique_ptr<SafetensorsSource> SafetensorsSource::view(const WeightStore& store, QuantizationConfig qc) {
  std::shared_ptr<const WeightStore> borrowed(&store, [](const WeightStore*) {});
  return std::unique_ptr<SafetensorsSource>(new SafetensorsSource(std::move(borrowed), std::move(qc)));
}

HasTensor SafetensorsSource::has_tensor() const {
  return [store = store_](const std::string& name) { return store->find(name) != nullptr; };
}

bool SafetensorsSource::has(const TensorSpec& t) const {
  return store_->find(t.name) != nullptr || store_->find(t.name + ".qweight") != nullptr;
}

kernels::LinearWeight SafetensorsSource::linear(const TensorSpec& t) const {
  if (t.shape.size() != 2) fail("{}: tensor '{}' is not a matrix in the tensor table", store_->dir(), t.name);
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const bool plain_ok = plain_fallback_ || t.role == WeightRole::kFloat;
  const TensorInfo* stored = store_->find(t.name);
  // Bound as stored: a plain tensor of a quantized checkpoint where that is allowed, and a
  // GGUF token embedding, read by rows (linear_row), so without panels: a panel copy would sit
  // beside the rows that the lookups fault back in (tied, the head then reads the rows too).
  const bool plain = plain_ok && qc_.present && !qc_.overrides.contains(t.name) && !store_->find(t.name + ".qweight");
  const bool gguf_embedding = t.role == WeightRole::kEmbedding && stored && stored->dtype == DType::kGgml;
  if (stored && (plain || gguf_embedding)) {
    const TensorInfo& info = store_->get(t.name, {rows, cols});
    return kernels::dense_linear(as_matrix(info), info.name);
  }
  return bind_linear(*store_, t.name, rows, cols, qc_, lanes_, panels_);
}

std::vector<kernels::LinearWeight> SafetensorsSource::experts(const std::vector<const TensorSpec*>& parts) const {
  // One look at the process's mappings for all of them (release_repacked_source).
  const FileMappings maps = qc_.present && quant_repack_enabled() ? FileMappings::current() : FileMappings{};
  if (parts.size() == 1 && parts[0]->shape.size() == 3) {
    const std::vector<int64_t>& s = parts[0]->shape;
    return bind_experts(*store_, parts[0]->name, s[0], s[1], s[2], qc_, true, maps, lanes_, panels_);
  }
  std::vector<kernels::LinearWeight> out;
  out.reserve(parts.size());
  for (const TensorSpec* p : parts) {
    if (p->shape.size() != 2)
      fail("{}: expert tensor '{}' is not a matrix in the tensor table", store_->dir(), p->name);
    out.push_back(bind_experts(*store_, p->name, 1, p->shape[0], p->shape[1], qc_, false, maps, lanes_, panels_)[0]);
  }
  return out;
}

std::vector<float> SafetensorsSource::values(const TensorSpec& t) const {
  const std::vector<int64_t>& s = t.shape;
  const TensorInfo* info = nullptr;
  switch (s.size()) {
    case 1: info = &store_->get(t.name, {s[0]}); break;
    case 2: info = &store_->get(t.name, {s[0], s[1]}); break;
    case 3: info = &store_->get(t.name, {s[0], s[1], s[2]}); break;
    default: fail("{}: tensor '{}' has {} dimensions in the tensor table", store_->dir(), t.name, s.size());
  }
  std::vector<float> v(static_cast<size_t>(t.numel()));
  to_f32(info->data, info->dtype, t.numel(), v.data());
  return v;
}

int64_t SafetensorsSource::num_parameters() const {
  int64_t n = 0;
  for (const auto& name : store_->names()) {
    if (!name.starts_with("model.visual.")) n += store_->get(name).numel();  // a VLM's vision tower: not run
  }
  return n;
}

int64_t SafetensorsSource::stored_bytes(const TensorSpec& t) const {
  int64_t n = 0;
  for (const std::string& name : {t.name, t.name + ".qweight", t.name + ".scales"}) {
    if (const TensorInfo* info = store_->find(name)) n += static_cast<int64_t>(info->nbytes);
  }
  return n;
}

// ---- ModelWeights ----

struct ModelWeights::Progress {
  std::shared_ptr<LoadProgress> progress;
  std::mutex mutex;
  std::vector<bool> bound;  // per table row
};

ModelWeights::ModelWeights(const ModelConfig& cfg, std::unique_ptr<WeightSource> source)
    : ModelWeights(cfg, std::move(source), {}) {
  table_ = tensor_table(cfg_, source_->has_tensor());
  for (size_t i = 0; i < table_.size(); ++i)
    index_.emplace(std::make_tuple(table_[i].layer, table_[i].slot, table_[i].expert), i);
}

ModelWeights::ModelWeights(const ModelConfig& cfg, std::unique_ptr<WeightSource> source, std::vector<TensorSpec> table)
    : cfg_(cfg), source_(std::move(source)), table_(std::move(table)) {
  for (size_t i = 0; i < table_.size(); ++i)
    index_.emplace(std::make_tuple(table_[i].layer, table_[i].slot, table_[i].expert), i);
}

void ModelWeights::report_progress(std::shared_ptr<LoadProgress> progress) {
  if (!progress) {
    progress_.reset();
    return;
  }
  int64_t total = 0;
  for (const TensorSpec& t : table_) total += source_->stored_bytes(t);
  progress_ = std::make_unique<Progress>();
  progress_->progress = std::move(progress);
  progress_->bound.assign(table_.size(), false);
  progress_->progress->begin("binding", total);
}

void ModelWeights::bound(const TensorSpec& t) const {
  if (!progress_) return;
  const auto row = static_cast<size_t>(&t - table_.data());
  {
    std::lock_guard lock(progress_->mutex);
    if (row >= progress_->bound.size() || progress_->bound[row]) return;
    progress_->bound[row] = true;
  }
  progress_->progress->advance(source_->stored_bytes(t));
}

ModelWeights::ModelWeights(ModelWeights&&) noexcept = default;
ModelWeights& ModelWeights::operator=(ModelWeights&&) noexcept = default;
ModelWeights::~ModelWeights() = default;

const TensorSpec* ModelWeights::find(int layer, std::string_view slot, int expert) const {
  auto it = index_.find(std::make_tuple(layer, std::string(slot), expert));
  return it == index_.end() ? nullptr : &table_[it->second];
}

const TensorSpec& ModelWeights::spec(int layer, std::string_view slot, int expert) const {
  if (const TensorSpec* t = find(layer, slot, expert)) return *t;
  const std::string what = expert >= 0 ? fmt::format("expert {} of ", expert) : std::string();
  fail("{}: the {} tensor table has no '{}' for {}{} (config.json and the model file disagree)", where(),
       arch_name(cfg_.arch), slot, what, layer < 0 ? std::string("the model") : fmt::format("layer {}", layer));
}

bool ModelWeights::has(int layer, std::string_view slot) const {
  const TensorSpec* t = find(layer, slot);
  if (t == nullptr) t = find(layer, slot, 0);
  return t != nullptr && source_->has(*t);
}

kernels::LinearWeight ModelWeights::linear(int layer, std::string_view slot) const {
  const TensorSpec& t = spec(layer, slot);
  kernels::LinearWeight w = source_->linear(t);
  bound(t);
  return w;
}

kernels::MatRef ModelWeights::matrix(int layer, std::string_view slot) const {
  const TensorSpec& t = spec(layer, slot);
  const kernels::LinearWeight w = source_->linear(t);
  bound(t);
  if (w.quantized) fail("{}: tensor '{}' is quantized; it must be stored as float (f32, bf16 or f16)", where(), t.name);
  return w.dense;
}

std::vector<float> ModelWeights::vector(int layer, std::string_view slot) const {
  const TensorSpec& t = spec(layer, slot);
  std::vector<float> v = source_->values(t);
  bound(t);
  return v;
}

std::vector<kernels::LinearWeight> ModelWeights::experts(int layer, std::string_view slot) const {
  std::vector<const TensorSpec*> parts;
  if (const TensorSpec* fused = find(layer, slot)) {
    parts.push_back(fused);
  } else {
    for (int e = 0; e < cfg_.num_experts; ++e) parts.push_back(&spec(layer, slot, e));
  }
  std::vector<kernels::LinearWeight> out = source_->experts(parts);
  for (const TensorSpec* t : parts) bound(*t);
  return out;
}

}  // namespace infera
