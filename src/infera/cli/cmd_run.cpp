// infera run: generate a continuation of a prompt with one model, streaming the text.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/base/text_file.h"
#include "infera/base/threads.h"
#include "infera/base/timer.h"
#include "infera/cli/command.h"
#include "infera/cli/model_paths.h"
#include "infera/cli/run_options.h"
#include "infera/io/gguf.h"
#include "infera/io/model_ref.h"
#include "infera/model/model.h"
#include "infera/model/parallel_model.h"
#include "infera/model/tensor_dump.h"
#include "infera/model/tensor_parallel.h"
#include "infera/parallel/communicator.h"
#include "infera/parallel/launch.h"
#include "infera/runtime/block_allocator.h"
#include "infera/runtime/engine.h"
#include "infera/runtime/sampler.h"
#include "infera/runtime/sequence_runner.h"
#include "infera/server/deploy_config.h"
#include "infera/server/generation_defaults.h"
#include "infera/tokenizer/tokenizer.h"

namespace infera::cli {
namespace {

// One generated token's log-probabilities as printed by --json --logprobs.
nlohmann::json logprobs_json(const TokenLogprobs& lp) {
  nlohmann::json top = nlohmann::json::array();
  for (const TokenLogprob& t : lp.top) top.push_back({{"id", t.token}, {"logprob", t.logprob}});
  return {{"id", lp.sampled.token}, {"logprob", lp.sampled.logprob}, {"top_logprobs", top}};
}

// What each rank reports to rank 0 at the end of a parallel run.
struct RankReport {
  int64_t vm_hwm_kib = 0;
  int64_t vm_rss_kib = 0;
  int64_t collectives = 0;
  int64_t bytes = 0;
  double comm_seconds = 0;
  int64_t weight_bytes_per_token = 0;  // this rank's shard
};

RankReport own_report(const parallel::Communicator& comm, const Model& model) {
  const parallel::CommStats& st = comm.stats();
  return RankReport{parallel::peak_rss_kib(),      parallel::current_rss_kib(), st.calls(), st.bytes(), st.seconds(),
                    model.weight_bytes_per_token()};
}

// Achieved weight-read bandwidth: bytes of weights one decode step reads (summed over the
// ranks of a group) times decode steps per second, in GB/s (10^9 bytes). KV reads are not
// counted, so this is a lower bound of the memory traffic.
double weight_gb_per_s(int64_t weight_bytes_per_step, double steps_per_s) {
  return static_cast<double>(weight_bytes_per_step) * steps_per_s / 1e9;
}

// What `--json` prints for every run (speculative and parallel runs add their sections).
nlohmann::json run_json(const RunOptions& o, const SamplingParams& sp, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& generated, const std::optional<Tokenizer>& tok,
                        const nlohmann::json& token_logprobs, double prompt_tps, double gen_tps, double gen_gbs,
                        int64_t weight_bytes) {
  nlohmann::json j = {{"ids", generated},
                      {"prompt_tokens", prompt.size()},
                      {"prompt_tokens_per_s", prompt_tps},
                      {"generated_tokens", generated.size()},
                      {"generated_tokens_per_s", gen_tps},
                      {"generated_gb_per_s", gen_gbs},
                      {"weight_bytes_per_token", weight_bytes}};
  if (tok) j["text"] = tok->decode(generated);
  if (o.logprobs >= 0) j["logprobs"] = token_logprobs;
  // What the sampler used: the flags, the model's defaults for those not given, the seed.
  // (A float as its shortest decimal: 0.05, not 0.05000000074505806.)
  const auto decimal = [](float v) { return std::stod(fmt::format("{}", v)); };
  j["sampling"] = {{"temperature", decimal(sp.temperature)},
                   {"top_k", sp.top_k},
                   {"top_p", decimal(sp.top_p)},
                   {"min_p", decimal(sp.min_p)},
                   {"repetition_penalty", decimal(sp.repetition_penalty)},
                   {"presence_penalty", decimal(sp.presence_penalty)},
                   {"frequency_penalty", decimal(sp.frequency_penalty)},
                   {"seed", sp.seed}};
  return j;
}

// The sampling flags, the model's own defaults (--generation-config: generation_config.json,
// an Ollama model's params) filling those not given, as serve fills a request's; `log`: name
// the values taken and those left out.
SamplingParams run_sampling(const RunOptions& o, const std::string& dir, const std::string& ollama_params, bool log) {
  server::GenerationOptions g;
  g.temperature = o.temperature;
  g.top_k = o.top_k;
  g.top_p = o.top_p;
  g.min_p = o.min_p;
  g.repetition_penalty = o.repeat_penalty;
  g.presence_penalty = o.presence_penalty;
  g.frequency_penalty = o.frequency_penalty;
  g.given = o.given;
  server::ModelDeployConfig m;
  m.path = dir;
  m.generation_config = o.generation_config;
  m.ollama_params = ollama_params;
  const server::GenerationDefaults d = server::load_generation_defaults(m);
  d.apply(g);
  if (log) {
    for (const std::string& why : d.ignored) LOG_WARN("ignoring a sampling default: {}", why);
    // What was taken: the values of flags not given (stop strings, a system prompt and
    // preset messages are the server's).
    const server::GenerationDefaults taken = d.taken_by(o.given | server::kGivenStop);
    if (!taken.empty())
      LOG_INFO("the model's sampling defaults for the flags not given, from {}: {}", d.source, taken.describe());
  }
  return server::sampling_of(g);
}

// Speculative decoding: the engine core (one sequence) owns the draft/verify loop, so
// `infera run` uses it instead of the SequenceRunner. Same prompt, sampling and output.
int generate_speculative(const RunOptions& o, Model& model, const std::vector<int32_t>& prompt,
                         const SamplingParams& sampling, const std::optional<Tokenizer>& tok) {
  // The engine settings as a served model's (server::engine_config), for one sequence of
  // at most --ctx tokens.
  server::ModelDeployConfig m;
  parse_speculative_method(o.speculative, "--speculative");  // a bad method named as the flag
  m.speculative.method = o.speculative;
  m.speculative.num_draft_tokens = o.draft_tokens;
  m.enable_prefix_cache = false;
  m.kv_dtype = parse_kv_cache_dtype(o.kv_dtype);
  server::ResolvedLimits limits;
  limits.max_num_seqs = 1;
  limits.max_batch_tokens = o.chunk;  // the model's scratch is sized for --prefill-chunk tokens
  limits.prefill_chunk = o.chunk;
  limits.max_context = o.ctx;
  const int32_t block_size = EngineConfig{}.block_size;
  KvPoolShape shape = model.kv_shape(block_size);
  shape.dtype = m.kv_dtype;
  limits.kv_cache_bytes = ((o.ctx + block_size - 1) / block_size) * shape.bytes_per_block();
  EngineConfig c = server::engine_config(m, limits);
  c.allow_context_beyond_model = true;  // as the plain path: --ctx is the user's call
  EngineCore core(model, c);

  Request r;
  r.prompt_ids = prompt;
  r.sampling = sampling;
  r.max_tokens = o.n_predict;
  r.ignore_eos = o.ignore_eos;
  r.logprobs = o.logprobs >= 0;
  r.top_logprobs = std::max(o.logprobs, 0);
  if (!o.ignore_eos && tok && tok->eos_id() >= 0) r.stop_token_ids.push_back(tok->eos_id());
  std::vector<int32_t> generated;
  nlohmann::json token_logprobs_out = nlohmann::json::array();
  std::optional<IncrementalDecoder> detok;
  if (tok) detok.emplace(*tok);
  Timer timer;
  double first_token_s = 0;
  core.add_request(r, [&](const Event& e) {
    if (e.is_final()) {
      if (e.finish == FinishReason::kError) fail("generation failed: {}", e.error);
      return;
    }
    if (generated.empty()) first_token_s = timer.seconds();
    generated.push_back(e.token);
    if (e.logprobs) token_logprobs_out.push_back(logprobs_json(*e.logprobs));
    if (detok && !o.json) {
      const std::string piece = detok->push(e.token);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  });
  while (core.has_work()) core.step();
  if (detok && !o.json) {
    const std::string rest = detok->flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  // The first token comes with the prefill; decode time covers the rest, as the plain path.
  const double decode_s = timer.seconds() - first_token_s;
  const double gen_tps = generated.size() > 1 && decode_s > 0 ? (generated.size() - 1) / decode_s : 0.0;
  const double prompt_tps = first_token_s > 0 ? prompt.size() / first_token_s : 0.0;
  const EngineStats st = core.stats();
  // Each decode step (one forward, however many tokens it accepts) reads the weights once.
  const int64_t weight_bytes = model.weight_bytes_per_token();
  const double gen_gbs = decode_s > 0 ? weight_gb_per_s(weight_bytes, st.spec_decode_steps / decode_s) : 0.0;
  const char* method = speculative_method_name(c.speculative.method);
  std::vector<double> by_position;
  for (size_t i = 0; i < st.spec_drafted_per_pos.size(); ++i) {
    by_position.push_back(st.spec_drafted_per_pos[i] > 0
                              ? static_cast<double>(st.spec_accepted_per_pos[i]) / st.spec_drafted_per_pos[i]
                              : 0.0);
  }
  if (o.json) {
    nlohmann::json j =
        run_json(o, sampling, prompt, generated, tok, token_logprobs_out, prompt_tps, gen_tps, gen_gbs, weight_bytes);
    j["speculative"] = {{"method", method},
                        {"draft_tokens", c.speculative.draft_tokens()},
                        {"drafted", st.spec_drafted},
                        {"accepted", st.spec_accepted},
                        {"acceptance_rate", st.spec_acceptance_rate()},
                        {"tokens_per_step", st.spec_tokens_per_step()},
                        {"decode_steps", st.spec_decode_steps},
                        {"acceptance_by_position", by_position}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\n\nprompt: %zu tokens, %.2f tokens/s | generated: %zu tokens, %.2f tokens/s, %.2f GB/s\n",
                prompt.size(), prompt_tps, generated.size(), gen_tps, gen_gbs);
    std::string positions;
    for (double a : by_position) positions += fmt::format(" {:.2f}", a);
    std::printf(
        "speculative %s, %d draft tokens: %lld drafted, %lld accepted (%.1f%%), %.2f tokens per decode step, "
        "acceptance by position:%s\n",
        method, c.speculative.draft_tokens(), static_cast<long long>(st.spec_drafted),
        static_cast<long long>(st.spec_accepted), 100.0 * st.spec_acceptance_rate(), st.spec_tokens_per_step(),
        positions.c_str());
  }
  return 0;
}

int generate(const RunOptions& o, parallel::Communicator* comm) {
  const bool group = comm != nullptr;
  const int rank = group ? comm->rank() : 0;
  int threads = o.threads;
  if (group && threads == 0) {
    // Ranks sharing a host share its cores: all cores each would oversubscribe them.
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / parallel::launcher_local_size());
  }
  set_num_threads(threads);
  std::string dir = o.model_dir, ollama_params = o.ollama_params;
  if (dir.empty()) {  // the built-in model, or the one INFERA_DEFAULT_MODEL names (a store's too)
    ResolvedModelRef ref = resolve_model_ref(default_model_ref());
    dir = std::move(ref.path);
    ollama_params = std::move(ref.params);
  }
  // Before the load: a --generation-config that cannot be read fails at once (on every rank).
  SamplingParams sp = run_sampling(o, dir, ollama_params, rank == 0);
  LoadOptions load;
  load.load_into_memory = o.no_mmap;
  load.max_batch_tokens = o.chunk;
  if (group) {
    parallel::check_same_model_files(*comm, dir, gguf::split_paths);
    load.parallel.comm = comm;
    load.parallel.tp = o.tp;
    load.parallel.ep = o.ep;
    load.parallel.merged_sync = !o.tp_textbook_sync;
    load.parallel.ep_all_to_all = o.ep_dispatch == "all-to-all";
    comm->set_watchdog_seconds(o.tp_timeout);
    if (o.no_mmap)
      LOG_WARN("--no-mmap with --tp/--ep: every rank reads the whole checkpoint into memory while it loads");
  }
  std::unique_ptr<Model> model = load_model(dir, load);
  std::unique_ptr<TensorDump> dump;
  if (!o.dump_tensors.empty()) {
    if (group) fail("--dump-tensors runs in one process (a tensor-parallel rank holds partial sums); drop --tp/--ep");
    dump = std::make_unique<TensorDump>(o.dump_tensors, o.dump_dir);
    model->set_tensor_dump(dump.get());
  }
  const ModelConfig& cfg = model->config();
  const int64_t block_size = 16;
  const int64_t num_blocks = (o.ctx + block_size - 1) / block_size;

  if (group && rank != 0) {
    // Mirror rank 0's steps on this rank's shard until it is done, then report.
    run_parallel_worker(*model, *comm, load.parallel.merged_sync);
    const RankReport mine = own_report(*comm, *model);
    comm->gather(&mine, sizeof(mine), nullptr, 0);
    return 0;
  }
  ParallelModel* parallel_model = nullptr;
  if (group) {
    auto wrapped = std::make_unique<ParallelModel>(std::move(model), *comm, load.parallel.merged_sync);
    parallel_model = wrapped.get();
    model = std::move(wrapped);
  }

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
      if (id < 0 || id >= cfg.vocab_size)
        fail("--prompt-ids: token id {} is outside the vocabulary (0..{})", id, cfg.vocab_size - 1);
    }
  }
  if (prompt.empty() || !o.json) tok = Tokenizer::load(dir);
  if (o.prompt_ids.empty()) {
    std::string text = o.prompt;
    if (!o.prompt_file.empty()) text = read_text_file(o.prompt_file, "the prompt file (--file)");
    prompt = tok->encode(text, /*add_special_tokens=*/true);
  }
  if (prompt.empty()) fail("the prompt is empty and this tokenizer adds no BOS token; give -p TEXT");
  if (static_cast<int64_t>(prompt.size()) + o.n_predict > o.ctx) {
    fail("prompt ({} tokens) + -n {} exceeds the context of {} tokens; raise --ctx", prompt.size(), o.n_predict, o.ctx);
  }

  sp.seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : std::random_device{}();
  if (o.seed < 0 && sp.temperature > 0) LOG_INFO("sampling seed {} (pass --seed to reproduce)", sp.seed);
  if (o.speculative != "none" && o.n_predict > 0) {
    if (group) fail("--speculative does not combine with --tp/--ep yet; run without one of them");
    if (!o.logits_file.empty()) fail("--logits-file works without --speculative; drop one of them");
    return generate_speculative(o, *model, prompt, sp, tok);
  }
  Sampler sampler(sp, cfg.vocab_size);
  KvPoolShape shape = model->kv_shape(block_size);
  shape.num_blocks = num_blocks;
  shape.dtype = parse_kv_cache_dtype(o.kv_dtype);
  KvPool kv(shape);
  BlockAllocator blocks(static_cast<int32_t>(shape.num_blocks));
  SequenceRunner runner(*model, kv, blocks, o.chunk);

  std::vector<int32_t> history = prompt;
  std::vector<int32_t> generated;
  std::vector<float> logits(cfg.vocab_size);
  std::optional<IncrementalDecoder> detok;
  if (tok) detok.emplace(*tok);
  auto is_eos = [&](int32_t id) {
    if (o.ignore_eos) return false;
    for (int32_t e : cfg.eos_token_ids)
      if (e == id) return true;
    return tok && tok->eos_id() == id;
  };

  Timer prefill_timer;
  const CpuTimer prefill_cpu;
  const float* out = runner.feed(prompt);
  const double prefill_s = prefill_timer.seconds();
  const double prefill_cpu_s = prefill_cpu.seconds();
  std::copy(out, out + cfg.vocab_size, logits.begin());
  if (!o.logits_file.empty()) {
    std::ofstream f(o.logits_file, std::ios::binary);
    if (!f) fail("{}: cannot write logits", o.logits_file);
    f.write(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
  }

  const parallel::CommStats comm_before_decode = group ? comm->stats() : parallel::CommStats{};
  int64_t decode_steps = 0;
  nlohmann::json token_logprobs_out = nlohmann::json::array();
  std::vector<float> raw;  // the row before sampling (the sampler works in place)
  Timer decode_timer;
  const CpuTimer decode_cpu;
  for (int32_t i = 0; i < o.n_predict; ++i) {
    if (o.logprobs >= 0) raw = logits;
    const int32_t next = sampler.sample(logits.data(), history);
    if (is_eos(next)) break;
    if (o.logprobs >= 0) {
      token_logprobs_out.push_back(logprobs_json(token_logprobs(raw.data(), cfg.vocab_size, next, o.logprobs)));
    }
    generated.push_back(next);
    history.push_back(next);
    if (detok && !o.json) {
      const std::string piece = detok->push(next);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    if (i + 1 == o.n_predict) break;
    out = runner.feed(std::span<const int32_t>(&next, 1));
    ++decode_steps;
    std::copy(out, out + cfg.vocab_size, logits.begin());
  }
  if (detok && !o.json) {
    const std::string rest = detok->flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  const double decode_s = decode_timer.seconds();
  const double decode_cpu_s = decode_cpu.seconds();
  int64_t weight_bytes = model->weight_bytes_per_token();  // under --tp/--ep: every rank's shard, summed below
  nlohmann::json parallel_json;
  if (group) {
    const parallel::CommStats& now = comm->stats();
    const int64_t calls = now.calls() - comm_before_decode.calls();
    const int64_t bytes = now.bytes() - comm_before_decode.bytes();
    const double secs = now.seconds() - comm_before_decode.seconds();
    parallel_model->stop_workers();
    std::vector<RankReport> reports(static_cast<size_t>(comm->size()));
    const RankReport mine = own_report(*comm, *model);
    comm->gather(&mine, sizeof(mine), reports.data(), 0);
    nlohmann::json ranks = nlohmann::json::array();
    weight_bytes = 0;
    for (int r = 0; r < comm->size(); ++r) {
      const RankReport& rr = reports[r];
      weight_bytes += rr.weight_bytes_per_token;
      ranks.push_back({{"rank", r},
                       {"vm_hwm_kib", rr.vm_hwm_kib},
                       {"vm_rss_kib", rr.vm_rss_kib},
                       {"collectives", rr.collectives},
                       {"bytes", rr.bytes},
                       {"comm_seconds", rr.comm_seconds},
                       {"weight_bytes_per_token", rr.weight_bytes_per_token}});
    }
    const double steps = std::max<int64_t>(decode_steps, 1);
    parallel_json = {{"tp", o.tp},
                     {"ep", o.ep},
                     {"sync", o.tp_textbook_sync ? "textbook" : "merged"},
                     {"ep_dispatch", o.ep_dispatch},
                     {"decode_collectives_per_token", calls / steps},
                     {"decode_bytes_per_token", bytes / steps},
                     {"decode_comm_share", decode_s > 0 ? secs / decode_s : 0.0},
                     {"ranks", ranks}};
    if (!o.json) {
      std::fprintf(
          stderr,
          "tp %d ep %d: %.1f collectives and %.0f bytes per decode token, %.1f%% of decode time in collectives\n", o.tp,
          o.ep, calls / steps, bytes / steps, decode_s > 0 ? 100.0 * secs / decode_s : 0.0);
    }
  }
  // The first generated token comes from the prefill logits; decode time covers the rest.
  const double gen_tps = generated.size() > 1 ? (generated.size() - 1) / decode_s : 0.0;
  const double prompt_tps = prompt.size() / prefill_s;
  // One decode step per generated token after the first.
  const double gen_gbs = weight_gb_per_s(weight_bytes, gen_tps);
  if (o.json) {
    nlohmann::json j =
        run_json(o, sp, prompt, generated, tok, token_logprobs_out, prompt_tps, gen_tps, gen_gbs, weight_bytes);
    // Tokens per second of the process's CPU time (all threads): steadier than wall time on a
    // loaded machine; with one thread, the speed the machine would give unloaded.
    j["prompt_cpu_tokens_per_s"] = prefill_cpu_s > 0 ? prompt.size() / prefill_cpu_s : 0.0;
    j["generated_cpu_tokens_per_s"] =
        generated.size() > 1 && decode_cpu_s > 0 ? (generated.size() - 1) / decode_cpu_s : 0.0;
    if (group) j["parallel"] = parallel_json;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\n\nprompt: %zu tokens, %.2f tokens/s | generated: %zu tokens, %.2f tokens/s, %.2f GB/s\n",
                prompt.size(), prompt_tps, generated.size(), gen_tps, gen_gbs);
  }
  return 0;
}

// Entry: one process, or one rank of a group. `infera run --tp N` outside mpirun restarts
// itself as N ranks under mpirun; under mpirun the world size is the group (--tp defaults
// to it when neither --tp nor --ep is given).
int run(std::shared_ptr<RunOptions> opts) {
  RunOptions& o = *opts;
  if (o.logprobs >= 0 && !o.json) fail("--logprobs prints with --json (one JSON object per run)");
  if (o.ep_dispatch == "all-to-all" && (o.ep == 1 || o.tp != 1)) {
    fail(
        "--ep-dispatch all-to-all needs --ep N without --tp (tokens split across ranks); with tensor-parallel "
        "attention every rank holds every token and the dispatch is local");
  }
  if (!parallel::launched_by_mpi()) {
    const int ranks = std::max(o.tp, o.ep);
    if (ranks > 1) {
      // Checked here, once, before any rank starts (the ranks check again as they bind).
      TensorShard::check_split(o.model_dir.empty() ? default_model_dir() : o.model_dir, o.tp, o.ep,
                               o.ep_dispatch == "all-to-all");
      return parallel::run_under_mpirun(ranks, parallel::GroupSignals::kStop);
    }
    return generate(o, nullptr);
  }
  if (parallel::launcher_world_size() > 1 && o.tp == 1 && o.ep == 1) o.tp = parallel::launcher_world_size();
  std::unique_ptr<parallel::Communicator> comm = parallel::make_mpi_communicator();
  if (comm->rank() != 0) spdlog::set_level(std::max(spdlog::get_level(), spdlog::level::warn));
  int code = 0;
  try {
    code = generate(o, comm.get());
  } catch (const std::exception& e) {
    parallel::abort_group_after_error(*comm, e.what());
  }
  comm->finalize();
  return code;
}

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt with one model");
  auto o = std::make_shared<RunOptions>();
  add_run_flags(cmd, *o);
  cmd->callback([o] { set_exit_code(run(o)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(run, setup);

}  // namespace infera::cli
