#include "infera/cli/run_options.h"

#include "infera/base/options.h"
#include "infera/cli/model_paths.h"
#include "infera/cli/option_flags.h"
#include "infera/server/openai_api.h"

namespace infera::cli {

void add_run_flags(CLI::App* cmd, RunOptions& o) {
  auto add = [cmd](std::string_view name, auto& field) { return add_declared(cmd, name, field, kUseRun); };
  add("model", o.model_dir)->transform(model_ref_transform(&o.ollama_params));
  CLI::Option* prompt = add("prompt", o.prompt);
  CLI::Option* file = add("file", o.prompt_file);
  CLI::Option* ids = add("prompt_ids", o.prompt_ids);
  prompt->excludes(file);
  ids->excludes(prompt)->excludes(file);
  add("n_predict", o.n_predict);
  add("threads", o.threads);
  add("ctx", o.ctx);
  add("prefill_chunk", o.chunk);
  add("kv_dtype", o.kv_dtype);
  // The sampling flags given: the model's own defaults (--generation-config) fill the others.
  const auto sampling = [&](std::string_view name, float& field, uint32_t bit) {
    add(name, field)->each([&o, bit](const std::string&) { o.given |= bit; });
  };
  sampling("temperature", o.temperature, server::kGivenTemperature);
  add("top_k", o.top_k)->each([&o](const std::string&) { o.given |= server::kGivenTopK; });
  sampling("top_p", o.top_p, server::kGivenTopP);
  sampling("min_p", o.min_p, server::kGivenMinP);
  sampling("repetition_penalty", o.repeat_penalty, server::kGivenRepetitionPenalty);
  sampling("presence_penalty", o.presence_penalty, server::kGivenPresencePenalty);
  sampling("frequency_penalty", o.frequency_penalty, server::kGivenFrequencyPenalty);
  add("generation_config", o.generation_config);
  add("seed", o.seed);
  add("json", o.json);
  add("logprobs", o.logprobs);
  add("ignore_eos", o.ignore_eos);
  add("load_into_memory", o.no_mmap);
  add("logits_file", o.logits_file);
  add("speculative", o.speculative);
  add("draft_tokens", o.draft_tokens);
  add("tp", o.tp);
  add("ep", o.ep);
  add("tp_timeout", o.tp_timeout);
  add("tp_textbook_sync", o.tp_textbook_sync);
  add("ep_dispatch", o.ep_dispatch);
  add("dump_tensors", o.dump_tensors);
  add("dump_dir", o.dump_dir);
}

}  // namespace infera::cli
