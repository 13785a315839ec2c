// Hugging Face model directory -> GGUF file that llama.cpp loads (`infera convert`).
//
// Supported: model_type llama and qwen3 (dense). What it writes, following llama.cpp's
// own convert_hf_to_gguf.py so that llama.cpp can serve as the independent reference:
//   - tensors renamed to llama.cpp's names (the architecture's tensor table,
//     model/tensor_table.h: gguf_tensor_name), in the order
//     token_embd, blk.N.*, output_norm, output (omitted when tied);
//   - llama only: q/k rows permuted back from HF's rotate_half order to the adjacent-pair
//     order of llama.cpp's NORM rope (qwen3 uses NEOX rope: no permutation);
//   - 1-D tensors (norms) and rope_freqs always F32; matrices in the requested type, or
//     for the quantized types each in the type llama-quantize's mix gives it
//     (tools/gguf_quant_mix.h), quantized as llama.cpp does (kernels/ggml_quants.h);
//   - hyperparameters under "<arch>.", rope scaling (linear, yarn keys; llama3 as a
//     rope_freqs.weight tensor of per-frequency factors), and the tokenizer
//     (SentencePiece BPE -> tokenizer.ggml.model "llama" with scores and token types;
//     byte-level BPE -> "gpt2" with merges and tokenizer.ggml.pre).
#pragma once

#include <string>
#include <vector>

#include "infera/io/gguf.h"

namespace infera {

struct ModelConfig;
struct Imatrix;

// kF32 / kF16 / kBF16: every matrix in that type (norms and other vectors F32). The others
// are llama.cpp's quantization mixes (tools/gguf_quant_mix.h): the tensor types and block
// bytes llama-quantize writes for that ftype from the same weights (kernels/ggml_quants.h
// quantize_rows); kQ4_0, as before the mixes, puts every matrix in Q4_0 (llama-quantize
// --pure Q4_0). A matrix whose rows are not whole 32-blocks stays F16.
enum class GgufOutType {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ4_K_S,
  kQ4_K_M,
  kQ5_K_S,
  kQ5_K_M,
  kQ6_K,
  kIQ4_NL,
  kIQ4_XS,
};

// "f32" | "f16" | "bf16" | "q8_0" | "q4_0" | "q4_1" | "q5_0" | "q5_1" | "q4_k_s" | "q4_k_m" |
// "q5_k_s" | "q5_k_m" | "q6_k" | "iq4_nl" | "iq4_xs" (case-insensitive); throws
// infera::Error naming the accepted values.
GgufOutType parse_gguf_out_type(const std::string& text);
// The accepted names, for help texts.
std::string gguf_out_type_names();

struct GgufExportOptions {
  // Like llama.cpp's converter, F16 unless told otherwise (also for bf16 checkpoints).
  GgufOutType out_type = GgufOutType::kF16;
  std::string name;  // general.name; default: the model directory's name
  bool show_progress = false;  // a one-line progress meter on stderr
  // An importance matrix for the quantized types, as llama.cpp's llama-imatrix writes it:
  // its GGUF format ("<tensor>.in_sum2" / "<tensor>.counts") or the legacy .dat. Empty: none.
  std::string imatrix_path;
  // The same computed in memory (tools/imatrix.h: `convert --calib`); when set, it is used
  // and imatrix_path is not read. Identical to writing it with write_imatrix_gguf and
  // passing that file.
  const Imatrix* imatrix = nullptr;
};

struct GgufExportResult {
  size_t n_tensors = 0;
  uint64_t file_bytes = 0;
};

// llama3 rope scaling as llama.cpp applies it: one factor per rotated pair (dim / 2),
// each dividing that pair's frequency (written as rope_freqs.weight).
std::vector<float> llama3_rope_factors(const ModelConfig& config);

// Converts `model_dir` into `out_path` (written through "<out_path>.tmp", so a failure
// never leaves a half file). Quantized types use num_threads() threads (base/threads.h).
// Throws infera::Error naming the file/field and the fix.
GgufExportResult export_gguf(const std::string& model_dir, const std::string& out_path,
                             const GgufExportOptions& options = {});

}  // namespace infera
