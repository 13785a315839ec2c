// config.json parsing (every architecture's fields) over any JSON text.
#include "fuzz_util.h"
#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = infera::fuzz::write_input("config.json", data, size);
  try {
    const nlohmann::json j = infera::read_json_file(path);
    (void)infera::parse_model_config(j, "config.json");
  } catch (const infera::Error&) {
  }
  return 0;
}
