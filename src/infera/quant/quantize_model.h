// `infera quantize`: a Hugging Face model directory -> a quantized directory Infera loads
// directly (format in model/quantized_weights.h and docs/quantization.md).
//
// Shards are processed one at a time (input mmapped; each output shard is built in memory
// and written before the next is started), so peak memory is about one output shard.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "infera/kernels/quant.h"

namespace infera::quant {

// How token embeddings and the output head are stored.
enum class EmbedHeadMode {
  kBf16,  // default: kept in bf16 (the layers most sensitive to quantization)
  kW8A8,  // int8 per channel
  kScheme,  // like every other layer (no fallback)
};
EmbedHeadMode parse_embed_head_mode(const std::string& text);  // "bf16" | "w8a8" | "scheme"

// Per-family recipes: which layers get which scheme beyond --scheme.
enum class QuantRecipe {
  kAuto,  // the architecture family's recipe where it has one (DeepSeek below), else uniform
  kUniform,  // every quantizable layer in --scheme (embeddings/head as --embed-head says)
};
QuantRecipe parse_quant_recipe(const std::string& text);  // "auto" | "uniform"

struct QuantizeOptions {
  kernels::QuantScheme scheme = kernels::QuantScheme::kW8A8;
  // kAuto on DeepSeek (MLA) checkpoints, the Ascend-style W4A8 recipe: attention and the
  // dense / shared-expert MLPs W8A8, routed experts W4A8 (group_size), the MTP layer's
  // experts W8A8; the router and kv_b_proj are float roles and stay as stored.
  QuantRecipe recipe = QuantRecipe::kAuto;
  int64_t group_size = 32;  // int4 schemes only
  // Glob patterns (fnmatch, '*' also crosses '.') of tensor names kept in bf16.
  std::vector<std::string> fallback_patterns;
  EmbedHeadMode embed_head = EmbedHeadMode::kBf16;
  // Calibration text (UTF-8); empty: data-free scales.
  std::string calib_file;
  int64_t calib_tokens = 4096;
  int32_t calib_ctx = 256;
  bool show_progress = false;  // progress bar on stderr
};

struct LayerReport {
  std::string name;
  std::string label;  // "w4a8 g32", "w8a8", "bf16"
  int64_t bytes_before = 0;
  int64_t bytes_after = 0;
  std::string reason;  // non-empty when the layer differs from the requested scheme
};

struct QuantizeReport {
  std::vector<LayerReport> layers;  // linear layers and embeddings, in name order
  int64_t other_bytes_before = 0, other_bytes_after = 0;  // norms and anything else copied
  int64_t total_bytes_before = 0, total_bytes_after = 0;
  std::vector<std::string> warnings;
  int64_t calib_tokens_used = 0;
  size_t shards = 0;
};

// Throws infera::Error for: a missing/unsupported input, an input that is already
// quantized, an output directory that exists and is not empty, an int4 group size other
// than 32/64/128, an unreadable calibration file. Warnings (a fallback pattern matching
// nothing, a layer whose width the group size does not divide) go to the log and the report.
QuantizeReport quantize_model(const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& options);

// The per-layer table (layer, scheme, bytes before/after, note) and totals.
std::string format_report(const QuantizeReport& report);

}  // namespace infera::quant
