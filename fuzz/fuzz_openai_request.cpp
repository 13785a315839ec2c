// Request parsing at the HTTP edge: any body must give a typed request or an ApiException,
// and what the parser accepts must turn into template JSON.
#include "fuzz_util.h"
#include "infera/server/openai_api.h"

using namespace infera::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(infera::fuzz::as_text(data, size));
  nlohmann::json j;
  try {
    j = parse_json_body(body);
  } catch (const ApiException&) {
    return 0;
  }
  try {
    const ChatRequest chat = parse_chat_request(j);
    (void)messages_to_template_json(chat.messages).dump();
    (void)tools_to_template_json(chat.tools).dump();
  } catch (const ApiException&) {
  }
  try {
    (void)parse_completion_request(j);
  } catch (const ApiException&) {
  }
  try {
    (void)parse_tokenize_request(j);
  } catch (const ApiException&) {
  }
  try {
    (void)parse_detokenize_request(j);
  } catch (const ApiException&) {
  }
  return 0;
}
