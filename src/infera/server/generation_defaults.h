// A model's own sampling defaults, for the fields a request leaves out: what vLLM applies
// from generation_config.json (its `--generation-config auto`) and Ollama from a model's
// params layer. deploy.yaml's `generation_config` (flag --generation-config) says where they
// come from: auto (the model's: generation_config.json of a Hugging Face directory, the
// params, system prompt and preset messages of an Ollama model; a GGUF file has none), none or
// vllm (the request defaults of base/options.cpp alone, as before), or a path (a directory
// holding generation_config.json, or a JSON file of either kind).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infera/runtime/sampler.h"
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
  // An Ollama model's preset messages (its messages layer: a Modelfile's MESSAGE lines), put
  // in front of every chat's own messages, after the chat's leading system messages.
  std::vector<ChatMessage> messages;
  std::string source;  // where they were read ("" when none)
  std::vector<std::string> ignored;  // values left out, and why (logged when the model loads)

  bool empty() const;
  // The sampling defaults and stop strings of these that fields not `given`
  // (GenerationOptions::given bits) take, with `source`: what apply() sets.
  GenerationDefaults taken_by(uint32_t given) const;
  // Sets the fields `o` was not given (GenerationOptions::given) to these defaults.
  void apply(GenerationOptions& o) const;
  // Puts the model's turns in a chat, as Ollama does, with two differences for templates
  // that read the system prompt from the first message only:
  // - a chat that starts with a system (or developer) message keeps it first and takes none
  //   of the model's system turns (`system` and the presets' leading system messages);
  // - a chat without one gets those in front, as one system message (joined by a blank
  //   line, as Ollama's template collates system messages).
  // The other presets follow the chat's leading system messages; where the last meets a
  // chat turn of the same role (user after user), the two become one, joined by a blank line
  // (Ollama merges same-role neighbours), unless the chat's turn carries tool calls or more.
  // Returns how many of the chat's first messages are then the same in every chat that
  // brings the same system messages (theirs, the model's turns, a joined turn not counted):
  // a prefix-cache boundary (ModelInstance::message_boundaries).
  size_t apply_chat(std::vector<ChatMessage>& chat) const;
  // "temperature 0.6, top_p 0.95, top_k 20" ("none" when empty).
  std::string describe() const;
};

// The sampler's settings of `o` (temperature, top_p, top_k, min_p and the three penalties); the
// seed, bias and vocabulary bound are the caller's.
SamplingParams sampling_of(const GenerationOptions& o);

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

// An Ollama messages layer: a JSON array of at most kMaxPresetMessages objects, each with a
// role (system, user or assistant, as a Modelfile's MESSAGE takes) and a string content (an
// absent or null one is empty); other fields (images, thinking) are not taken. Throws
// infera::Error naming `source` and the first entry that is not such a message.
constexpr size_t kMaxPresetMessages = 256;
std::vector<ChatMessage> parse_preset_messages(const nlohmann::json& j, const std::string& source);

// The model's defaults as m.generation_config says: auto (a model's own file that cannot be
// read or is not a JSON object gives none, named in `ignored`; an Ollama model's system layer
// and messages layer, each of up to kMaxSystemBytes, give `system` and `messages`; one that
// cannot be read or parsed is named in `ignored`), none (or vllm, vLLM's name for it), or a
// path; throws infera::Error for a named path that is not such a file.
constexpr int64_t kMaxSystemBytes = int64_t{1} << 20;
GenerationDefaults load_generation_defaults(const ModelDeployConfig& m);

}  // namespace infera::server
