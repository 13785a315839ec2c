// The GGUF reader over any file contents: every tensor it accepts lies inside the file.
#include "fuzz_util.h"
#include "infera/base/error.h"
#include "infera/io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = infera::fuzz::write_input("model.gguf", data, size);
  try {
    infera::gguf::Reader r(path);
    for (const auto& t : r.tensors()) {
      if (t.offset + t.nbytes > r.file_size() - r.data_offset()) __builtin_trap();
      (void)t.n_elements();
    }
    for (const auto& [key, value] : r.metadata()) (void)value.describe();
  } catch (const infera::Error&) {
  }
  return 0;
}
