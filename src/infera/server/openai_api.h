// OpenAI request schema as typed structs. Parsing happens once, at the HTTP edge; every
// wrong type or out-of-range value becomes an ApiError naming the parameter. Nothing past
// these structs sees the request JSON (tool schemas and message lists are re-emitted only
// for the chat template, which is defined over JSON).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "infera/base/options.h"
#include "infera/chat/text_stream.h"
#include "infera/constrain/constraint.h"
#include "infera/server/api_error.h"

namespace infera::server {

// Model-output parsing lives in chat/; the server speaks of its types unqualified.
using chat::OutputDelta;
using chat::OutputRouter;
using chat::StopMatcher;
using chat::ToolCall;

// Sampling fields a request set itself (GenerationOptions::given): a model's own defaults
// (server/generation_defaults.h) fill the others.
enum GivenField : uint32_t {
  kGivenTemperature = 1u << 0,
  kGivenTopP = 1u << 1,
  kGivenTopK = 1u << 2,
  kGivenMinP = 1u << 3,
  kGivenRepetitionPenalty = 1u << 4,
  kGivenStop = 1u << 5,
  kGivenPresencePenalty = 1u << 6,
  kGivenFrequencyPenalty = 1u << 7,
};

// Options shared by /v1/chat/completions and /v1/completions.
struct GenerationOptions {
  std::optional<std::string> model;  // absent: the only model, if there is one
  std::optional<int64_t> max_tokens;  // max_completion_tokens wins over max_tokens
  // The sampling fields start from the request defaults declared in base/options.cpp.
  float temperature = static_cast<float>(request_default_number("temperature"));
  float top_p = static_cast<float>(request_default_number("top_p"));
  int32_t top_k = static_cast<int32_t>(request_default_number("top_k"));
  float min_p = static_cast<float>(request_default_number("min_p"));
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  float presence_penalty = static_cast<float>(request_default_number("presence_penalty"));
  float frequency_penalty = static_cast<float>(request_default_number("frequency_penalty"));
  float repetition_penalty = static_cast<float>(request_default_number("repetition_penalty"));
  int32_t n = 1;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  // vLLM's extension: each prompt token's log-probability with this many alternatives
  // (0-20), in vLLM's response shape; -1: not asked.
  int32_t prompt_logprobs = -1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = request_default_flag("ignore_eos");
  // OpenAI's logit_bias: (token id, bias in [-100, 100]).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Structured output from response_format, structured_outputs (or vLLM's guided_*
  // aliases), or llama.cpp's grammar / json_schema; constraint_param names the field for
  // errors found when it is compiled.
  std::optional<constrain::ConstraintSpec> constraint;
  std::string constraint_param;
  // Prefix-cache isolation (vLLM's field): requests with the same salt share cached
  // prefixes, whatever their API key; absent: the key's own cache (routes.cpp).
  std::optional<std::string> cache_salt;
  uint32_t given = 0;  // GivenField bits
};

struct ChatMessage {
  std::string role;  // system | developer | user | assistant | tool
  std::optional<std::string> content;  // text parts joined
  std::optional<std::string> name;
  std::optional<std::string> reasoning_content;
  std::optional<std::string> tool_call_id;
  std::vector<ToolCall> tool_calls;  // assistant turns that called tools
};

struct ToolDefinition {
  std::string name;
  std::string description;
  nlohmann::json parameters;  // JSON Schema, handed to the chat template as is
  // The same with its keys in the client's order (keep_declared_order; null: not set): the
  // tool-call constraint writes properties in declared order.
  nlohmann::ordered_json ordered_parameters;
};

struct ChatRequest {
  GenerationOptions options;
  std::vector<ChatMessage> messages;
  std::vector<ToolDefinition> tools;
  bool tools_enabled = false;  // tools given and tool_choice != "none"
  std::optional<std::string> forced_tool;  // tool_choice {"type":"function","function":{"name"}}
  bool tool_required = false;  // tool_choice "required"
  bool parallel_tool_calls = true;
  std::optional<bool> enable_thinking;  // chat_template_kwargs.enable_thinking
};

struct CompletionRequest {
  GenerationOptions options;
  // Each prompt is text or token ids; a list of prompts gives n choices per prompt.
  std::vector<std::variant<std::string, std::vector<int32_t>>> prompts;
  bool echo = false;
};

struct TokenizeRequest {
  std::optional<std::string> model;
  std::string text;
  bool add_special_tokens = true;
};

struct DetokenizeRequest {
  std::optional<std::string> model;
  std::vector<int32_t> tokens;
};

// Limits the parser enforces besides the schema.
struct ParseLimits {
  int32_t max_n = 16;
  int32_t max_stop_strings = 16;
  int32_t max_stop_length = 256;
};

// Parses a body (bytes as received). Throws ApiException: malformed JSON, nesting deeper
// than 64 levels, invalid UTF-8, wrong types, out-of-range values.
nlohmann::json parse_json_body(const std::string& body);
ChatRequest parse_chat_request(const nlohmann::json& body, const ParseLimits& limits = {});
// The body's json sorts object keys; a JSON Schema's properties are written in the order the
// client declared them. For a request with a schema constraint or tools, reads `raw_body`
// (`body` parsed, so valid) again keeping key order and sets the constraint's schema and each
// tool's ordered_parameters from it. Not where an object of the body has more than
// kMaxOrderedKeys keys (ordered_json inserts in linear time per key): those keep sorted order.
inline constexpr size_t kMaxOrderedKeys = 256;
void keep_declared_order(const nlohmann::json& body, const std::string& raw_body, GenerationOptions& options,
                         std::vector<ToolDefinition>* tools);
CompletionRequest parse_completion_request(const nlohmann::json& body, const ParseLimits& limits = {});
TokenizeRequest parse_tokenize_request(const nlohmann::json& body);
DetokenizeRequest parse_detokenize_request(const nlohmann::json& body);

// The message list / tool list as the chat template expects them (HF conventions).
nlohmann::json messages_to_template_json(const std::vector<ChatMessage>& messages);
nlohmann::json tools_to_template_json(const std::vector<ToolDefinition>& tools);

nlohmann::json error_to_json(const ApiError& e);

// The end of a stream that failed: the error as an SSE event, then "data: [DONE]".
std::string sse_error_and_done(const ApiError& e);

}  // namespace infera::server
