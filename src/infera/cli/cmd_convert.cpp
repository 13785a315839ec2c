// infera convert MODEL_DIR --to gguf OUT.gguf [--type TYPE] [--imatrix FILE | --calib FILE.txt
//                [--calib-tokens N] [--chunk-size N]] [--name NAME]
//
// Writes a GGUF file llama.cpp loads (see tools/gguf_export.h for what is converted and
// how). The default type is f16, as with llama.cpp's convert_hf_to_gguf.py; norms and the
// MoE router stay f32. The quantized types are llama-quantize's mixes (q4_k_m, q6_k,
// iq4_xs, ...), written with the same per-tensor types and block bytes llama-quantize
// would write from the same weights; with an importance matrix read from --imatrix or
// computed from --calib text (as `infera imatrix` writes it, tools/imatrix.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "infera/base/error.h"
#include "infera/base/threads.h"
#include "infera/cli/command.h"
#include "infera/cli/model_paths.h"
#include "infera/model/arch_registry.h"
#include "infera/tools/gguf_export.h"
#include "infera/tools/imatrix.h"

namespace {

struct ConvertOptions {
  std::string model_dir;
  std::string format;
  std::string out_path;
  std::string type = "f16";
  std::string name;
  std::string imatrix;
  std::string calib;
  int64_t calib_tokens = 4096;
  int32_t chunk_size = 512;
  int threads = 0;
};

int run_convert(const ConvertOptions& o) {
  if (o.format != "gguf") infera::fail("unknown output format '{}' (supported: gguf)", o.format);
  infera::GgufExportOptions options;
  options.out_type = infera::parse_gguf_out_type(o.type);
  options.name = o.name;
  options.imatrix_path = o.imatrix;
  if (o.threads > 0) infera::set_num_threads(o.threads);
  infera::Imatrix imatrix;
  if (!o.calib.empty()) {
    if (!o.imatrix.empty()) infera::fail("--calib and --imatrix both give the importance matrix: pass one");
    const auto t = options.out_type;
    if (t == infera::GgufOutType::kF32 || t == infera::GgufOutType::kF16 || t == infera::GgufOutType::kBF16) {
      infera::fail("--calib computes an importance matrix for the quantized types; --type {} uses none", o.type);
    }
    infera::ImatrixOptions io;
    io.calib_file = o.calib;
    io.calib_tokens = o.calib_tokens;
    io.chunk_size = o.chunk_size;
    imatrix = infera::compute_imatrix(o.model_dir, io);
    options.imatrix = &imatrix;
    std::printf("importance matrix: %zu tensors from %lld calibration tokens of %s\n", imatrix.entries.size(),
                static_cast<long long>(imatrix.tokens), o.calib.c_str());
  }
  options.show_progress = ::isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  const infera::GgufExportResult r = infera::export_gguf(o.model_dir, o.out_path, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s: %zu tensors, %.1f MB, %s, in %.1f s\n", o.out_path.c_str(), r.n_tensors,
              static_cast<double>(r.file_bytes) / 1e6, o.type.c_str(), seconds);
  return 0;
}

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "Convert a Hugging Face model directory to GGUF (" +
                                                infera::gguf_export_arch_names() + ")");
  auto opts = std::make_shared<ConvertOptions>();
  cmd->add_option("model_dir", opts->model_dir,
                  "Hugging Face model directory (config.json, *.safetensors, tokenizer.json), or hf:ORG/NAME")
      ->required()
      ->transform(infera::cli::model_ref_transform());
  cmd->add_option("--to", opts->format, "output format (gguf)")->required();
  cmd->add_option("out", opts->out_path, "output file")->required();
  cmd->add_option(
         "--type", opts->type,
         "tensor type: f32, f16 (default, like llama.cpp's converter) or bf16 for every matrix; or one of "
         "llama-quantize's mixes q8_0, q4_0, q4_1, q5_0, q5_1, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k, iq4_nl, "
         "iq4_xs (the tensor types and block bytes llama-quantize writes; q4_0 as llama-quantize --pure, every "
         "matrix Q4_0; rows not whole 32-blocks stay f16); "
         "norms and the MoE router stay f32")
      ->default_val("f16");
  cmd->add_option("--imatrix", opts->imatrix,
                  "importance matrix for the quantized types, as llama.cpp's llama-imatrix writes it (GGUF or "
                  "legacy .dat)");
  cmd->add_option("--calib", opts->calib,
                  "calibration text: compute the importance matrix for the quantized types from it (what `infera "
                  "imatrix` would write; instead of --imatrix)");
  cmd->add_option("--calib-tokens", opts->calib_tokens, "calibration tokens to use with --calib")->default_val(4096);
  cmd->add_option("--chunk-size", opts->chunk_size, "tokens per calibration window with --calib")->default_val(512);
  cmd->add_option("-t,--threads", opts->threads, "quantization threads (default: all cores)");
  cmd->add_option("--name", opts->name, "general.name (default: the model directory's name)");
  cmd->callback([opts] { infera::cli::set_exit_code(run_convert(*opts)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(convert, setup);
