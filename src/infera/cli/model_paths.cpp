#include "infera/cli/model_paths.h"

#include <cstdlib>
#include <filesystem>

#include "infera/base/error.h"

namespace infera::cli {

std::string default_model_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("INFERA_DEFAULT_MODEL"); env && *env) return env;
  std::error_code ec;
  fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (int up = 0; up < 4 && !dir.empty(); ++up) {
    const fs::path candidate = dir / "models" / "infera-default";
    if (fs::exists(candidate / "config.json", ec)) return candidate.string();
    dir = dir.parent_path();
  }
  fail("no model given and the built-in default model (models/infera-default) was not found; pass -m MODEL_DIR");
}

}  // namespace infera::cli
