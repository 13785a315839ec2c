// Model output post-processing: stop strings, <think> reasoning and <tool_call> blocks,
// fed in pieces. The input's first byte picks the options and the piece size; the text
// after it is the model's output. Stop strings are fixed.
#include "fuzz_util.h"
#include "infera/chat/text_stream.h"

using namespace infera::chat;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view text = infera::fuzz::as_text(data + 1, size - 1);
  const size_t piece = 1 + (mode >> 3);
  StopMatcher stop({"</s>", "\n\nUser:", "<|im_end|>", "aa"});
  OutputRouter router({.parse_reasoning = (mode & 1) != 0, .start_in_reasoning = (mode & 2) != 0, .parse_tool_calls = (mode & 4) != 0});
  std::string emitted;
  for (size_t pos = 0; pos < text.size() && !stop.stopped(); pos += piece) {
    const std::string out = stop.feed(text.substr(pos, piece));
    const OutputDelta d = router.feed(out);
    emitted += d.reasoning;
    emitted += d.content;
  }
  const OutputDelta d = router.feed(stop.flush());
  const OutputDelta tail = router.finish();
  for (const auto& call : router.tool_calls()) {
    if (call.arguments.empty()) __builtin_trap();  // "{}" when the model gave none
  }
  (void)d;
  (void)tail;
  return 0;
}
