// infera convert MODEL_DIR --to gguf OUT.gguf [--type f32|f16|bf16|q8_0|q4_0] [--name NAME]
//
// Writes a GGUF file llama.cpp loads (see model/gguf_export.h for what is converted and
// how). The default type is f16, as with llama.cpp's convert_hf_to_gguf.py; norms and the MoE router stay f32.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "infera/base/error.h"
#include "infera/cli/command.h"
#include "infera/tools/gguf_export.h"

namespace {

struct ConvertOptions {
  std::string model_dir;
  std::string format;
  std::string out_path;
  std::string type = "f16";
  std::string name;
};

int run_convert(const ConvertOptions& o) {
  if (o.format != "gguf") infera::fail("unknown output format '{}' (supported: gguf)", o.format);
  infera::GgufExportOptions options;
  options.out_type = infera::parse_gguf_out_type(o.type);
  options.name = o.name;
  options.show_progress = ::isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  const infera::GgufExportResult r = infera::export_gguf(o.model_dir, o.out_path, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s: %zu tensors, %.1f MB, %s, in %.1f s\n", o.out_path.c_str(), r.n_tensors,
              static_cast<double>(r.file_bytes) / 1e6, o.type.c_str(), seconds);
  return 0;
}

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "Convert a Hugging Face model directory to GGUF (llama, qwen3)");
  auto opts = std::make_shared<ConvertOptions>();
  cmd->add_option("model_dir", opts->model_dir,
                  "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)")
      ->required();
  cmd->add_option("--to", opts->format, "output format (gguf)")->required();
  cmd->add_option("out", opts->out_path, "output file")->required();
  cmd->add_option("--type", opts->type,
                  "tensor type of matrices: f32, f16 (default, like llama.cpp's converter), bf16, or llama.cpp's q8_0 "
                  "/ q4_0 blocks (rows not a multiple of 32 stay f16); norms and the MoE router stay f32")
      ->default_val("f16");
  cmd->add_option("--name", opts->name, "general.name (default: the model directory's name)");
  cmd->callback([opts] { infera::cli::set_exit_code(run_convert(*opts)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(convert, setup);
