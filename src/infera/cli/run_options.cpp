#include "infera/cli/run_options.h"

#include <utility>
#include <vector>

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
  // The sampling flags given (counted once parsed: a default is not given), for the model's
  // own defaults (--generation-config) to fill the others.
  std::vector<std::pair<CLI::Option*, uint32_t>> sampling = {
      {add("temperature", o.temperature), server::kGivenTemperature},
      {add("top_k", o.top_k), server::kGivenTopK},
      {add("top_p", o.top_p), server::kGivenTopP},
      {add("min_p", o.min_p), server::kGivenMinP},
      {add("repetition_penalty", o.repeat_penalty), server::kGivenRepetitionPenalty},
      {add("presence_penalty", o.presence_penalty), server::kGivenPresencePenalty},
      {add("frequency_penalty", o.frequency_penalty), server::kGivenFrequencyPenalty}};
  cmd->parse_complete_callback([&o, sampling = std::move(sampling)] {
    o.given = 0;
    for (const auto& [opt, bit] : sampling)
      if (opt->count() > 0) o.given |= bit;
  });
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
