// Limits and policies of the serving engine (runtime/engine.h), and the parser of the
// --kv-cache-memory option. Every field has a safe default; validate_engine_config()
// checks a config against a model before anything is allocated.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "infera/tensor/dtype.h"

namespace infera {

struct ModelConfig;

// Speculative decoding (docs/speculative.md): who proposes the draft tokens that one
// forward of the model then verifies.
enum class SpeculativeMethod {
  kNone,
  kNgram,  // prompt lookup: tokens that followed the last n-gram earlier in the sequence (any model)
  kMtp,  // the checkpoint's multi-token-prediction head (Qwen3.5 / Qwen3-Next mtp.*)
  kCustom,  // SpeculativeConfig::drafter (tests, external draft models; not a CLI choice)
};
const char* speculative_method_name(SpeculativeMethod method);  // "none", "ngram", "mtp"
// "none" | "ngram" | "mtp"; throws infera::Error naming `what` (e.g. "--speculative") otherwise.
SpeculativeMethod parse_speculative_method(const std::string& text, const std::string& what = "--speculative");

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kNone;
  // Draft tokens verified per step and sequence; 0: the method's default (mtp 1, ngram 4).
  // MTP drafts more than one by running its single layer recursively on its own output.
  int32_t num_draft_tokens = 0;
  // n-gram lengths tried, longest first, when looking the sequence's tail up in its history.
  int32_t ngram_max = 3;
  int32_t ngram_min = 1;
  // 0 (default): exact speculative sampling, the output distribution equals the model's.
  // In (0, 1]: a draft token whose target probability reaches this is accepted outright,
  // which trades fidelity for acceptance (temperature > 0 only; greedy is always exact).
  float acceptance_threshold = 0.0f;

  // kCustom: proposes up to max_draft tokens to follow `history` (prompt + generated
  // tokens, the last one not yet fed) into `out` (cleared by the caller). Engine thread.
  using Drafter = std::function<void(std::span<const int32_t> history, int32_t max_draft, std::vector<int32_t>& out)>;
  Drafter drafter;

  static constexpr int32_t kMaxDraftTokens = 16;
  // The effective number of draft tokens (the method's default for 0).
  int32_t draft_tokens() const;
};

struct EngineConfig {
  // Bytes of KV cache (all layers, K and V). The pool is reserved as virtual memory and
  // committed as blocks are first written, so this is a ceiling, not an up-front cost.
  int64_t kv_cache_bytes = int64_t{1} << 30;
  int32_t block_size = 16;  // tokens per KV block (also the prefix-cache granule)
  // KV cache storage (--kv-dtype): kF32, kBF16 (half the bytes per token) or kI8 (about a
  // quarter: int8 with an f32 scale per token and KV head). The budget above holds
  // proportionally more tokens with the smaller types.
  DType kv_dtype = DType::kF32;
  int32_t max_batch_tokens = 512;  // tokens per forward (decode tokens + prefill chunks);
                                   // the model must be loaded with LoadOptions.max_batch_tokens >= this
  int32_t max_num_seqs = 64;  // sequences per forward (= running sequences at most)
  int32_t prefill_chunk = 512;  // most prompt tokens one sequence feeds in one forward
  bool enable_prefix_cache = true;
  // Hybrid models: the prefix cache also keeps the recurrent state every this many prompt
  // tokens (rounded down to a multiple of block_size; 0: only at the end of prompts, at
  // chat message boundaries and while decoding). Each costs one state copy of the budget.
  int32_t prefix_checkpoint_interval = 2048;
  // The prefix cache's second tier (runtime/disk_cache.h): entries evicted from memory are
  // written to files in cache_dir (empty: none) of at most cache_disk_bytes, and read back
  // on a hit, also after a restart. cache_model_id names the weights
  // (model_files_fingerprint); the engine adds the KV geometry, dtype and state shape.
  // Not for a model split over --tp/--ep ranks.
  std::string cache_dir;
  int64_t cache_disk_bytes = int64_t{8} << 30;
  uint64_t cache_model_id = 0;
  // Longest sequence (prompt + generated) the engine accepts; 0: the model's
  // max_position_embeddings. Larger than the model's limit only with
  // allow_context_beyond_model (RoPE extrapolation: the model may degrade).
  int32_t max_context = 0;
  bool allow_context_beyond_model = false;
  // Stop on the model's EOS ids (config.json / generation_config) unless a request sets
  // ignore_eos. Extra ids every request stops on (e.g. BOS for llama2.c models).
  bool stop_on_model_eos = true;
  SpeculativeConfig speculative;
  // Kernel threads of this engine's step loop (base/threads.h set_thread_num_threads), so
  // models served side by side each get their own; 0: the process-wide count.
  int32_t threads = 0;
};

// Parses a memory size: "2GiB", "512MB", "1.5G", "300000000" (bytes), or "30%" (of the
// physical memory of this machine). Units: B, K/KB, M/MB, G/GB, T/TB (powers of 1000) and
// KiB, MiB, GiB, TiB (powers of 1024); a bare K/M/G/T is read as binary (KiB ...), as most
// tools do. Case-insensitive. Throws infera::Error naming `what` (e.g. "--kv-cache-memory")
// for anything else.
int64_t parse_memory_size(const std::string& text, const std::string& what = "--kv-cache-memory");

// Physical memory of this machine in bytes (sysconf), 0 if unknown.
int64_t physical_memory_bytes();

// Throws infera::Error naming the field and the fix when `config` is unusable.
void validate_engine_config(const EngineConfig& config);

}  // namespace infera
