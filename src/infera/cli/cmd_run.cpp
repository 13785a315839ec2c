// infera run: generate a continuation of a prompt with one model, streaming the text.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/base/threads.h"
#include "infera/base/timer.h"
#include "infera/cli/command.h"
#include "infera/cli/model_paths.h"
#include "infera/model/model.h"
#include "infera/runtime/block_allocator.h"
#include "infera/runtime/sampler.h"
#include "infera/runtime/sequence_runner.h"
#include "infera/tokenizer/tokenizer.h"

namespace infera::cli {
namespace {

struct RunOptions {
  std::string model_dir;
  std::string prompt;
  std::string prompt_file;
  std::string prompt_ids;  // JSON array; bypasses the tokenizer
  int32_t n_predict = 128;
  int32_t threads = 0;
  int32_t ctx = 4096;
  int32_t chunk = 512;
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int64_t seed = -1;
  bool json = false;
  bool ignore_eos = false;
  bool no_mmap = false;
  std::string logits_file;  // raw f32 logits of the prompt's last position
};

int run(const RunOptions& o) {
  set_num_threads(o.threads);
  const std::string dir = o.model_dir.empty() ? default_model_dir() : o.model_dir;
  LoadOptions load;
  load.load_into_memory = o.no_mmap;
  load.max_batch_tokens = o.chunk;
  std::unique_ptr<Model> model = load_model(dir, load);
  const ModelConfig& cfg = model->config();

  std::optional<Tokenizer> tok;
  std::vector<int32_t> prompt;
  if (!o.prompt_ids.empty()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(o.prompt_ids);
      prompt = j.get<std::vector<int32_t>>();
    } catch (const nlohmann::json::exception& e) {
      fail("--prompt-ids must be a JSON array of integers: {}", e.what());
    }
    for (int32_t id : prompt) {
      if (id < 0 || id >= cfg.vocab_size) fail("--prompt-ids: token id {} is outside the vocabulary (0..{})", id, cfg.vocab_size - 1);
    }
  }
  if (prompt.empty() || !o.json) tok = Tokenizer::load(dir);
  if (o.prompt_ids.empty()) {
    std::string text = o.prompt;
    if (!o.prompt_file.empty()) {
      std::ifstream in(o.prompt_file, std::ios::binary);
      if (!in) fail("{}: cannot read the prompt file", o.prompt_file);
      std::stringstream ss;
      ss << in.rdbuf();
      text = ss.str();
    }
    prompt = tok->encode(text, /*add_special_tokens=*/true);
  }
  if (prompt.empty()) fail("the prompt is empty and this tokenizer adds no BOS token; give -p TEXT");
  if (static_cast<int64_t>(prompt.size()) + o.n_predict > o.ctx) {
    fail("prompt ({} tokens) + -n {} exceeds the context of {} tokens; raise --ctx", prompt.size(), o.n_predict, o.ctx);
  }

  const int64_t block_size = 16;
  KvPoolShape shape = model->kv_shape(block_size);
  shape.num_blocks = (o.ctx + block_size - 1) / block_size;
  KvPool kv(shape);
  BlockAllocator blocks(static_cast<int32_t>(shape.num_blocks));
  SequenceRunner runner(*model, kv, blocks, o.chunk);

  SamplingParams sp;
  sp.temperature = o.temperature;
  sp.top_k = o.top_k;
  sp.top_p = o.top_p;
  sp.min_p = o.min_p;
  sp.repetition_penalty = o.repeat_penalty;
  sp.presence_penalty = o.presence_penalty;
  sp.frequency_penalty = o.frequency_penalty;
  sp.seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : std::random_device{}();
  if (o.seed < 0 && sp.temperature > 0) LOG_INFO("sampling seed {} (pass --seed to reproduce)", sp.seed);
  Sampler sampler(sp, cfg.vocab_size);

  std::vector<int32_t> history = prompt;
  std::vector<int32_t> generated;
  std::vector<float> logits(cfg.vocab_size);
  std::optional<IncrementalDecoder> detok;
  if (tok) detok.emplace(*tok);
  auto is_eos = [&](int32_t id) {
    if (o.ignore_eos) return false;
    for (int32_t e : cfg.eos_token_ids) if (e == id) return true;
    return tok && tok->eos_id() == id;
  };

  Timer prefill_timer;
  const float* out = runner.feed(prompt);
  const double prefill_s = prefill_timer.seconds();
  std::copy(out, out + cfg.vocab_size, logits.begin());
  if (!o.logits_file.empty()) {
    std::ofstream f(o.logits_file, std::ios::binary);
    if (!f) fail("{}: cannot write logits", o.logits_file);
    f.write(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
  }

  Timer decode_timer;
  for (int32_t i = 0; i < o.n_predict; ++i) {
    const int32_t next = sampler.sample(logits.data(), history);
    if (is_eos(next)) break;
    generated.push_back(next);
    history.push_back(next);
    if (detok && !o.json) {
      const std::string piece = detok->push(next);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    if (i + 1 == o.n_predict) break;
    out = runner.feed(std::span<const int32_t>(&next, 1));
    std::copy(out, out + cfg.vocab_size, logits.begin());
  }
  if (detok && !o.json) {
    const std::string rest = detok->flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  const double decode_s = decode_timer.seconds();
  // The first generated token comes from the prefill logits; decode time covers the rest.
  const double gen_tps = generated.size() > 1 ? (generated.size() - 1) / decode_s : 0.0;
  const double prompt_tps = prompt.size() / prefill_s;
  if (o.json) {
    nlohmann::json j = {{"ids", generated},
                        {"prompt_tokens", prompt.size()},
                        {"prompt_tokens_per_s", prompt_tps},
                        {"generated_tokens", generated.size()},
                        {"generated_tokens_per_s", gen_tps}};
    if (tok) j["text"] = tok->decode(generated);
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\n\nprompt: %zu tokens, %.2f tokens/s | generated: %zu tokens, %.2f tokens/s\n", prompt.size(),
                prompt_tps, generated.size(), gen_tps);
  }
  return 0;
}

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt with one model");
  auto o = std::make_shared<RunOptions>();
  cmd->add_option("-m,--model", o->model_dir, "Model directory (Hugging Face layout); default: the built-in model");
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "Prompt text");
  auto* f = cmd->add_option("-f,--file", o->prompt_file, "Read the prompt from a file");
  auto* ids = cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt as a JSON array of token ids");
  p->excludes(f);
  ids->excludes(p)->excludes(f);
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->default_val(128)->check(CLI::NonNegativeNumber);
  cmd->add_option("-t,--threads", o->threads, "Threads (0: all cores)")->default_val(0)->check(CLI::NonNegativeNumber);
  cmd->add_option("-c,--ctx", o->ctx, "Context length (prompt + generated)")->default_val(4096)->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-chunk", o->chunk, "Prompt tokens per forward")->default_val(512)->check(CLI::PositiveNumber);
  cmd->add_option("--temp", o->temperature, "Temperature (0: greedy)")->default_val(0.8)->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-k", o->top_k, "Top-k (0: off)")->default_val(40)->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o->top_p, "Top-p (1: off)")->default_val(0.95)->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", o->min_p, "Min-p (0: off)")->default_val(0.05)->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", o->repeat_penalty, "Repetition penalty (1: off)")->default_val(1.0)->check(CLI::PositiveNumber);
  cmd->add_option("--presence-penalty", o->presence_penalty, "Presence penalty")->default_val(0.0);
  cmd->add_option("--frequency-penalty", o->frequency_penalty, "Frequency penalty")->default_val(0.0);
  cmd->add_option("--seed", o->seed, "Sampling seed (-1: random)")->default_val(-1);
  cmd->add_flag("--json", o->json, "Print one JSON object as the last line instead of text");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating after end-of-sequence tokens");
  cmd->add_flag("--no-mmap", o->no_mmap, "Read weights into memory instead of mapping the files");
  cmd->add_option("--logits-file", o->logits_file, "Write the prompt's last-position logits (raw f32)");
  cmd->callback([o] { set_exit_code(run(*o)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(run, setup);

}  // namespace infera::cli
