#include "infera/server/console.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "infera/base/cpu.h"
#include "infera/base/error.h"
#include "infera/base/threads.h"
#include "infera/io/gguf.h"
#include "infera/model/config.h"
#include "infera/model/quantized_weights.h"
#include "infera/tensor/dtype.h"

// Set by CMakeLists.txt for this file only.
#ifndef INFERA_VERSION_STRING
#define INFERA_VERSION_STRING "unknown"
#endif
#ifndef INFERA_BUILD_TYPE
#define INFERA_BUILD_TYPE ""
#endif
#ifndef INFERA_COMPILER
#define INFERA_COMPILER ""
#endif
#ifndef INFERA_CXX_FLAGS
#define INFERA_CXX_FLAGS ""
#endif
#ifndef INFERA_WITH_MPI
#define INFERA_WITH_MPI 0
#endif

namespace infera::server {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const kConsoleCsp =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const WebAsset* find_web_asset(std::string_view path) {
  std::string_view name;
  if (path == "/")
    name = "index.html";
  else if (path == "/status")
    name = "status.html";
  else if (path.starts_with("/console/"))
    name = path.substr(9);
  else
    return nullptr;
  if (name.empty()) return nullptr;
  for (const WebAsset& a : web_assets()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

namespace {

// An If-None-Match list ("a", W/"b", *) naming `etag`.
bool etag_matches(std::string_view header, std::string_view etag) {
  size_t pos = 0;
  while (pos < header.size()) {
    size_t end = header.find(',', pos);
    if (end == std::string_view::npos) end = header.size();
    std::string_view item = header.substr(pos, end - pos);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (item.starts_with("W/")) item.remove_prefix(2);
    if (item == "*" || item == etag) return true;
    pos = end + 1;
  }
  return false;
}

}  // namespace

int64_t weight_file_bytes(const std::string& path) {
  int64_t total = 0;
  std::error_code ec;
  if (gguf::is_gguf_file(path)) {
    try {
      for (const std::string& part : gguf::split_paths(path)) {
        const auto size = fs::file_size(part, ec);
        if (!ec) total += static_cast<int64_t>(size);
      }
    } catch (const Error&) {
      // (a split file with parts missing does not load: nothing to count)
    }
    return total;
  }
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    const auto ext = entry.path().extension();
    if (ext != ".safetensors" && ext != ".gguf") continue;
    const auto size = entry.file_size(ec);
    if (!ec) total += static_cast<int64_t>(size);
  }
  return total;
}

namespace {

// VmRSS and VmHWM of this process in bytes (0 when /proc is not there).
std::pair<int64_t, int64_t> resident_bytes() {
  std::ifstream in("/proc/self/status");
  int64_t rss = 0, peak = 0;
  for (std::string line; std::getline(in, line);) {
    auto kib = [&](const char* key) { return std::stoll(line.substr(std::string_view(key).size())) * 1024; };
    try {
      if (line.starts_with("VmRSS:")) rss = kib("VmRSS:");
      if (line.starts_with("VmHWM:")) peak = kib("VmHWM:");
    } catch (const std::exception&) {
    }
  }
  return {rss, peak};
}

json engine_json(const EngineStats& s) {
  const int64_t queried = s.prefix_hit_blocks + s.prefix_miss_blocks;
  json j = {{"running", s.running},
            {"waiting", s.waiting},
            {"kv_blocks_total", s.kv_blocks_total},
            {"kv_blocks_used", s.kv_blocks_used},
            {"kv_blocks_cached", s.kv_blocks_cached},
            {"block_size", s.block_size},
            {"kv_bytes_per_block", s.kv_bytes_per_block},
            {"prefix_hit_blocks", s.prefix_hit_blocks},
            {"prefix_queried_blocks", queried},
            {"prefix_hit_rate", queried > 0 ? double(s.prefix_hit_blocks) / double(queried) : 0.0},
            {"preemptions", s.preemptions},
            {"steps", s.steps},
            {"tokens_generated", s.tokens_generated},
            {"requests_finished", s.requests_finished},
            {"spec_drafted", s.spec_drafted},
            {"spec_accepted", s.spec_accepted},
            {"spec_acceptance_rate", s.spec_acceptance_rate()},
            {"spec_tokens_per_step", s.spec_tokens_per_step()}};
  if (s.parallel.ranks > 1) {
    j["parallel"] = {{"ranks", s.parallel.ranks},
                     {"collectives", s.parallel.collectives},
                     {"bytes", s.parallel.bytes},
                     {"comm_seconds", s.parallel.comm_seconds}};
  }
  return j;
}

}  // namespace

HttpResponse web_asset_response(const WebAsset& asset, const HttpRequest& request) {
  HttpResponse r;
  r.content_type = std::string(asset.content_type);
  r.headers = {{"ETag", std::string(asset.etag)},
               {"Cache-Control", "no-cache"},
               {"Content-Security-Policy", kConsoleCsp},
               {"X-Content-Type-Options", "nosniff"},
               {"X-Frame-Options", "DENY"},
               {"Referrer-Policy", "no-referrer"},
               {"Cross-Origin-Opener-Policy", "same-origin"},
               {"Cross-Origin-Resource-Policy", "same-origin"}};
  if (const std::string* inm = request.find("If-None-Match"); inm && etag_matches(*inm, asset.etag)) {
    r.status = 304;
    return r;
  }
  r.body = std::string(asset.body);
  return r;
}

ConsoleStats::ConsoleStats(const ServerConfig& config, const std::vector<std::shared_ptr<ModelInstance>>& models)
    : start_(std::chrono::steady_clock::now()), keys_(!config.api_keys.empty()) {
  for (const auto& m : models) {
    const ModelDeployConfig& d = m->deploy();
    const std::string dir = d.quantized_path.empty() ? d.path : d.quantized_path;
    Facts f;
    f.weights_bytes = weight_file_bytes(dir);
    try {
      const QuantizationConfig q = read_quantization_config(dir);
      if (q.present) {
        LayerQuant l;
        l.dense = false;
        l.scheme = q.scheme;
        l.group_size = q.group_size;
        f.quantization = l.label();
      }
    } catch (const std::exception&) {  // the loader reports a bad quantization_config
    }
    if (f.quantization.empty()) f.quantization = d.scheme;
    if (f.quantization.empty()) {
      const std::string& t = m->model_config().torch_dtype;
      f.quantization = (t.empty() ? std::string("unquantized") : t + " (unquantized)");
    }
    planned_bytes_ += f.weights_bytes + m->limits().kv_cache_bytes;
    facts_[m->name()] = std::move(f);
  }
}

json ConsoleStats::render(const std::vector<std::shared_ptr<ModelInstance>>& visible, const Metrics& metrics,
                          bool draining, int64_t in_flight) const {
  json models = json::array();
  for (const auto& m : visible) {
    const ModelDeployConfig& d = m->deploy();
    const ModelConfig& c = m->model_config();
    const ResolvedLimits& l = m->limits();
    auto backend = m->backend();  // notices an engine that died
    const ModelState state = m->state();
    json j;
    j["name"] = m->name();
    j["state"] = model_state_name(state);
    j["load_seconds"] = m->load_seconds();
    const LoadProgress::Snapshot progress = m->load_progress();
    j["load_progress"] = {{"fraction", progress.fraction},     {"step", progress.step},
                          {"step_done", progress.done},        {"step_total", progress.total},
                          {"steps_done", progress.steps_done}, {"steps", progress.steps}};
    if (state == ModelState::kFailed) j["failure"] = m->failure();
    j["architecture"] = arch_name(c.arch);
    j["model_type"] = c.model_type;
    j["layers"] = c.num_layers;
    j["hidden_size"] = c.hidden_size;
    j["vocab_size"] = c.vocab_size;
    j["experts"] = c.num_experts;
    j["experts_per_token"] = c.num_experts_per_tok;
    const auto facts = facts_.find(m->name());
    j["quantization"] = facts != facts_.end() ? facts->second.quantization : d.scheme;
    j["kv_dtype"] = std::string(dtype_name(d.kv_dtype));
    j["threads"] = d.threads > 0 ? d.threads : num_threads();
    j["tp"] = d.tp;
    j["ep"] = d.ep;
    j["speculative"] = {{"method", d.speculative.method}, {"num_draft_tokens", d.speculative.num_draft_tokens}};
    j["prefix_cache"] = d.enable_prefix_cache;
    j["load_into_memory"] = d.load_into_memory;
    j["limits"] = {{"max_context", l.max_context},       {"max_input_len", l.max_input_len},
                   {"max_output_len", l.max_output_len}, {"max_batch_tokens", l.max_batch_tokens},
                   {"max_num_seqs", l.max_num_seqs},     {"prefill_chunk", l.prefill_chunk},
                   {"max_queue", l.max_queue},           {"kv_cache_bytes", l.kv_cache_bytes}};
    int64_t kv_committed = 0;
    if (backend) {
      const EngineStats s = backend->stats();
      j["engine"] = engine_json(s);
      kv_committed = int64_t(s.kv_blocks_used + s.kv_blocks_cached) * s.kv_bytes_per_block;
      const std::vector<uint64_t> counts = backend->expert_counts();
      if (c.num_experts > 0 && !counts.empty() && counts.size() % size_t(c.num_experts) == 0) {
        json layers = json::array();
        for (size_t at = 0; at < counts.size(); at += size_t(c.num_experts)) {
          // Dense layers of a MoE model route nothing: skipped, their index kept.
          const bool any =
              std::any_of(counts.begin() + at, counts.begin() + at + c.num_experts, [](uint64_t v) { return v > 0; });
          if (!any && !c.is_moe_layer(int(at / size_t(c.num_experts)))) continue;
          layers.push_back(
              {{"layer", at / size_t(c.num_experts)},
               {"tokens", std::vector<uint64_t>(counts.begin() + at, counts.begin() + at + c.num_experts)}});
        }
        j["expert_load"] = std::move(layers);
      }
    }
    j["counters"] = metrics.model_json(m->name());
    j["memory"] = {{"weights_bytes", facts != facts_.end() ? facts->second.weights_bytes : 0},
                   {"kv_budget_bytes", l.kv_cache_bytes},
                   {"kv_committed_bytes", kv_committed}};
    models.push_back(std::move(j));
  }
  const auto [rss, peak] = resident_bytes();
  const CpuFeatures& cpu = cpu_features();
  json server = {{"version", INFERA_VERSION_STRING},
                 {"uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count()},
                 {"build",
                  {{"type", INFERA_BUILD_TYPE},
                   {"compiler", INFERA_COMPILER},
                   {"flags", INFERA_CXX_FLAGS},
                   {"mpi", INFERA_WITH_MPI != 0}}},
                 {"kernel_path", isa_name(best_isa())},
                 {"cpu_features", cpu.describe()},
                 {"threads", num_threads()},
                 {"api_keys", keys_},
                 {"draining", draining},
                 {"in_flight", in_flight},
                 {"memory", {{"rss_bytes", rss}, {"peak_rss_bytes", peak}, {"planned_bytes", planned_bytes_}}}};
  return json{{"object", "stats"}, {"server", std::move(server)}, {"models", std::move(models)}};
}

}  // namespace infera::server
