// Hugging Face model directory -> GGUF file that llama.cpp loads (`infera convert`).
//
// Supported: model_type llama and qwen3 (dense). What it writes, following llama.cpp's
// own convert_hf_to_gguf.py so that llama.cpp can serve as the independent reference:
//   - tensors renamed to llama.cpp's names (the architecture's tensor table,
//     model/tensor_table.h: gguf_tensor_name), in the order
//     token_embd, blk.N.*, output_norm, output (omitted when tied);
//   - llama only: q/k rows permuted back from HF's rotate_half order to the adjacent-pair
//     order of llama.cpp's NORM rope (qwen3 uses NEOX rope: no permutation);
//   - 1-D tensors (norms) and rope_freqs always F32; matrices in the requested type;
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

// kQ8_0 / kQ4_0: llama.cpp's block formats (32 weights per block with an f16 scale), for
// comparing against llama.cpp on the same weights; a matrix whose rows are not a multiple
// of 32 stays F16.
enum class GgufOutType { kF32, kF16, kBF16, kQ8_0, kQ4_0 };

// "f32" | "f16" | "bf16" | "q8_0" | "q4_0"; throws infera::Error naming the accepted values.
GgufOutType parse_gguf_out_type(const std::string& text);

struct GgufExportOptions {
  // Like llama.cpp's converter, F16 unless told otherwise (also for bf16 checkpoints).
  GgufOutType out_type = GgufOutType::kF16;
  std::string name;  // general.name; default: the model directory's name
  bool show_progress = false;  // a one-line progress meter on stderr
};

struct GgufExportResult {
  size_t n_tensors = 0;
  uint64_t file_bytes = 0;
};

// llama3 rope scaling as llama.cpp applies it: one factor per rotated pair (dim / 2),
// each dividing that pair's frequency (written as rope_freqs.weight).
std::vector<float> llama3_rope_factors(const ModelConfig& config);

// Converts `model_dir` into `out_path` (written through "<out_path>.tmp", so a failure
// never leaves a half file). Throws infera::Error naming the file/field and the fix.
GgufExportResult export_gguf(const std::string& model_dir, const std::string& out_path,
                             const GgufExportOptions& options = {});

}  // namespace infera
