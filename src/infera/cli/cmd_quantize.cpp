// infera quantize IN_DIR OUT_DIR --scheme w8a8|w4a8|w4a16 [--group-size 32|64|128]
//                 [--fallback PATTERN ...] [--embed-head bf16|w8a8|scheme] [--recipe auto|uniform]
//                 [--calib FILE.txt --calib-tokens N]
//
// Writes a quantized Hugging Face-style directory that `infera run` / `serve` load directly
// (format: docs/quantization.md), then prints the per-layer table and totals.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "infera/base/error.h"
#include "infera/base/threads.h"
#include "infera/base/timer.h"
#include "infera/cli/command.h"
#include "infera/cli/model_paths.h"
#include "infera/model/arch_registry.h"
#include "infera/model/quantized_weights.h"
#include "infera/quant/quantize_model.h"

namespace {

struct QuantizeCliOptions {
  std::string in_dir, out_dir, scheme, embed_head = "bf16", calib, recipe = "auto";
  int64_t group_size = 32;
  int64_t calib_tokens = 4096;
  int32_t threads = 0;
  std::vector<std::string> fallback;
};

int run_quantize(const QuantizeCliOptions& c) {
  infera::set_num_threads(c.threads);
  infera::quant::QuantizeOptions o;
  o.scheme = infera::parse_quant_scheme(c.scheme, "--scheme");
  o.group_size = c.group_size;
  o.fallback_patterns = c.fallback;
  o.embed_head = infera::quant::parse_embed_head_mode(c.embed_head);
  o.recipe = infera::quant::parse_quant_recipe(c.recipe);
  o.calib_file = c.calib;
  o.calib_tokens = c.calib_tokens;
  o.show_progress = ::isatty(STDERR_FILENO) != 0;
  infera::Timer timer;
  const infera::quant::QuantizeReport r = infera::quant::quantize_model(c.in_dir, c.out_dir, o);
  std::fputs(infera::quant::format_report(r).c_str(), stdout);
  for (const std::string& w : r.warnings) std::printf("warning: %s\n", w.c_str());
  if (r.calib_tokens_used > 0)
    std::printf("calibration: %lld tokens of %s\n", static_cast<long long>(r.calib_tokens_used), c.calib.c_str());
  std::printf("wrote %s (%zu shard%s) in %.1f s\n", c.out_dir.c_str(), r.shards, r.shards == 1 ? "" : "s",
              timer.seconds());
  return 0;
}

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("quantize", "Quantize a model directory (W8A8, W4A8, W4A16) for infera run/serve");
  auto o = std::make_shared<QuantizeCliOptions>();
  cmd->add_option("in_dir", o->in_dir,
                  "Hugging Face model directory (" + infera::runnable_arch_names() +
                      "; f32/bf16/f16, or FP8), or hf:ORG/NAME")
      ->required()
      ->transform(infera::cli::model_ref_transform());
  cmd->add_option("out_dir", o->out_dir, "Output directory (new or empty)")->required();
  cmd->add_option("--scheme", o->scheme, "w8a8 (int8 per channel, int8 activations), w4a8 or w4a16 (int4 groups)")
      ->required();
  cmd->add_option("--group-size", o->group_size, "int4 group size along the input dimension: 32, 64 or 128")
      ->default_val(32);
  cmd->add_option("--fallback", o->fallback, "Glob of tensor names kept in bf16 (repeatable), e.g. 'model.layers.0.*'");
  cmd->add_option("--embed-head", o->embed_head,
                  "Token embeddings and output head: bf16 (default), w8a8, or scheme (no fallback)")
      ->default_val("bf16");
  cmd->add_option("--recipe", o->recipe,
                  "auto: the family's recipe where it has one (DeepSeek: attention w8a8, routed experts w4a8, MTP "
                  "experts w8a8, router and kv_b_proj float); uniform: every layer in --scheme")
      ->default_val("auto")
      ->check(CLI::IsMember({"auto", "uniform"}));
  cmd->add_option("--calib", o->calib,
                  "Calibration text file: activation statistics choose the scales (AWQ/SmoothQuant-style)");
  cmd->add_option("--calib-tokens", o->calib_tokens, "Calibration tokens to use")
      ->default_val(4096)
      ->check(CLI::PositiveNumber);
  cmd->add_option("-t,--threads", o->threads, "Threads (0: all cores)")->default_val(0)->check(CLI::NonNegativeNumber);
  cmd->callback([o] { infera::cli::set_exit_code(run_quantize(*o)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(quantize, setup);
