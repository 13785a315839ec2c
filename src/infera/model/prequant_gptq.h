// GPTQ (AutoGPTQ / GPTQModel) and AWQ (AutoAWQ GEMM) int4 checkpoints: reading their packed
// tensors and mapping them onto Infera's int4 kernels (w4a16, or w4a8 with int8 activations)
// without requantizing. The formats plug into the pre-quantized seam (model/prequant.h) as
// make_gptq_format / make_awq_format (model/prequant_formats.h). docs/prequant.md has the formats; the layouts in
// short:
//
//   GPTQ  <p>.qweight int32 [I/8, O], packed along the input, nibble i of word [r, n] = q[8r+i, n]
//         <p>.qzeros  int32 [ng, O/8], packed along the output, nibble i of [g, c] = z[g, 8c+i]
//         <p>.scales  f16 [ng, O]; <p>.g_idx int32 [I] (the group of each input; act-order
//         permutes it); W[n, k] = s[g_idx[k], n] · (q[k, n] − z), z = stored + 1 in the v1
//         checkpoint format ("gptq"), z = stored in "gptq_v2".
//   AWQ   <p>.qweight int32 [I, O/8] and <p>.qzeros int32 [I/G, O/8], packed along the output in
//         the order [0, 2, 4, 6, 1, 3, 5, 7] (nibble i of word [k, c] is column 8c + ORDER[i]);
//         <p>.scales f16 [I/G, O]; W[n, k] = s[k/G, n] · (q[k, n] − z[k/G, n]).
//
// Mapping: Infera's int4 is symmetric with f16 scales per group of 32/64/128 contiguous inputs
// (a nibble q stands for (q − 8)·s). A format group of G inputs (G a multiple of 32) is G/gs
// Infera groups sharing one scale; zero points other than 8 become the exact correction
// s·(8 − z)·Σx per group (kernels::QuantExtras); act-order (g_idx not k / G) becomes an input
// permutation that makes every group contiguous. A layer whose groups are not a multiple of
// 32 inputs (a per-channel or odd group size on a narrow layer) cannot run on the int4
// kernels: the seam requantizes it (its error logged).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "infera/io/safetensors.h"
#include "infera/kernels/quant.h"
#include "infera/model/prequant.h"

namespace infera::prequant {

// A b-bit integer matrix with per-group scales and zero points, in nn.Linear orientation
// (rows = O outputs, cols = I inputs), unpacked from a checkpoint: the scalar reference the
// kernels' mapping is checked against.
struct IntGroupMatrix {
  int64_t rows = 0, cols = 0;
  int bits = 4;
  int64_t groups = 0;  // ng
  std::vector<uint8_t> q;  // [rows, cols], unsigned 0 .. 2^bits − 1
  std::vector<int32_t> group_of_col;  // [cols], in [0, groups)
  std::vector<float> scales;  // [rows, groups]
  std::vector<int32_t> zeros;  // [rows, groups], the real zero point (v1's +1 applied)

  float scale(int64_t n, int64_t k) const { return scales[n * groups + group_of_col[k]]; }
  int32_t zero(int64_t n, int64_t k) const { return zeros[n * groups + group_of_col[k]]; }
  // W[n, k] = scale · (q − zero), f32 [rows, cols].
  std::vector<float> dequantize() const;
};

// A raw tensor as stored (pointer into the checkpoint, dtype, shape), for the unpackers.
struct RawTensor {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// GPTQ tensors of one layer [O, I] (g_idx may be absent: then group k / G), output rows
// [r0, r1) (r1 < 0: all). Throws infera::Error naming `where` and the tensor for a wrong dtype
// or shape, a group size not dividing I, a g_idx entry out of range.
IntGroupMatrix unpack_gptq(const RawTensor& qweight, const RawTensor& qzeros, const RawTensor& scales,
                           const RawTensor* g_idx, int64_t rows, int64_t cols, int bits, int64_t group_size, bool v2,
                           const std::string& where, int64_t r0 = 0, int64_t r1 = -1);
// AWQ GEMM tensors of one layer [O, I] (4-bit), output rows [r0, r1).
IntGroupMatrix unpack_awq(const RawTensor& qweight, const RawTensor& qzeros, const RawTensor& scales, int64_t rows,
                          int64_t cols, int64_t group_size, const std::string& where, int64_t r0 = 0, int64_t r1 = -1);

// The Infera int4 form of a 4-bit matrix: qweight/scales in the kernels' on-disk layout
// (kernels/quant.h) and the extras (permutation, zero-point correction) or nullptr.
struct Int4Layout {
  int64_t rows = 0, cols = 0, group_size = 0;
  std::vector<uint8_t> qweight;  // [rows, cols / 2], Q4_0 nibble order
  std::vector<uint16_t> scales;  // f16 [rows, cols / group_size]
  std::shared_ptr<kernels::QuantExtras> extras;
};
// nullopt (and *why) when the kernels cannot hold it: bits other than 4, groups of unequal size
// or a group size that is not a multiple of 32.
std::optional<Int4Layout> to_infera_int4(const IntGroupMatrix& m, std::string* why);
// One Int4Layout as a matrix of `scheme`; its buffers go to `owned`.
kernels::QuantMatRef own_int4_layout(Int4Layout&& l, kernels::QuantScheme scheme,
                                     std::vector<std::shared_ptr<void>>& owned);
// w's experts' layouts (one each, in order; one for a per-module weight) bound as one
// [w.total_rows(), w.cols] matrix: rows concatenated, the zero-point corrections group-major
// over all rows. False (logged) when the experts' groups differ.
bool bind_int4_layouts(std::vector<Int4Layout>&& ls, const StoredLinear& w, kernels::QuantScheme scheme,
                       kernels::QuantMatRef& out, std::vector<std::shared_ptr<void>>& owned);
// A 4-bit weight with zero points, read through f.int_rows (signed values and zeros), bound
// exactly: the values offset to the kernels' unsigned nibbles, each group's zero carried as the
// row-indexed correction scale · (8 − zero) (kernels::QuantExtras). False where the kernels'
// groups cannot hold it (a group size not a multiple of 32, act-order): the seam requantizes.
bool bind_int4_with_zeros(const PrequantFormat& f, const StoredLinear& w, kernels::QuantScheme scheme,
                          kernels::QuantMatRef& out, std::vector<std::shared_ptr<void>>& owned);
// The value the kernels compute with for W[n, k] (scales rounded to f16), for tests.
std::vector<float> dequantize_int4_layout(const Int4Layout& l);

// quantization_config of a GPTQ or AWQ checkpoint.
struct GptqConfig {
  bool awq = false;
  int bits = 4;
  int64_t group_size = 128;  // -1: one group spans the inputs
  bool sym = true;  // GPTQ: informational (zeros are read); AWQ: !zero_point
  bool desc_act = false;
  bool v2 = false;  // GPTQ checkpoint_format "gptq_v2": zeros stored without the −1
  bool lm_head = false;  // the output head is quantized too
  std::vector<std::string> skip;  // AWQ modules_to_not_convert / GPTQ "-:" dynamic rules (substrings / regexes)
  std::vector<std::string> skip_regex;
};
// Throws infera::Error naming the field for a variant that is not supported (bits other than 4,
// a checkpoint_format or AWQ version other than the plain layouts, pack_dtype other than int32,
// AWQ zero_point false, per-module dynamic overrides of bits or group size).
GptqConfig parse_gptq_config(const nlohmann::json& qc, const std::string& where);
// Whether the module of weight `name` (e.g. "model.layers.0.mlp.up_proj.weight") is stored
// unquantized by the config's skip rules.
bool gptq_skips(const GptqConfig& c, const std::string& name);

}  // namespace infera::prequant
