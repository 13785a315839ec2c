// `infera run`'s options: the flags come from the declared options (base/options.cpp), each
// bound to its field here.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace infera::cli {

struct RunOptions {
  std::string model_dir;
  std::string prompt;
  std::string prompt_file;
  std::string prompt_ids;  // JSON array; bypasses the tokenizer
  int32_t n_predict = 128;
  int32_t threads = 0;
  int32_t ctx = 4096;
  int32_t chunk = 512;
  std::string kv_dtype = "f32";  // KV cache storage: f32 | bf16 | int8
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int64_t seed = -1;
  // Where the sampling defaults of the flags above that are not given come from
  // (server/generation_defaults.h): auto (the model's own), none, or a path.
  std::string generation_config = "auto";
  uint32_t given = 0;  // server::kGiven* bits of the sampling flags given
  std::string ollama_params;  // an ollama: model's params layer ("" for other models)
  bool json = false;
  bool ignore_eos = false;
  bool no_mmap = false;
  std::string logits_file;  // raw f32 logits of the prompt's last position
  int32_t logprobs = -1;  // --logprobs N: each token's logprob and its N most likely alternatives (-1: off)
  // Tensor / expert parallelism (docs/parallel.md).
  std::string speculative = "none";  // none | ngram | mtp: decode through EngineCore with drafts
  int32_t draft_tokens = 0;  // 0: the method's default
  int32_t tp = 1;
  int32_t ep = 1;
  double tp_timeout = 300.0;
  bool tp_textbook_sync = false;
  std::string ep_dispatch = "allreduce";  // allreduce | all-to-all (docs/parallel.md)
  std::string dump_tensors;  // --dump-tensors NAME,...: named intermediates (model/tensor_dump.h)
  std::string dump_dir = "infera-dump";
};

// Adds every option declared for `infera run` to `cmd`, bound to `o`.
void add_run_flags(CLI::App* cmd, RunOptions& o);

}  // namespace infera::cli
