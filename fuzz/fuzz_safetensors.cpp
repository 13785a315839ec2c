// The safetensors header parser over any file contents.
#include "fuzz_util.h"
#include "infera/base/error.h"
#include "infera/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = infera::fuzz::write_input("model.safetensors", data, size);
  try {
    for (const auto& t : infera::read_safetensors_header(path)) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;  // must not overflow for an accepted header (UBSan checks)
      (void)n;
    }
  } catch (const infera::Error&) {
  }
  return 0;
}
