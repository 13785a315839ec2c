// infera imatrix MODEL_DIR --calib FILE.txt [--calib-tokens N] [--chunk-size N] -o imatrix.gguf
//
// Runs the float model over calibration text and writes the importance matrix llama.cpp's
// llama-imatrix would write (its GGUF layout, GGUF tensor names: tools/imatrix.h), for
// `infera convert --imatrix` or llama.cpp's own llama-quantize --imatrix.
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "infera/base/threads.h"
#include "infera/base/timer.h"
#include "infera/cli/command.h"
#include "infera/cli/model_paths.h"
#include "infera/tools/imatrix.h"

namespace {

struct ImatrixCliOptions {
  std::string model_dir, out_path;
  infera::ImatrixOptions o;
  int32_t threads = 0;
  bool json = false;
};

int run_imatrix(const ImatrixCliOptions& c) {
  infera::set_num_threads(c.threads);
  infera::Timer timer;
  const infera::Imatrix m = infera::compute_imatrix(c.model_dir, c.o);
  infera::write_imatrix_gguf(m, c.out_path);
  if (c.json) {
    nlohmann::json j;
    j["output"] = c.out_path;
    j["entries"] = m.entries.size();
    j["tokens"] = m.tokens;
    j["chunk_count"] = m.chunk_count;
    j["chunk_size"] = m.chunk_size;
    j["seconds"] = timer.seconds();
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("wrote %s: %zu tensors, %lld calibration tokens in %u chunks of %u, in %.1f s\n", c.out_path.c_str(),
                m.entries.size(), static_cast<long long>(m.tokens), m.chunk_count, m.chunk_size, timer.seconds());
  }
  return 0;
}

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "imatrix",
      "Compute an importance matrix (llama-imatrix's GGUF format) from calibration text, for the GGUF mixes");
  auto c = std::make_shared<ImatrixCliOptions>();
  cmd->add_option("model_dir", c->model_dir, "Hugging Face model directory (float weights), or hf:ORG/NAME")
      ->required()
      ->transform(infera::cli::model_ref_transform());
  cmd->add_option("-o,--output", c->out_path, "output file (imatrix.gguf)")->required();
  cmd->add_option("--calib", c->o.calib_file, "Calibration text file (UTF-8)")->required();
  cmd->add_option("--calib-tokens", c->o.calib_tokens, "Calibration tokens to use (the first N)")->default_val(4096);
  cmd->add_option("--chunk-size", c->o.chunk_size,
                  "Tokens per window, each a fresh sequence (llama-imatrix's -c; imatrix.chunk_size)")
      ->default_val(512);
  cmd->add_option("-t,--threads", c->threads, "Threads (0: all cores)")->default_val(0)->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", c->json, "Print a JSON summary instead of the text line");
  cmd->callback([c] { infera::cli::set_exit_code(run_imatrix(*c)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(imatrix, setup);
