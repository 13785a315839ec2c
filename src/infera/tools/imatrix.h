// Importance matrices as llama.cpp's llama-imatrix writes them, made from Infera's own
// calibration (`infera imatrix`, `infera convert --calib`), and read back for the quantized
// GGUF mixes (`infera convert --imatrix`).
//
// What an entry holds (llama-imatrix's GGUF layout): per weight tensor, by its GGUF name,
// "<name>.in_sum2" F32 ne {cols, matrices}: for each matrix (one; or one per expert of a
// stacked `_exps` tensor) and input column j, the sum over the tokens that reached it of
// x_j^2, x the matrix's input; and "<name>.counts" F32 ne {1, matrices}: those tokens (all
// calibration tokens for a dense matrix, the tokens routed to the expert for an expert
// matrix). Metadata: general.type "imatrix", imatrix.datasets (the calibration files),
// imatrix.chunk_count, imatrix.chunk_size. Tensors in name order. llama-quantize's (and
// `infera convert`'s) per-column importance is in_sum2 / count, 1 for a matrix of count 0.
//
// Recorded, as llama-imatrix does by default: the matrices of the blocks (blk.N.*) that the
// forward multiplies with, each separately even where several share an input (q/k/v,
// gate/up). Not recorded: the token embedding (a lookup), the output head (llama-imatrix's
// --process-output), the MoE router (never quantized), and matrices whose GGUF form is not
// the checkpoint's own columns (DeepSeek's split kv_b, Qwen3.5's reordered GDN projections).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace infera {

struct ImatrixEntry {
  int64_t cols = 0;
  std::vector<float> sums;  // [matrices * cols]: in_sum2
  std::vector<float> counts;  // [matrices]
};

struct Imatrix {
  std::map<std::string, ImatrixEntry> entries;  // GGUF tensor name -> sums and counts
  std::vector<std::string> datasets;
  uint32_t chunk_count = 0, chunk_size = 0;
  int64_t tokens = 0;  // calibration tokens run (not stored in the file)
};

struct ImatrixOptions {
  std::string calib_file;  // UTF-8 text
  int64_t calib_tokens = 4096;  // at most this many tokens of it
  int32_t chunk_size = 512;  // tokens per window, each a fresh sequence (llama-imatrix's -c)
};

// Runs the float model of `model_dir` over the calibration text and records every matrix's
// input (quant/calibration.h). Throws infera::Error for a bad calibration file or option
// (empty file, calib_tokens < 1, chunk_size < 2) or a model the GGUF export has no names for.
Imatrix compute_imatrix(const std::string& model_dir, const ImatrixOptions& options);

// Writes `m` as llama-imatrix's GGUF (through "<path>.tmp").
void write_imatrix_gguf(const Imatrix& m, const std::string& path);

// Reads an imatrix GGUF (llama-imatrix's or write_imatrix_gguf's).
Imatrix read_imatrix_gguf(const std::string& path);

// Per GGUF tensor name, the importance llama-quantize hands its quantizers: [matrices * cols],
// in_sum2 / count (the count rounded to an integer), 1 for a matrix of count 0.
std::unordered_map<std::string, std::vector<float>> imatrix_importance(const Imatrix& m);

// The importance of an imatrix file, GGUF or llama-imatrix's legacy .dat (i32 entries; per
// entry i32 name length, the name, i32 ncall, i32 nval, nval f32 already scaled by ncall:
// importance = value / ncall, the value itself when ncall is 0), read as llama-quantize
// reads them. Throws infera::Error naming the file and what is wrong.
std::unordered_map<std::string, std::vector<float>> load_imatrix_importance(const std::string& path);

}  // namespace infera
