// Post-processing of generated text on the HTTP worker threads: stop strings (never
// emitted, also when split across tokens), <think>...</think> reasoning and
// <tool_call>...</tool_call> blocks. Each stage holds back only the text that might still
// turn out to be the start of a marker, so streaming stays as eager as possible.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace infera::chat {

// Length of the longest proper prefix of `marker` that `text` ends with.
size_t partial_marker_suffix(std::string_view text, std::string_view marker);

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends generated text; returns what can be emitted now. After a stop string is
  // found, stopped() is true and the text from the stop string on is dropped.
  std::string feed(std::string_view text);
  // End of generation: releases the held-back text (nothing once stopped).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

struct ToolCall {
  std::string id;  // "call_<...>"
  std::string name;
  std::string arguments;  // a JSON text, as OpenAI sends it
};

// Output text split into what the client sees.
struct OutputDelta {
  std::string reasoning;  // goes to reasoning_content
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

// Routes text into reasoning / content, and (when tools were given) captures Hermes /
// Qwen-style tool calls: <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
class OutputRouter {
 public:
  struct Options {
    bool parse_reasoning = false;  // the model emits <think>...</think>
    bool start_in_reasoning = false;  // the prompt already opened <think>
    bool parse_tool_calls = false;
  };
  explicit OutputRouter(Options options);

  OutputDelta feed(std::string_view text);
  // End of generation. Tool calls that do not parse come back as plain content.
  OutputDelta finish();
  const std::vector<ToolCall>& tool_calls() const { return tool_calls_; }

 private:
  enum class Mode { kStart, kReasoning, kContent, kToolCalls };
  void route(OutputDelta& out, bool at_end);
  void parse_tool_block(OutputDelta& out);
  Options options_;
  Mode mode_;
  std::string pending_;
  std::string tool_text_;  // everything from the first <tool_call> on
  bool strip_leading_newlines_ = false;
  std::vector<ToolCall> tool_calls_;
};

}  // namespace infera::chat
