#include "infera/cli/model_paths.h"

#include <filesystem>

#include "infera/base/error.h"
#include "infera/base/options.h"
#include "infera/io/model_ref.h"

namespace infera::cli {

std::string default_model_dir() { return model_path_of(default_model_ref()); }

std::string default_model_ref() {
  namespace fs = std::filesystem;
  if (std::string env = option_env("model"); !env.empty()) return env;  // INFERA_DEFAULT_MODEL
  std::error_code ec;
  fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (int up = 0; up < 4 && !dir.empty(); ++up) {
    const fs::path candidate = dir / "models" / "infera-default";
    if (fs::exists(candidate / "config.json", ec)) return candidate.string();
    dir = dir.parent_path();
  }
  fail("no model given and the built-in default model (models/infera-default) was not found; pass -m MODEL_DIR");
}

CLI::Validator model_ref_transform(std::string* ollama_params) {
  return CLI::Validator(
      [ollama_params](std::string& value) -> std::string {
        try {
          ResolvedModelRef ref = resolve_model_ref(value);
          value = std::move(ref.path);
          if (ollama_params) *ollama_params = std::move(ref.params);
        } catch (const Error& e) {
          return e.what();
        }
        return {};
      },
      "", "model reference");
}

}  // namespace infera::cli
