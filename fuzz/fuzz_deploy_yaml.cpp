// deploy.yaml parsing over any text.
#include "fuzz_util.h"
#include "infera/base/error.h"
#include "infera/server/deploy_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)infera::server::parse_deploy_config(std::string(infera::fuzz::as_text(data, size)), "deploy.yaml");
  } catch (const infera::Error&) {
  }
  return 0;
}
