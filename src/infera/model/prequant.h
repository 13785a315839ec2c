// Pre-quantized checkpoints as published (FP8, compressed-tensors, GPTQ, AWQ, msModelSlim):
// the seam every such format plugs into (docs/quantization.md, "Pre-quantized checkpoints").
//
// A format (PrequantFormat) is detected from the directory's config.json quantization_config
// (or a description file such as msModelSlim's quant_model_description.json) and answers three
// questions about a logical linear weight, named as the tensor table names it
// ("model.layers.0.mlp.up_proj.weight"):
//   quantizes()   is it stored quantized (false: a plain float tensor, e.g. an ignored module);
//   locate()      its stored tensors, found, grouped and validated (dtypes, shapes, scale
//                 shapes, group sizes), or an infera::Error naming the tensor and what is wrong;
//   int_rows() /  its values, rows at a time: as integers with per-group scales and zeros
//   dequantize_rows()  (integer formats), or as f32 (every format).
// The seam (PrequantSource) turns that into the engine's weights, the native schemes of
// kernels/quant.h, without a float copy of the matrix:
//   exact       integer weights whose values and groups the native layout holds: symmetric
//               int4 with a group a multiple of 32 (channel included) -> W4A16 / W4A8;
//               symmetric int8 (or int4) per channel -> W8A8 (int8 used in place when stored so);
//   requantized anything else (FP8, asymmetric zeros, int8 groups): rows dequantized to f32 a
//               few at a time and quantized to the target scheme; the worst error is recorded
//               (PrequantStats) and logged.
// Plain tensors (norms, embeddings, ignored modules) bind as in a float checkpoint.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infera/io/safetensors.h"
#include "infera/kernels/quant.h"
#include "infera/model/weights.h"

namespace infera {

// ---- What a format reports ----

enum class PrequantKind : uint8_t {
  kInt,  // integers: W = scale * (q - zero) per group along the input (int_rows)
  kFloat,  // floats with scales (FP8): only dequantize_rows
};

// A logical linear weight [experts x] [rows, cols] as stored, after locate() validated it.
// rows = output features, cols = input features (nn.Linear's [O, I]), whatever the stored
// orientation. Per-expert checkpoints give one StoredLinear per expert (experts = 1); a fused
// [E, rows, cols] tensor gives experts = E and its rows are addressed as one [E * rows, cols]
// matrix.
struct StoredLinear {
  std::string name;  // the logical name, "<module>.weight"
  std::string label;  // how it is stored, for messages: "fp8 block 128x128", "int4 g128 sym"
  PrequantKind kind = PrequantKind::kInt;
  int bits = 8;  // integer bits (2..8); 8 for FP8
  int64_t experts = 1;
  int64_t rows = 0, cols = 0;  // one expert's matrix
  // kInt: the group along cols that int_rows gives one scale (and zero) per; cols when per
  // channel. kFloat: 0 (its scales need not be groups along a row).
  int64_t group_size = 0;
  bool symmetric = true;  // kInt: every zero is 0 (int_rows leaves IntRows::zero empty)
  // kInt: column c's group is a stored index (GPTQ desc_act / compressed-tensors actorder
  // g_idx), not c / group_size. int_rows is then unavailable: the format implements
  // dequantize_rows and the seam requantizes.
  bool permuted = false;
  // The checkpoint's own scheme quantizes activations (int8 or fp8 per token): the automatic
  // target of an int4 weight is then W4A8 rather than W4A16.
  bool quantized_activations = false;
  // FP8 e4m3 bytes [total_rows, cols] (part "weight") the kernels can decode as stored (W8A16):
  // columns per scale group (the last group of a row may be shorter: ragged edge blocks), the
  // scales given by PrequantFormat::fp8_scales. 0: not FP8.
  int64_t fp8_group = 0;
  // The stored tensors by their role in the format ("weight", "weight_scale", "qweight", ...).
  std::map<std::string, const TensorInfo*> parts;
  // Set by formats that keep per-weight state of their own (pointers, decoded options).
  std::shared_ptr<const void> state;

  int64_t total_rows() const { return experts * rows; }
  int64_t groups() const { return group_size > 0 ? cols / group_size : 0; }
  int64_t stored_bytes() const;  // sum of the parts' bytes
  const TensorInfo& part(const std::string& role) const;  // throws naming the role
};

// Integer rows [r0, r1) of a kInt weight: W[r, c] = scale[r, g] * (q[r, c] - zero[r, g]),
// g = c / group_size. q is signed (an unsigned format subtracts its offset: uint4 v -> v - 8,
// zeros likewise), so a symmetric format's zeros are all 0.
struct IntRows {
  int64_t rows = 0, cols = 0, group_size = 0;
  std::vector<int8_t> q;  // [rows, cols]
  std::vector<int8_t> zero;  // [rows, groups]; empty when symmetric
  std::vector<float> scale;  // [rows, groups]
  void resize(int64_t rows_, int64_t cols_, int64_t group_size_, bool symmetric);
};

// One published format. Implementations are stateless after construction (their config
// parsed once) and must only read TensorInfo metadata in quantizes() / locate() (`infera
// check` calls them over headers, where TensorInfo::data is null).
class PrequantFormat {
 public:
  virtual ~PrequantFormat() = default;
  // The method as config.json names it: "fp8", "compressed-tensors", "gptq", "awq", "msmodelslim".
  virtual std::string method() const = 0;
  // One line for logs and `infera check`: "fp8 e4m3, block 128x128, dynamic activations".
  virtual std::string summary() const = 0;
  // Whether `name` (a tensor-table matrix name ending in ".weight") is stored quantized.
  // False: the checkpoint stores it as a plain float tensor under `name`.
  virtual bool quantizes(const WeightStore& store, const std::string& name) const = 0;
  // Whether the checkpoint stores `name` in any form (the tensor table's layout probes and
  // optional weights ask). The default: `name` itself, or "<module>.qweight" /
  // "<module>.weight_packed".
  virtual bool stores(const WeightStore& store, const std::string& name) const;
  // The stored tensors of `name`, expected [experts, rows, cols] when experts > 1 (fused) or
  // [rows, cols]: found, grouped and checked. Throws infera::Error naming the directory, the
  // tensor and what is wrong (missing tensor, dtype, shape, scale shape, group size).
  virtual StoredLinear locate(const WeightStore& store, const std::string& name, int64_t experts, int64_t rows,
                              int64_t cols) const = 0;
  // Rows [r0, r1) of the [total_rows, cols] matrix in integer form (kInt only).
  virtual void int_rows(const StoredLinear& w, int64_t r0, int64_t r1, IntRows& out) const;
  // Rows [r0, r1) dequantized to f32 [r1 - r0, cols] (every kind; the reference for tests).
  // The default goes through int_rows.
  virtual void dequantize_rows(const StoredLinear& w, int64_t r0, int64_t r1, float* out) const;
  // Optional zero-copy binding, asked only for an exact plan (plan_native): the stored
  // integers already are the native layout of `scheme` (int8 [rows, cols] for W8A8), so `out`
  // points into the checkpoint; small buffers the format converts (scales to f32) go to
  // `owned`. False: the seam converts.
  virtual bool bind_in_place(const StoredLinear& w, kernels::QuantScheme scheme, kernels::QuantMatRef& out,
                             std::vector<std::shared_ptr<void>>& owned) const;
  // Whether bind_in_place binds `w` onto `scheme` exactly even where plan_native would
  // requantize (asymmetric zeros, a g_idx order), carrying what the symmetric scheme lacks as
  // kernels::QuantExtras on `out` (GPTQ / AWQ). bind_in_place may still decline (false).
  virtual bool binds_exactly(const StoredLinear& /*w*/, kernels::QuantScheme /*scheme*/) const { return false; }
  // Fused experts (w.experts > 1) whose native forms cannot share one matrix: each expert bound
  // exactly as a matrix of its own, w.experts of them appended to `out` (GPTQ act-order: one
  // input permutation per expert, where the kernels take one per matrix). Asked before
  // bind_in_place when the plan is exact or binds_exactly; false: the [experts · rows, cols]
  // matrix is bound as one.
  virtual bool bind_experts_apart(const StoredLinear& /*w*/, kernels::QuantScheme /*scheme*/,
                                  std::vector<kernels::QuantMatRef>& /*out*/,
                                  std::vector<std::shared_ptr<void>>& /*owned*/) const {
    return false;
  }
  // FP8 weights (w.fp8_group > 0): the f32 scale of every row's groups of fp8_group columns,
  // [total_rows, ceil(cols / fp8_group)] into `out` (W8A16 binds the e4m3 bytes in place).
  virtual void fp8_scales(const StoredLinear& w, float* out) const;
  // Stored tensors that belong to quantized layers but no kernel reads (activation scales of
  // dynamic schemes, weight_shape): `infera check` counts them as used, not as foreign.
  virtual bool is_auxiliary(const std::string& tensor_name) const { return false; }
};

// The files a format is detected from.
struct PrequantFiles {
  std::string dir;
  nlohmann::json quantization_config;  // config.json's (null when absent)
  nlohmann::json description;  // quant_model_description.json (null when absent)
};

// The format of a model directory: nullptr for a float checkpoint or one written by `infera
// quantize` (quant_method "infera"). Throws infera::Error (naming the file and the field) for
// a quant_method that is not supported, or a supported one with a variant that is not
// (for example GPTQ 3-bit): never loaded wrongly.
std::unique_ptr<PrequantFormat> detect_prequant(const std::string& dir);
std::unique_ptr<PrequantFormat> detect_prequant(const PrequantFiles& files);

// ---- What the seam does with it ----

// The native scheme pre-quantized weights run as. kAuto: per weight, the scheme closest to
// the checkpoint's own arithmetic (int4 -> W4A16, or W4A8 when the checkpoint quantizes
// activations; int8 and FP8 -> W8A8). The option
// `prequant_scheme` (INFERA_PREQUANT_SCHEME) picks one for all weights.
enum class PrequantTarget : uint8_t { kAuto, kW8A8, kW4A8, kW4A16 };
PrequantTarget prequant_target_from_options();  // throws for a bad option value

// How FP8 weights run when the target is not an int4 scheme (option `prequant_fp8`,
// INFERA_PREQUANT_FP8): kW8A8 requantized to int8 per row (int8 activations per token), or
// kW8A16 (the e4m3 bytes decoded in the kernel, f32 activations, in place). kAuto: the
// default, kFp8AutoMode, under the automatic target, and W8A8 when the target is w8a8.
enum class Fp8Mode : uint8_t { kAuto, kW8A8, kW8A16 };
Fp8Mode prequant_fp8_from_options();  // throws for a bad option value
// What kAuto means under the automatic target (docs/quantization.md "FP8" gives the measurements).
inline constexpr Fp8Mode kFp8AutoMode = Fp8Mode::kW8A8;

// How one weight was converted.
struct PrequantStats {
  int64_t weights = 0;  // logical weights converted (an expert counts once)
  int64_t exact = 0;  // of which mapped without requantization
  int64_t in_place = 0;  // of which bound zero-copy
  int64_t stored_bytes = 0;  // their bytes in the checkpoint
  int64_t native_bytes = 0;  // their bytes in the native layout (without the repacked copy)
  // Requantized weights: the largest |W - W'| / max|W row| over all rows (0 when all exact).
  double max_rel_error = 0;
  std::string worst;  // the weight with that error
};

// The native scheme and group `w` becomes under `target`, and whether exactly.
struct NativePlan {
  kernels::QuantScheme scheme = kernels::QuantScheme::kW8A8;
  int64_t group_size = 0;  // int4: 32/64/128; W8A8: cols
  bool exact = false;
  // W8A16: the FP8 bytes in place with their scales (kernels::QuantExtras::fp8_group); the
  // scheme says w8a8 (the layout of one byte per weight). Exact.
  bool fp8 = false;
};
NativePlan plan_native(const StoredLinear& w, PrequantTarget target, Fp8Mode fp8 = Fp8Mode::kAuto);
// Bytes of the native layout of a [rows, cols] matrix (qweight + scales; FP8: the bytes and
// the scales of w.fp8_group columns).
int64_t native_bytes(const NativePlan& p, int64_t rows, int64_t cols, int64_t fp8_group = 0);

// The whole [total_rows, cols] matrix converted to the native layout p says; the buffers it
// points into are appended to `owned` (the caller keeps them alive). `stats` accumulates.
kernels::QuantMatRef convert_to_native(const PrequantFormat& f, const StoredLinear& w, const NativePlan& p,
                                       std::vector<std::shared_ptr<void>>& owned, PrequantStats& stats);

// A directory in a pre-quantized format, bound by role: quantized linear weights converted
// (above), everything else as SafetensorsSource binds a float checkpoint. A quantized matrix
// the model keeps as float (WeightRole::kFloat, or read through values(): DeepSeek's kv_b_proj)
// is dequantized to f32 (small matrices).
class PrequantSource final : public WeightSource {
 public:
  PrequantSource(WeightStore store, std::unique_ptr<PrequantFormat> format, PrequantTarget target,
                 Fp8Mode fp8 = Fp8Mode::kAuto);
  // nullptr when `dir` is not pre-quantized (detect_prequant). `progress`: as WeightStore::open
  // (the "reading" step when load_into_memory).
  static std::unique_ptr<PrequantSource> open(const std::string& dir, bool load_into_memory = false,
                                              LoadProgress* progress = nullptr);

  const WeightStore& store() const { return plain_->store(); }
  const PrequantFormat& format() const { return *format_; }
  void set_plain_fallback(bool on) { plain_->set_plain_fallback(on); }
  PrequantStats stats() const;

  const std::string& where() const override { return plain_->where(); }
  HasTensor has_tensor() const override;
  bool has(const TensorSpec& t) const override;
  kernels::LinearWeight linear(const TensorSpec& t) const override;
  std::vector<kernels::LinearWeight> experts(const std::vector<const TensorSpec*>& parts) const override;
  std::vector<float> values(const TensorSpec& t) const override;
  int64_t num_parameters() const override;
  // A quantized row: every stored part of it (FP8 bytes and scales, qweight / qzeros /
  // scales / g_idx, msModelSlim's weight and its constants); a plain row as a float
  // checkpoint's. A row the format cannot locate counts what is stored under its name.
  int64_t stored_bytes(const TensorSpec& t) const override;

 private:
  std::vector<kernels::LinearWeight> bind(const std::string& name, int64_t experts, int64_t rows, int64_t cols) const;

  std::unique_ptr<SafetensorsSource> plain_;
  std::unique_ptr<PrequantFormat> format_;
  PrequantTarget target_;
  Fp8Mode fp8_;
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<void>> owned_;  // converted weights' buffers
  mutable PrequantStats stats_;
};

// `infera check` / `infera plan` over a checkpoint's headers (TensorInfo::data may be null):
// every quantized matrix of the table located and validated.
struct PrequantReport {
  std::string summary;  // PrequantFormat::summary()
  int64_t quantized = 0;  // logical weights stored quantized (experts one each)
  int64_t plain = 0;  // matrices of the table stored as float
  int64_t exact = 0;  // of the quantized: mapped exactly onto the native scheme
  int64_t dequantized = 0;  // stored quantized, held as f32 (WeightRole::kFloat)
  int64_t stored_bytes = 0;  // quantized weights' bytes as stored
  int64_t native_bytes = 0;  // their bytes once converted (without the repacked copy)
  std::vector<std::string> errors;  // one per bad weight (the locate() message)
  std::vector<std::string> used;  // stored tensor names the quantized weights read
};
PrequantReport check_prequant(const PrequantFormat& f, const WeightStore& store, const std::vector<TensorSpec>& table,
                              PrequantTarget target = PrequantTarget::kAuto, Fp8Mode fp8 = Fp8Mode::kAuto);

// ---- Helpers for formats ----

// "<dir>: tensor '<name>' <what>": the message shape every format uses.
[[noreturn]] void prequant_fail(const WeightStore& store, const std::string& tensor, const std::string& what);
// The tensor, or prequant_fail "is missing (<why>)".
const TensorInfo& prequant_need(const WeightStore& store, const std::string& name, const std::string& why);
// Checks dtype (one of `dtypes`) and shape; prequant_fail naming expected and found.
void prequant_expect(const WeightStore& store, const TensorInfo& t, std::initializer_list<DType> dtypes,
                     const std::vector<int64_t>& shape);
// A scale or zero stored in any float dtype (f32, bf16, f16), element i, as f32.
float prequant_scalar(const TensorInfo& t, int64_t i);
// "<module>.weight" -> "<module>" ("" when the name has no ".weight" suffix).
std::string prequant_module(const std::string& weight_name);

// float8 e4m3fn (bias 7, no infinities, 0x7f/0xff NaN) to f32.
float fp8_e4m3_to_f32(uint8_t v);

}  // namespace infera
