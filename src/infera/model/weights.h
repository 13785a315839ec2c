// Binding checkpoint tensors to kernel views. Model files ask for their weights by role,
// (layer, slot) of the architecture's tensor table (ModelWeights); a WeightSource answers
// for one checkpoint format (SafetensorsSource: Hugging Face directories, float or written
// by `infera quantize`). Low-level helpers for the sources follow.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "infera/io/safetensors.h"
#include "infera/kernels/kernels.h"
#include "infera/model/quantized_weights.h"
#include "infera/model/tensor_table.h"

namespace infera {

// A 2-D tensor used in place (no copy) as a kernel weight matrix.
kernels::MatRef as_matrix(const TensorInfo& t);
int64_t matrix_bytes(const kernels::MatRef& m);
// Small 1-D tensors (norm weights, biases) converted to f32.
std::vector<float> load_vector(const WeightStore& store, const std::string& name, int64_t n);
// Row `row` of an embedding table [V, H] converted to f32.
void embedding_row(const TensorInfo& table, int64_t row, float* out);
void to_f32(const void* src, DType dtype, int64_t n, float* out);

// MTP layers the checkpoint stores: mtp.fc (plain or quantized) and mtp.layers.{n}.*; 0 when
// there is no MTP head. Qwen3-Next's config.json does not declare its head; the tensors do.
int stored_mtp_layers(const std::function<bool(const std::string& name)>& has_tensor);
int stored_mtp_layers(const WeightStore& store);

// ---- Binding by role ----

// One checkpoint format's answer to "the tensor this table row describes". A source owns
// (or keeps alive) the memory its views point into. Every method throws infera::Error
// naming the tensor and where() when it is missing, mis-shaped or of an unusable type.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The checkpoint, for messages (a directory or a file).
  virtual const std::string& where() const = 0;
  // Probe of the Hugging Face names the checkpoint stores, for tensor_table()'s per-
  // checkpoint choices (text prefix, expert layout, MTP layers); nullptr: the table's
  // published layout.
  virtual HasTensor has_tensor() const = 0;
  // Whether the checkpoint stores this row's tensor (in any form).
  virtual bool has(const TensorSpec& t) const = 0;
  // A matrix [rows, cols] = t.shape, float or quantized, in place where the format allows.
  virtual kernels::LinearWeight linear(const TensorSpec& t) const = 0;
  // Routed experts of one slot: either one row of shape [E, rows, cols] (fused) or E rows
  // of [rows, cols] (per expert, in expert order); E matrices [rows, cols] either way.
  virtual std::vector<kernels::LinearWeight> experts(const std::vector<const TensorSpec*>& parts) const = 0;
  // Any tensor as t.numel() f32 values (norms, biases, conv weights).
  virtual std::vector<float> values(const TensorSpec& t) const = 0;
  // Parameters stored (quantized tensors counted as stored), for logs and `run --json`.
  virtual int64_t num_parameters() const = 0;
  // Bytes the checkpoint stores for this row (all of its parts), which binding it reads:
  // the unit of the load's "binding" step. The default estimates 2 bytes per element.
  virtual int64_t stored_bytes(const TensorSpec& t) const { return t.numel() * 2; }
};

// A Hugging Face directory's safetensors, plain or quantized as its config.json's
// quantization_config says (model/quantized_weights.h). In a quantized directory, a matrix
// the config names no override for is expected quantized (<name>.qweight), except matrices
// kept as stored (WeightRole::kFloat) and, with set_plain_fallback (the hybrids: GDN gate
// projections, directories quantized before their attention and GDN layers were), any
// matrix stored plainly: those bind the stored float tensor.
class SafetensorsSource final : public WeightSource {
 public:
  SafetensorsSource(WeightStore store, QuantizationConfig qc);
  // Opens the directory's weights and reads its quantization_config. `progress`: as
  // WeightStore::open.
  static std::unique_ptr<SafetensorsSource> open(const std::string& dir, bool load_into_memory = false,
                                                 LoadProgress* progress = nullptr);
  // Over a store the caller keeps alive (tests binding a lone block).
  static std::unique_ptr<SafetensorsSource> view(const WeightStore& store, QuantizationConfig qc);

  const WeightStore& store() const { return *store_; }
  void set_plain_fallback(bool on) { plain_fallback_ = on; }
  // GGUF matrices bound without their panels (bind_linear's `panels`): a tensor-parallel or
  // expert-parallel rank packs only the slices it keeps (TensorShard), so the whole model's
  // panels are never built in each rank.
  void defer_panels() {
    panels_ = false;
    lanes_.reset();
  }
  const QuantizationConfig& quantization() const { return qc_; }

  const std::string& where() const override { return store_->dir(); }
  HasTensor has_tensor() const override;
  bool has(const TensorSpec& t) const override;
  kernels::LinearWeight linear(const TensorSpec& t) const override;
  std::vector<kernels::LinearWeight> experts(const std::vector<const TensorSpec*>& parts) const override;
  std::vector<float> values(const TensorSpec& t) const override;
  int64_t num_parameters() const override;
  int64_t stored_bytes(const TensorSpec& t) const override;

 private:
  SafetensorsSource(std::shared_ptr<const WeightStore> store, QuantizationConfig qc);
  std::shared_ptr<const WeightStore> store_;
  QuantizationConfig qc_;
  bool plain_fallback_ = false;
  bool panels_ = true;
  std::shared_ptr<LaneBuffer> lanes_;  // the GGUF panels' lanes (panel_lanes_for), or null
};

// A model's weights by role: the architecture's tensor table for this checkpoint, and the
// source that binds its rows. Model files bind every weight as (layer, slot) (the slot
// vocabulary is in model/tensor_table.h; layer -1 for global tensors, num_layers + m for
// MTP layer m) and never spell a checkpoint's names. Binding happens when asked, so a
// model binds only what it uses (no MTP head on a tensor-parallel group, say).
class ModelWeights {
 public:
  // The table tensor_table(cfg, source->has_tensor()) gives.
  ModelWeights(const ModelConfig& cfg, std::unique_ptr<WeightSource> source);
  // Over given rows (a lone block: moe_block_table).
  ModelWeights(const ModelConfig& cfg, std::unique_ptr<WeightSource> source, std::vector<TensorSpec> table);
  ModelWeights(ModelWeights&&) noexcept;
  ModelWeights& operator=(ModelWeights&&) noexcept;
  ~ModelWeights();

  const ModelConfig& config() const { return cfg_; }
  const WeightSource& source() const { return *source_; }
  const std::string& where() const { return source_->where(); }
  const std::vector<TensorSpec>& table() const { return table_; }

  // The row (layer, slot[, expert]); nullptr when the table has none.
  const TensorSpec* find(int layer, std::string_view slot, int expert = -1) const;
  // The row, or infera::Error naming the slot, the layer and the architecture.
  const TensorSpec& spec(int layer, std::string_view slot, int expert = -1) const;
  // The table has the row and the checkpoint stores it.
  bool has(int layer, std::string_view slot) const;

  kernels::LinearWeight linear(int layer, std::string_view slot) const;
  // A float matrix kept as stored (MoE router, shared-expert gate).
  kernels::MatRef matrix(int layer, std::string_view slot) const;
  std::vector<float> vector(int layer, std::string_view slot) const;
  // The layer's routed experts of `slot`, fused or per expert (WeightSource::experts).
  std::vector<kernels::LinearWeight> experts(int layer, std::string_view slot) const;
  int64_t num_parameters() const { return source_->num_parameters(); }

  // Reports binding as the "binding" step of `progress` (base/load_progress.h): begins it
  // over the stored bytes of the table's rows; each row's bytes count once, when it is first
  // bound. The caller ends the step once the model has bound what it uses.
  void report_progress(std::shared_ptr<LoadProgress> progress);

 private:
  struct Progress;
  void bound(const TensorSpec& t) const;

  ModelConfig cfg_;
  std::unique_ptr<WeightSource> source_;
  std::vector<TensorSpec> table_;
  std::map<std::tuple<int, std::string, int>, size_t, std::less<>> index_;  // (layer, slot, expert) -> row
  std::unique_ptr<Progress> progress_;
};

}  // namespace infera
