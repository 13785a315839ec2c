#include "infera/server/metrics.h"

#include <fmt/format.h>

namespace infera::server {

std::string prometheus_escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, count_);
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels, sum_);
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_);
}

nlohmann::json Histogram::to_json() const {
  nlohmann::json buckets = nlohmann::json::array();
  uint64_t cumulative = 0;
  for (uint64_t c : counts_) {
    cumulative += c;
    buckets.push_back(cumulative);
  }
  return {{"bounds", bounds_}, {"buckets", std::move(buckets)}, {"sum", sum_}, {"count", count_}};
}

void Metrics::count_request(const std::string& model, int status) {
  std::lock_guard lock(mutex_);
  ++models_[model].requests_by_status[status];
}

void Metrics::observe_latency(const std::string& model, double e2e_s, double ttft_s, double tpot_s) {
  std::lock_guard lock(mutex_);
  auto& m = models_[model];
  m.e2e.observe(e2e_s);
  if (ttft_s >= 0) m.ttft.observe(ttft_s);
  if (tpot_s >= 0) m.tpot.observe(tpot_s);
}

void Metrics::add_tokens(const std::string& model, int64_t prompt, int64_t generated) {
  std::lock_guard lock(mutex_);
  auto& m = models_[model];
  m.prompt_tokens += static_cast<uint64_t>(std::max<int64_t>(prompt, 0));
  m.generated_tokens += static_cast<uint64_t>(std::max<int64_t>(generated, 0));
}

nlohmann::json Metrics::model_json(const std::string& model) const {
  PerModel empty;
  std::lock_guard lock(mutex_);
  const auto it = models_.find(model);
  const PerModel& m = it == models_.end() ? empty : it->second;
  nlohmann::json requests = nlohmann::json::object();
  for (const auto& [status, n] : m.requests_by_status) requests[std::to_string(status)] = n;
  return {
      {"requests", std::move(requests)}, {"prompt_tokens", m.prompt_tokens}, {"generation_tokens", m.generated_tokens},
      {"ttft", m.ttft.to_json()},        {"tpot", m.tpot.to_json()},         {"e2e", m.e2e.to_json()}};
}

std::string Metrics::render(const std::vector<ModelGauges>& gauges) const {
  std::string out;
  auto header = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto label = [](const std::string& model) { return fmt::format("model=\"{}\"", prometheus_escape(model)); };
  {
    std::lock_guard lock(mutex_);
    header("infera_requests_total", "counter", "HTTP requests by model and status code.");
    for (const auto& [model, m] : models_) {
      for (const auto& [status, n] : m.requests_by_status) {
        out += fmt::format("infera_requests_total{{{},status=\"{}\"}} {}\n", label(model), status, n);
      }
    }
    header("infera_time_to_first_token_seconds", "histogram",
           "Time from request arrival to the first generated token.");
    for (const auto& [model, m] : models_) m.ttft.render(out, "infera_time_to_first_token_seconds", label(model));
    header("infera_time_per_output_token_seconds", "histogram", "Mean time between generated tokens of a request.");
    for (const auto& [model, m] : models_) m.tpot.render(out, "infera_time_per_output_token_seconds", label(model));
    header("infera_request_latency_seconds", "histogram", "End-to-end request latency.");
    for (const auto& [model, m] : models_) m.e2e.render(out, "infera_request_latency_seconds", label(model));
    header("infera_prompt_tokens_total", "counter", "Prompt tokens processed.");
    for (const auto& [model, m] : models_)
      out += fmt::format("infera_prompt_tokens_total{{{}}} {}\n", label(model), m.prompt_tokens);
    header("infera_generation_tokens_total", "counter", "Tokens generated.");
    for (const auto& [model, m] : models_)
      out += fmt::format("infera_generation_tokens_total{{{}}} {}\n", label(model), m.generated_tokens);
  }
  header("infera_model_state", "gauge", "1 for the model's current load state (loading, ready, failed).");
  for (const auto& g : gauges) {
    for (const char* s : {"loading", "ready", "failed"}) {
      out += fmt::format("infera_model_state{{{},state=\"{}\"}} {}\n", label(g.name), s, g.state == s ? 1 : 0);
    }
  }
  header("infera_model_load_progress", "gauge", "Fraction of the model's load done (0 to 1; 1 once ready).");
  for (const auto& g : gauges)
    out += fmt::format("infera_model_load_progress{{{}}} {}\n", label(g.name), g.load_fraction);
  auto gauge = [&](const char* name, const char* type, const char* help, auto value_of) {
    header(name, type, help);
    for (const auto& g : gauges) {
      if (g.has_stats) out += fmt::format("{}{{{}}} {}\n", name, label(g.name), value_of(g.stats));
    }
  };
  gauge("infera_requests_running", "gauge", "Sequences holding KV blocks.",
        [](const EngineStats& s) { return s.running; });
  gauge("infera_requests_waiting", "gauge", "Requests queued or preempted.",
        [](const EngineStats& s) { return s.waiting; });
  gauge("infera_kv_blocks_used", "gauge", "KV blocks referenced by sequences.",
        [](const EngineStats& s) { return s.kv_blocks_used; });
  gauge("infera_kv_blocks_cached", "gauge", "Unreferenced KV blocks kept for prefix reuse.",
        [](const EngineStats& s) { return s.kv_blocks_cached; });
  gauge("infera_kv_blocks_total", "gauge", "KV blocks in the pool.",
        [](const EngineStats& s) { return s.kv_blocks_total; });
  gauge("infera_prefix_cache_hit_blocks_total", "counter", "Prompt blocks served by the prefix cache.",
        [](const EngineStats& s) { return s.prefix_hit_blocks; });
  gauge("infera_prefix_cache_queried_blocks_total", "counter", "Prompt blocks looked up in the prefix cache.",
        [](const EngineStats& s) { return s.prefix_hit_blocks + s.prefix_miss_blocks; });
  gauge("infera_prefix_cache_hit_rate", "gauge", "Prefix-cache hits over lookups since start.",
        [](const EngineStats& s) {
          const int64_t q = s.prefix_hit_blocks + s.prefix_miss_blocks;
          return q > 0 ? static_cast<double>(s.prefix_hit_blocks) / static_cast<double>(q) : 0.0;
        });
  // Hybrid prefix caching: recurrent-state checkpoints beside the cached blocks.
  gauge("infera_prefix_cache_checkpoint_hits_total", "counter",
        "Admissions that resumed from a cached recurrent-state checkpoint.",
        [](const EngineStats& s) { return s.checkpoint_hits; });
  gauge("infera_prefix_cache_checkpoints_stored_total", "counter", "Recurrent-state checkpoints kept.",
        [](const EngineStats& s) { return s.checkpoints_stored; });
  gauge("infera_prefix_cache_checkpoint_evictions_total", "counter",
        "Recurrent-state checkpoints dropped for room or with their block.",
        [](const EngineStats& s) { return s.checkpoint_evictions; });
  gauge("infera_prefix_cache_checkpoints", "gauge", "Recurrent-state checkpoints cached now.",
        [](const EngineStats& s) { return s.checkpoints_cached; });
  gauge("infera_prefix_cache_checkpoint_bytes", "gauge", "Bytes of the cached checkpoints (part of the KV budget).",
        [](const EngineStats& s) { return s.checkpoint_bytes; });
  // The disk tier (--cache-dir; zero without one).
  gauge("infera_prefix_cache_disk_reads_total", "counter", "Prefix-cache entries read back from disk.",
        [](const EngineStats& s) { return s.disk_reads; });
  gauge("infera_prefix_cache_disk_read_bytes_total", "counter", "Bytes of prefix-cache entries read from disk.",
        [](const EngineStats& s) { return s.disk_read_bytes; });
  gauge("infera_prefix_cache_disk_writes_total", "counter", "Prefix-cache entries written to disk.",
        [](const EngineStats& s) { return s.disk_writes; });
  gauge("infera_prefix_cache_disk_write_bytes_total", "counter", "Bytes of prefix-cache entries written to disk.",
        [](const EngineStats& s) { return s.disk_write_bytes; });
  gauge("infera_prefix_cache_disk_evictions_total", "counter", "Disk entries deleted to stay within the size limit.",
        [](const EngineStats& s) { return s.disk_evictions; });
  gauge("infera_prefix_cache_disk_dropped_total", "counter", "Entries not written: the disk writer's queue was full.",
        [](const EngineStats& s) { return s.disk_dropped; });
  gauge("infera_prefix_cache_disk_rejected_total", "counter", "Disk entries found corrupt, truncated or foreign.",
        [](const EngineStats& s) { return s.disk_rejected; });
  gauge("infera_prefix_cache_disk_bytes", "gauge", "Bytes of the disk tier's entries now.",
        [](const EngineStats& s) { return s.disk_bytes; });
  gauge("infera_preemptions_total", "counter", "Sequences preempted to free KV blocks.",
        [](const EngineStats& s) { return s.preemptions; });
  // Speculative decoding (zero for models without it; see docs/speculative.md).
  gauge("infera_spec_drafted_total", "counter", "Draft tokens proposed and verified.",
        [](const EngineStats& s) { return s.spec_drafted; });
  gauge("infera_spec_accepted_total", "counter", "Draft tokens accepted.",
        [](const EngineStats& s) { return s.spec_accepted; });
  gauge("infera_spec_acceptance_rate", "gauge", "Accepted over drafted tokens since start.",
        [](const EngineStats& s) { return s.spec_acceptance_rate(); });
  gauge("infera_spec_decode_steps_total", "counter", "Decode steps of sequences while speculating.",
        [](const EngineStats& s) { return s.spec_decode_steps; });
  gauge("infera_spec_tokens_per_step", "gauge", "Mean tokens a sequence emits per decode step (1 without speculation).",
        [](const EngineStats& s) { return s.spec_tokens_per_step(); });
  // Tensor / expert parallel (only models that run over ranks; docs/parallel.md). Comm
  // share = rate(comm_seconds) / wall time; collectives per step = rate(collectives) / rate(steps).
  auto parallel_metric = [&](const char* name, const char* type, const char* help, auto value_of) {
    header(name, type, help);
    for (const auto& g : gauges) {
      if (g.has_stats && g.stats.parallel.ranks > 1)
        out += fmt::format("{}{{{}}} {}\n", name, label(g.name), value_of(g.stats));
    }
  };
  parallel_metric("infera_parallel_ranks", "gauge", "Ranks the model runs over (tp/ep).",
                  [](const EngineStats& s) { return s.parallel.ranks; });
  parallel_metric("infera_parallel_steps_total", "counter", "Forward steps run over the ranks.",
                  [](const EngineStats& s) { return s.steps; });
  parallel_metric("infera_parallel_collectives_total", "counter", "Collectives rank 0 took part in.",
                  [](const EngineStats& s) { return s.parallel.collectives; });
  parallel_metric("infera_parallel_bytes_total", "counter", "Payload bytes rank 0 contributed to collectives.",
                  [](const EngineStats& s) { return s.parallel.bytes; });
  parallel_metric("infera_parallel_comm_seconds_total", "counter",
                  "Seconds rank 0 spent inside collectives (waiting for slower ranks included).",
                  [](const EngineStats& s) { return s.parallel.comm_seconds; });
  header("infera_spec_accepted_per_position_total", "counter",
         "Accepted draft tokens by position in the draft (0: first).");
  for (const auto& g : gauges) {
    if (!g.has_stats) continue;
    for (size_t i = 0; i < g.stats.spec_accepted_per_pos.size(); ++i) {
      out += fmt::format("infera_spec_accepted_per_position_total{{{},position=\"{}\"}} {}\n", label(g.name), i,
                         g.stats.spec_accepted_per_pos[i]);
    }
  }
  header("infera_spec_drafted_per_position_total", "counter", "Draft tokens proposed by position in the draft.");
  for (const auto& g : gauges) {
    if (!g.has_stats) continue;
    for (size_t i = 0; i < g.stats.spec_drafted_per_pos.size(); ++i) {
      out += fmt::format("infera_spec_drafted_per_position_total{{{},position=\"{}\"}} {}\n", label(g.name), i,
                         g.stats.spec_drafted_per_pos[i]);
    }
  }
  return out;
}

}  // namespace infera::server
