// infera serve: the OpenAI-compatible server for one model (-m) or a deployment file
// (--config deploy.yaml). The whole configuration is validated (paths, tokenizer, chat
// template, limits, ports) before any weights load; every problem is reported at once.
// SIGTERM / SIGINT drain: new requests get 503, in-flight ones finish within the grace
// period, then the process exits 0.
//
// Tensor / expert parallel (--tp / --ep, or tp / ep of one model in the deploy file): the
// server runs as a group of ranks under mpirun (started here on this host, or by the user
// with mpirun across hosts; docs/parallel.md). Rank 0 runs the HTTP server, scheduler and
// engine; its model drives the other ranks, which only load their shard and mirror each
// step (run_parallel_worker). A drain on rank 0 ends with the workers stopped and every
// rank exiting 0; a rank that dies ends the group (mpirun kills the rest and names it).
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <ctime>
#include <memory>
#include <optional>
#include <thread>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/base/threads.h"
#include "infera/cli/command.h"
#include "infera/cli/serve_options.h"
#include "infera/io/gguf.h"
#include "infera/model/arch_registry.h"
#include "infera/model/gguf_loader.h"
#include "infera/model/kv_pool.h"
#include "infera/model/model.h"
#include "infera/model/parallel_model.h"
#include "infera/model/tensor_parallel.h"
#include "infera/parallel/communicator.h"
#include "infera/parallel/launch.h"
#include "infera/runtime/disk_shards.h"
#include "infera/runtime/engine_config.h"
#include "infera/server/deploy_config.h"
#include "infera/server/http_server.h"
#include "infera/server/model_instance.h"

namespace {

using namespace infera;
using namespace infera::server;

using infera::cli::ServeOptions;

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The model of a deployment that runs over a group of ranks (tp or ep above 1).
struct GroupModel {
  size_t index = 0;
  int ranks = 1;  // max(tp, ep)
};

// Finds the group model and checks its tp / ep. Throws infera::Error.
std::optional<GroupModel> find_group_model(const DeployConfig& config) {
  std::optional<GroupModel> found;
  for (size_t i = 0; i < config.models.size(); ++i) {
    const ModelDeployConfig& m = config.models[i];
    const std::string w = fmt::format("models[{}]", i);
    if (m.tp < 1 || m.ep < 1) fail("{}: tp ({}) and ep ({}) must be at least 1", w, m.tp, m.ep);
    const int ranks = std::max(m.tp, m.ep);
    if (ranks == 1) continue;
    if ((m.tp != 1 && m.tp != ranks) || (m.ep != 1 && m.ep != ranks)) {
      fail(
          "{}: tp {} with ep {}: each must be 1 or the group's size, the larger of the two (e.g. tp {} ep {}: "
          "attention split and whole experts over the same {} ranks)",
          w, m.tp, m.ep, ranks, ranks, ranks);
    }
    if (found) {
      fail(
          "models[{}] and {} both set tp/ep above 1; one server runs one group of ranks: serve the other from its "
          "own `infera serve`",
          found->index, w);
    }
    // N-gram drafts need nothing of the other ranks on an attention-only model (a verify
    // chunk is a forward with every row's logits; a rejected draft only rewinds rank 0's
    // positions). MTP needs the head, which a group does not load, and a hybrid's rejected
    // drafts need copies of a state the ranks split.
    bool hybrid = false;
    if (m.speculative.method == "ngram") {
      try {
        hybrid = arch_info(load_model_config(m.path).arch).traits.hybrid;
      } catch (const std::exception&) {
        // (an unreadable model is reported by the deployment's own checks)
      }
    }
    if (m.speculative.method == "mtp" || (m.speculative.method == "ngram" && hybrid)) {
      fail(
          "{}: speculative decoding with {} does not combine with tp/ep yet; set speculative.method none "
          "(--speculative none){} or tp/ep 1",
          w, m.speculative.method, hybrid ? "" : ", use ngram,");
    }
    found = GroupModel{i, ranks};
  }
  return found;
}

// Ranks that share a host share its cores: a group model left at threads 0 (all cores)
// gets cores / (ranks on this host) per rank.
void set_rank_threads(ModelDeployConfig& m) {
  if (m.threads > 0) return;
  m.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / parallel::launcher_local_size());
}

std::string weights_dir(const ModelDeployConfig& m) { return m.quantized_path.empty() ? m.path : m.quantized_path; }

// One rank's view of its group.
struct Group {
  size_t model_index = 0;
  parallel::Communicator* comm = nullptr;
  parallel::ParallelPlan plan;
  // Rank 0: set once it built the model that drives the workers (whose destructor stops
  // them) or stopped them itself; if never, they are stopped at shutdown.
  std::atomic<bool> workers_released{false};
};

// Rank 0: the group model loads its shard through the group and drives the workers.
void attach_group(std::vector<std::shared_ptr<ModelInstance>>& models, Group& group) {
  ModelInstance& instance = *models.at(group.model_index);
  const ModelDeployConfig& m = instance.deploy();
  parallel::check_same_model_files(*group.comm, weights_dir(m), gguf::split_paths);
  LOG_INFO("model '{}' runs over {} ranks (tp {}, ep {}, {} threads each on this host)", instance.name(),
           group.comm->size(), m.tp, m.ep, m.threads);
  instance.set_model_loader([&group](const std::string& dir, const LoadOptions& base) -> std::unique_ptr<Model> {
    LoadOptions options = base;
    options.parallel = group.plan;
    std::unique_ptr<Model> local;
    try {
      local = load_model(dir, options);
    } catch (...) {
      // The workers loaded (or are loading) their shards and will wait for steps: let them go.
      stop_parallel_workers(*group.comm, group.plan.merged_sync);
      group.workers_released = true;
      throw;
    }
    group.workers_released = true;  // from here the ParallelModel's destructor stops them
    return std::make_unique<ParallelModel>(std::move(local), *group.comm, group.plan.merged_sync);
  });
}

// Rank 0 of a group (or the only process): the HTTP server. `group` is null for one
// process; else the model at group->model_index is loaded through the group.
int serve_http(const DeployConfig& config, Group* group) {
  auto models = prepare_models(config);  // throws with every problem listed
  if (group) attach_group(models, *group);

  if (!is_loopback(config.server.host) && config.server.api_keys.empty()) {
    LOG_WARN("**********************************************************************");
    LOG_WARN("listening on {} WITHOUT API KEYS: anyone who can reach this address can", config.server.host);
    LOG_WARN("use the models. Add --api-key (or server.api_keys) or bind 127.0.0.1.");
    LOG_WARN("**********************************************************************");
  }
  for (const auto& m : models) {
    const auto& l = m->limits();
    LOG_INFO(
        "model '{}' ({}): profile {}, context {}, max_input_len {}, max_output_len {}, max_num_seqs {}, "
        "max_batch_tokens {}, prefill_chunk {}, kv cache {} MiB {}{}",
        m->name(), m->deploy().path, m->deploy().profile, l.max_context, l.max_input_len, l.max_output_len,
        l.max_num_seqs, l.max_batch_tokens, l.prefill_chunk, l.kv_cache_bytes >> 20,
        kv_cache_dtype_name(m->deploy().kv_dtype),
        m->deploy().port ? ", own port " + std::to_string(m->deploy().port) : std::string());
    if (!m->has_chat_template())
      LOG_WARN("model '{}' has no chat template: /v1/chat/completions will answer 400", m->name());
  }

  // Signals go to one thread that waits for them; every thread started below inherits
  // the blocked mask. SIGPIPE (a client gone mid-write) must never kill the server.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);  // a group's launcher asks rank 0 to drain with it (mpirun forwards it)
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  HttpServer server(config.server, models);
  server.bind();
  LOG_INFO("listening on http://{}:{}{}", config.server.host, server.port(),
           config.server.console ? " (web console: GET / and /status)" : "");

  std::atomic<bool> done{false};
  std::atomic<int> exit_code{0};
  std::thread loader([&] {
    size_t failed = 0;
    for (auto& m : models) {
      if (done) return;
      LOG_INFO("loading model '{}'", m->name());
      m->load();
      failed += m->state() == ModelState::kFailed;
    }
    if (failed == models.size()) {
      LOG_ERROR("no model could be loaded; stopping");
      exit_code = 1;
      server.stop();
    }
  });
  std::thread drainer;
  std::thread signal_waiter([&] {
    int received = 0;
    while (!done) {
      timespec timeout{0, 200 * 1000 * 1000};
      const int sig = sigtimedwait(&signals, nullptr, &timeout);
      if (sig < 0) continue;
      if (++received == 1) {
        LOG_INFO("received {}; draining (grace {} s, send again to stop at once)",
                 sig == SIGTERM  ? "SIGTERM"
                 : sig == SIGINT ? "SIGINT"
                                 : "SIGUSR1 (drain)",
                 config.server.drain_grace_s);
        drainer = std::thread([&] { server.drain_and_stop(config.server.drain_grace_s); });
      } else {
        LOG_WARN("second signal: stopping now");
        server.stop();
      }
    }
  });

  server.run();
  done = true;
  loader.join();
  signal_waiter.join();
  if (drainer.joinable()) drainer.join();
  LOG_INFO("server stopped");
  return exit_code;
}

// Ranks other than 0: load this rank's shard of the group model and mirror rank 0's steps
// until it stops the group. Same limits as rank 0's engine (scratch sized for
// max_batch_tokens); the KV pool follows rank 0's (run_parallel_worker).
int serve_worker(const DeployConfig& config, Group& group) {
  const ModelDeployConfig& m = config.models.at(group.model_index);
  const ModelConfig model_config = load_model_config(m.path);
  const ResolvedLimits limits = resolve_limits(m, model_config.max_position_embeddings);
  parallel::check_same_model_files(*group.comm, weights_dir(m), gguf::split_paths);
  set_num_threads(m.threads);
  LoadOptions options;
  options.load_into_memory = m.load_into_memory;
  options.max_batch_tokens = limits.max_batch_tokens;
  options.parallel = group.plan;
  std::unique_ptr<Model> local = load_model(weights_dir(m), options);
  DiskShardWorker disk;  // this rank's shard of the prefix cache's disk tier (--cache-dir)
  run_parallel_worker(*local, *group.comm, group.plan.merged_sync,
                      [&](const std::vector<int32_t>& words, KvPool& kv, parallel::Communicator& comm) {
                        disk.handle(words, kv, comm);
                      });
  return 0;
}

int serve(const ServeOptions& options) {
  DeployConfig config = cli::serve_deploy_config(options);
  std::optional<GroupModel> group_model = find_group_model(config);
  if (!parallel::launched_by_mpi()) {
    if (!group_model) return serve_http(config, nullptr);
    // Everything is checked here, once, with plain messages, before any rank starts.
    const ModelDeployConfig& m = config.models[group_model->index];
    std::string name;
    {
      const auto models = prepare_models(config);
      TensorShard::check_split(models.at(group_model->index)->model_config(), m.tp, m.ep, m.path);
      // (a GGUF file's row-parallel matrices: whole blocks on every rank)
      if (is_gguf_path(weights_dir(m))) TensorShard::check_split(weights_dir(m), m.tp, m.ep, false);
      name = models.at(group_model->index)->name();
    }
    LOG_INFO("starting {} ranks with mpirun for model '{}' (tp {}, ep {}); SIGTERM drains them", group_model->ranks,
             name, m.tp, m.ep);
    return parallel::run_under_mpirun(group_model->ranks, parallel::GroupSignals::kDrain);
  }

  const int world = parallel::launcher_world_size();
  if (!group_model && world > 1) {
    // Started by the user's mpirun without --tp: as `infera run`, the group is tensor parallel.
    if (config.models.size() != 1) {
      fail("started as {} ranks, but no model sets tp/ep; give the model that should run over them tp: {}", world,
           world);
    }
    config.models[0].tp = world;
    group_model = GroupModel{0, world};
  }
  if (group_model && group_model->ranks != world) {
    const ModelDeployConfig& m = config.models[group_model->index];
    fail("started as {} ranks, but models[{}] asks for tp {} / ep {}: start mpirun with -np {}", world,
         group_model->index, m.tp, m.ep, group_model->ranks);
  }
  // Signal dispositions before MPI starts its threads (they inherit the mask). Rank 0
  // waits for SIGTERM / SIGINT / SIGUSR1 (the launcher's drain request, forwarded by
  // mpirun); the workers ignore SIGUSR1 (rank 0 stops them) and die on SIGTERM, which
  // mpirun sends only when it ends the group.
  if (parallel::launcher_rank() == 0) {
    sigset_t signals;
    sigemptyset(&signals);
    for (int s : {SIGTERM, SIGINT, SIGUSR1}) sigaddset(&signals, s);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  } else {
    ::signal(SIGUSR1, SIG_IGN);
  }
  ::signal(SIGPIPE, SIG_IGN);
  if (!group_model) return serve_http(config, nullptr);  // mpirun -np 1

  set_rank_threads(config.models[group_model->index]);
  std::unique_ptr<parallel::Communicator> comm = parallel::make_mpi_communicator();
  if (comm->rank() != 0) spdlog::set_level(std::max(spdlog::get_level(), spdlog::level::warn));
  comm->set_watchdog_seconds(options.tp_timeout);
  Group group;
  group.model_index = group_model->index;
  group.comm = comm.get();
  group.plan.comm = comm.get();
  group.plan.tp = config.models[group_model->index].tp;
  group.plan.ep = config.models[group_model->index].ep;
  int code = 0;
  try {
    if (comm->rank() == 0) {
      code = serve_http(config, &group);
      // The server stopped before the group model's load began: the workers still wait.
      if (!group.workers_released) stop_parallel_workers(*comm, group.plan.merged_sync);
    } else {
      code = serve_worker(config, group);
    }
  } catch (const std::exception& e) {
    parallel::abort_group_after_error(*comm, e.what());
  }
  comm->finalize();
  return code;
}

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve models over an OpenAI-compatible HTTP API");
  auto o = std::make_shared<ServeOptions>();
  cli::add_serve_flags(cmd, *o);
  cmd->callback([o] { cli::set_exit_code(serve(*o)); });
}

INFERA_REGISTER_COMMAND(serve, setup);

}  // namespace
