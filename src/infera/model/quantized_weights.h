// Binding linear layers of a checkpoint that may be quantized by `infera quantize`.
//
// A quantized directory's config.json carries
//   "quantization_config": {"quant_method": "infera", "format_version": 1,
//     "scheme": "w8a8" | "w4a8" | "w4a16", "group_size": 32 | 64 | 128 (int4; w8a8: 0 = per channel),
//     "overrides": {"<tensor name>": {"scheme": "bf16" | "f32" | "w8a8" | ..., "group_size": N,
//                                     "reason": "..."}},
//     "calibration": {...} (informational)}
// and for every quantized linear layer "<name>" (e.g. model.layers.0.mlp.up_proj.weight)
// the safetensors hold "<name>.qweight" (w8a8: I8 [n, k]; int4: U8 [n, k / 2]) and
// "<name>.scales" (w8a8: F32 [n, 1]; int4: F16 [n, k / group_size]) instead of "<name>".
// Layers the config lists as bf16/f32 keep a plain "<name>". See docs/quantization.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "infera/base/membw.h"
#include "infera/io/safetensors.h"
#include "infera/kernels/quant.h"

namespace infera {

// How one layer is stored: quantized with a scheme, or dense (float dtype as stored).
struct LayerQuant {
  bool dense = true;
  kernels::QuantScheme scheme = kernels::QuantScheme::kW8A8;
  int64_t group_size = 0;  // int4: 32/64/128; w8a8: 0 (per channel)
  std::string dense_type;  // dense: "bf16", "f32", "f16" (what the writer chose)
  std::string reason;  // why this layer differs from the global scheme
  std::string label() const;  // "w4a8 g32", "w8a8", "bf16"
};

struct QuantizationConfig {
  bool present = false;  // false: an ordinary float checkpoint
  kernels::QuantScheme scheme = kernels::QuantScheme::kW8A8;
  int64_t group_size = 0;
  std::map<std::string, LayerQuant> overrides;  // tensor name -> how it is stored
  std::string calibration_json = "null";  // recorded as given (informational)

  // The layer's storage: its override, else the global scheme.
  LayerQuant layer(const std::string& name) const;
};

// "w8a8" | "w4a8" | "w4a16"; throws infera::Error naming the accepted values.
kernels::QuantScheme parse_quant_scheme(const std::string& text, const std::string& where);

// Parses config.json's "quantization_config" object. Throws infera::Error (naming `where`
// and the field) for an unknown quant_method, format_version, scheme or group size.
QuantizationConfig parse_quantization_config(const nlohmann::json& j, const std::string& where);
void quantization_config_to_json(const QuantizationConfig& qc, nlohmann::json& out);

// <model_dir>/config.json's quantization_config (present = false when it has none).
QuantizationConfig read_quantization_config(const std::string& model_dir);

// Whether bind_linear gives quantized layers a repacked copy (kernels/quant.h, "Repacked
// layout") in huge-page memory: yes unless the environment says INFERA_QUANT_REPACK=0, which
// keeps the zero-copy path (kernels read the mmapped/loaded files; less memory, slower
// decode and prefill). CPUs with the AVX-512 or AVX2 path repack (the scalar path reads the
// on-disk layout). Throws infera::Error for a value other than 0/1/on/off/true/false.
bool quant_repack_enabled();

// The files this process has mapped (base/mmap.h, mapped_file_ranges) and read into memory
// (copied_file_ranges), as a snapshot: release_repacked_source gives back pages only inside
// them. Take it after the weights are mapped (or read) and use it only while they stay so (an
// address range can be reused by other memory after an unmap). Taking one copies a few ranges
// under a lock: cheap per matrix.
class FileMappings {
 public:
  static FileMappings current();
  // Whether [p, p + n) lies within one read-only file mapping.
  bool contains(const void* p, size_t n) const;
  // The read-only file mapping [begin, end) holding p; {0, 0} when p is in none (weights
  // read into memory).
  std::pair<uintptr_t, uintptr_t> range_of(const void* p) const;
  // Whether [p, p + n) lies within one file read into memory.
  bool in_copy(const void* p, size_t n) const;

 private:
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges_;  // [begin, end), sorted
  std::vector<std::pair<uintptr_t, uintptr_t>> copies_;  // likewise, of the files read into memory
};

// Once w has its repacked copy, the compute path no longer reads the on-disk bytes (qweight,
// scales), yet the pages it read to pack them stay resident: a second copy of the weights in
// RSS until memory pressure evicts them. This gives back the whole pages inside both ranges
// (release_file_pages); readers that still use the on-disk layout (dequantize_row for a
// quantized embedding table, tensor-parallel slicing, the AVX2 and scalar paths under an
// explicit ISA) fault them back in from the file, unchanged. No-op without a packed copy.
void release_repacked_source(const kernels::QuantMatRef& w, const FileMappings& maps);
// Gives back this process's memory of the whole pages inside [p, p + n) once nothing reads
// them in place: in a read-only file mapping of `maps` they are dropped (MADV_DONTNEED: clean
// file pages, read back from the page cache if touched again); in a file read into memory
// (load_into_memory) they become a mapping of the same bytes of the file
// (map_back_file_pages: the anonymous copy would read as zeros if dropped); anything else is
// left alone.
void release_file_pages(const void* p, size_t n, const FileMappings& maps);

// A GGUF matrix (dtype kGgml) of a type with panel kernels (kernels::ggml::can_pack_panels:
// every type with a matmul: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K, IQ4_XS) with its repacked copy (MatRef::panels) on CPUs with the AVX-512 or AVX2 path
// unless INFERA_QUANT_REPACK=0, its file pages then dropped as release_repacked_source drops them;
// any other matrix as it is. Dense layers and experts alike: with the panels' AMX tiles (Q8_0;
// Q4_K from scaled planes) a dense layer's prompt is at least as fast as from the rows
// (kernels_bench, 2048 x 5632, Q4_K 1.05-1.7x at 16-256 tokens), and decode reads the panels
// faster (end to end, a TinyLlama-shaped Q4_K_M file:
// generation 1.3-1.5x, prompt 1.1-1.7x; Q8_0: generation 1.2x; on AVX2 alone, kernels_bench
// one thread, decode 1.2-2.9x and 8 tokens 1.2-3x the rows' 4-row tiles). The snapshot of the
// file mappings is taken only when a copy is made. With `lanes` (a model's LaneBuffer, while it
// has room) the panels are laid over its four lanes (kernels::ggml::PanelRef).
kernels::MatRef with_panels(kernels::MatRef m, const std::shared_ptr<LaneBuffer>& lanes = nullptr);
// Whether with_panels gives m panels (a GGUF matrix of a panel type, repacking on, a SIMD path).
bool takes_panels(const kernels::MatRef& m);
// The LaneBuffer for the GGUF matrices of `store` that get panels (with_panels), reserving
// room for all of them; null when there are none, lanes are off, or the address space cannot
// be reserved (each matrix's panels in one run then).
std::shared_ptr<LaneBuffer> panel_lanes_for(const WeightStore& store);

// A quantized layer's stored pair, <name>.qweight and <name>.scales, found and checked
// against its scheme (dtypes; cols a multiple of the group size). Shapes are the caller's:
// [rows, ...] for one layer, [E, rows, ...] for fused experts. Throws infera::Error naming
// the tensor and the directory.
struct QuantTensors {
  const TensorInfo* qweight = nullptr;  // int8 [.., cols] or uint8 [.., cols / 2]
  const TensorInfo* scales = nullptr;  // f32 [.., 1] or f16 [.., cols / group_size]
  int64_t group_size = 0;  // W8A8: cols (per channel)
  int64_t qweight_cols = 0;  // cols, or cols / 2 for int4
  int64_t scale_cols = 0;  // cols / group_size (W8A8: 1)
};
QuantTensors find_quant_tensors(const WeightStore& store, const std::string& name, const LayerQuant& lq, int64_t cols);

// The linear layer `name` [rows, cols] as the config says it is stored; throws
// infera::Error naming the tensor and the directory when a tensor is missing, has the
// wrong dtype or shape. A repacked layer's mapped pages are released (release_repacked_source).
// panels false: a GGUF matrix is bound as stored, its panels left to whoever slices it (a
// tensor-parallel rank packs only its part: TensorShard).
kernels::LinearWeight bind_linear(const WeightStore& store, const std::string& name, int64_t rows, int64_t cols,
                                  const QuantizationConfig& qc, const std::shared_ptr<LaneBuffer>& lanes = nullptr,
                                  bool panels = true);

// Expert matrices [rows, cols] of tensor `name`, float or quantized as qc says: a fused
// [E, rows, cols] tensor when `fused` (quantized: <name>.qweight [E, rows, cols or cols / 2],
// <name>.scales [E, rows, 1 or cols / group]), else one plain [rows, cols] matrix (E == 1).
// Views into the checkpoint. Quantized experts get the repacked copy dense layers get
// (bind_linear): a fused tensor is packed once as the [E * rows, cols] matrix it is (rows are
// quantized independently) and each expert is a quant_row_slice of it, sharing the panels
// (rows is a multiple of 16 in every published config; otherwise experts after the first
// fall back to the on-disk layout, still correct). `maps`: one snapshot for a layer's experts.
// panels: as bind_linear's.
std::vector<kernels::LinearWeight> bind_experts(const WeightStore& store, const std::string& name, int64_t E,
                                                int64_t rows, int64_t cols, const QuantizationConfig& qc, bool fused,
                                                const FileMappings& maps,
                                                const std::shared_ptr<LaneBuffer>& lanes = nullptr, bool panels = true);

// Row `row` of an embedding table (dense or quantized) as f32 [cols].
void linear_row(const kernels::LinearWeight& table, int64_t row, float* out);

}  // namespace infera
