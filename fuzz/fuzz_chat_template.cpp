// Chat template parsing and rendering. The input is a template, optionally followed by a
// NUL byte and a JSON context; without one a fixed conversation is used. A template may
// fail (infera::Error), never crash, hang or exhaust memory.
#include <cstring>

#include "fuzz_util.h"
#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/chat/chat_template.h"

namespace {
const char* kContext = R"({"messages": [{"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Hi <b>there</b> \u00e9"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
    "function": {"name": "f", "arguments": {"x": 1, "y": [1, 2, {"z": "w"}]}}}]},
  {"role": "tool", "tool_call_id": "c1", "content": "42"}],
  "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
  "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false})";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = infera::fuzz::as_text(data, size);
  const size_t nul = input.find('\0');
  const std::string source(input.substr(0, nul));
  nlohmann::ordered_json context;
  if (nul != std::string_view::npos) {
    const std::string_view json_text = input.substr(nul + 1);
    if (infera::json_nesting_depth(json_text, 64) > 64) return 0;  // the server refuses deeper JSON
    context = nlohmann::ordered_json::parse(json_text, nullptr, false);
    if (context.is_discarded()) return 0;
  } else {
    context = nlohmann::ordered_json::parse(kContext);
  }
  try {
    infera::ChatTemplate t(source);
    (void)t.render(context);
  } catch (const infera::Error&) {
  }
  return 0;
}
