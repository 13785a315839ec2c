// infera eval -m MODEL_DIR [--ref REF_DIR] --text FILE [--ctx N] [--json]
//
// Perplexity over a text, and against a reference model (typically the float original of
// a quantized model) the mean / 99th-percentile KL divergence and top-1 agreement of the
// next-token distributions.
#include <cstdio>
#include <memory>
#include <string>

#include "infera/base/error.h"
#include "infera/base/text_file.h"
#include "infera/base/threads.h"
#include "infera/cli/command.h"
#include "infera/cli/model_paths.h"
#include "infera/model/model.h"
#include "infera/tokenizer/tokenizer.h"
#include "infera/tools/eval.h"

namespace {

struct EvalCliOptions {
  std::string model_dir, ref_dir, text_file;
  int32_t ctx = 512;
  int32_t threads = 0;
  bool json = false;
};

int run_eval(const EvalCliOptions& o) {
  infera::set_num_threads(o.threads);
  const std::string text = infera::read_text_file(o.text_file, "the evaluation text (--text)");
  const infera::Tokenizer tok = infera::Tokenizer::load(o.model_dir);
  const std::vector<int32_t> ids = tok.encode(text);
  infera::LoadOptions lo;
  lo.max_batch_tokens = 128;
  std::unique_ptr<infera::Model> model = infera::load_model(o.model_dir, lo);
  std::unique_ptr<infera::Model> ref = o.ref_dir.empty() ? nullptr : infera::load_model(o.ref_dir, lo);
  const infera::tools::EvalResult r = infera::tools::evaluate(*model, ref.get(), ids, o.ctx);
  if (o.json) {
    std::printf("%s\n", infera::tools::eval_result_json(r).c_str());
    return 0;
  }
  std::printf("tokens scored   %lld (windows of %d)\n", static_cast<long long>(r.tokens), o.ctx);
  std::printf("perplexity      %.4f\n", r.ppl);
  if (r.has_ref) {
    std::printf("ref perplexity  %.4f\n", r.ref_ppl);
    std::printf("KL mean         %.6f nats\n", r.kl_mean);
    std::printf("KL p99          %.6f nats\n", r.kl_p99);
    std::printf("top-1 agreement %.2f %%\n", 100.0 * r.top1_agreement);
  }
  return 0;
}

void setup(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("eval", "Perplexity over a text; KL divergence and top-1 agreement against a reference");
  auto o = std::make_shared<EvalCliOptions>();
  cmd->add_option("-m,--model", o->model_dir,
                  "Model: a directory (quantized or not), a GGUF file, ollama:NAME or hf:ORG/NAME")
      ->required()
      ->transform(infera::cli::model_ref_transform());
  cmd->add_option("--ref", o->ref_dir,
                  "Reference model (e.g. the float original): a directory, a GGUF file, ollama:NAME or hf:ORG/NAME")
      ->transform(infera::cli::model_ref_transform());
  cmd->add_option("--text", o->text_file, "UTF-8 text file to score")->required();
  cmd->add_option("--ctx", o->ctx, "Window length in tokens (each window is a fresh sequence)")
      ->default_val(512)
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("-t,--threads", o->threads, "Threads (0: all cores)")->default_val(0)->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", o->json, "One JSON object: ppl, ref_ppl, kl_mean, kl_p99, top1_agreement, tokens");
  cmd->callback([o] { infera::cli::set_exit_code(run_eval(*o)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(eval, setup);
