// A model's own sampling defaults, for the fields a request leaves out: what vLLM applies
// from generation_config.json (its `--generation-config auto`) and Ollama from a model's
// params layer. deploy.yaml's `generation_config` (flag --generation-config) says where they
// come from: auto (the model's: generation_config.json of a Hugging Face directory, the
// params and system prompt of an Ollama model; a GGUF file has none), none or vllm (the request defaults of
// base/options.cpp alone, as before), or a path (a directory holding
// generation_config.json, or a JSON file of either kind).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infera/server/deploy_config.h"
#include "infera/server/openai_api.h"

namespace infera::server {

struct GenerationDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
  std::optional<int32_t> top_k;
  std::vector<std::string> stop;  // Ollama's "stop"; a request's own stop list replaces it
  // An Ollama model's system prompt (its system layer): what a chat request whose first
  // message is not a system (or developer) message gets in front, as Ollama's chat does.
  std::optional<std::string> system;
  std::string source;  // where they were read ("" when none)
  std::vector<std::string> ignored;  // values left out, and why (logged when the model loads)

  bool empty() const;
  // Sets the fields `o` was not given (GenerationOptions::given) to these defaults.
  void apply(GenerationOptions& o) const;
  // Puts `system` in front of a chat's messages that do not start with a system (or
  // developer) message.
  void apply_system(std::vector<ChatMessage>& messages) const;
  // "temperature 0.6, top_p 0.95, top_k 20" ("none" when empty).
  std::string describe() const;
};

enum class DefaultsKind { kGenerationConfig, kOllamaParams };

// The defaults in a generation_config.json (temperature, top_p, top_k, min_p,
// repetition_penalty, presence_penalty, frequency_penalty; a value equal to transformers'
// own default is not the model's and is not taken, as vLLM does not) or an Ollama params
// object (the same with repeat_penalty, and stop). A value of the wrong type or outside what
// a request may send, and a setting that is not applied (max_new_tokens, num_ctx, ...), are
// named in `ignored`.
GenerationDefaults parse_generation_defaults(const nlohmann::json& j, const std::string& source,
                                             std::vector<std::string>* ignored = nullptr,
                                             DefaultsKind kind = DefaultsKind::kGenerationConfig);

// The model's defaults as m.generation_config says: auto (a model's own file that cannot be
// read or is not a JSON object gives none, named in `ignored`; an Ollama model's system layer
// of up to kMaxSystemBytes gives `system`), none (or vllm, vLLM's name for it), or a path;
// throws infera::Error for a named path that is not such a file.
constexpr int64_t kMaxSystemBytes = int64_t{1} << 20;
GenerationDefaults load_generation_defaults(const ModelDeployConfig& m);

}  // namespace infera::server
