// Prometheus metrics (text exposition format 0.0.4), all named infera_*. Counters and
// histograms are updated by the HTTP workers; engine gauges are read at scrape time.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infera/runtime/engine.h"

namespace infera::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket / _sum / _count lines of `name` with `labels` ("model=\"x\"").
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  // {"bounds": [...], "buckets": [cumulative counts, the last one +Inf], "sum", "count"}: the same numbers.
  nlohmann::json to_json() const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

// What a scrape shows about one model besides the request counters.
struct ModelGauges {
  std::string name;
  std::string state;  // loading | ready | failed
  double load_fraction = 0;  // how far its load has come, 0..1 (LoadProgress)
  bool has_stats = false;
  EngineStats stats;
};

class Metrics {
 public:
  void count_request(const std::string& model, int status);
  void observe_latency(const std::string& model, double e2e_s, double ttft_s, double tpot_s);
  void add_tokens(const std::string& model, int64_t prompt, int64_t generated);
  std::string render(const std::vector<ModelGauges>& models) const;
  // One model's counters as the console's /v1/stats shows them (the same numbers as
  // render()): {"requests": {"200": n, ...}, "prompt_tokens", "generation_tokens", "ttft",
  // "tpot", "e2e" (histograms, Histogram::to_json)}.
  nlohmann::json model_json(const std::string& model) const;

 private:
  struct PerModel {
    std::map<int, uint64_t> requests_by_status;
    Histogram ttft{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
    Histogram tpot{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
    Histogram e2e{{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}};
    uint64_t prompt_tokens = 0;
    uint64_t generated_tokens = 0;
  };
  mutable std::mutex mutex_;
  std::map<std::string, PerModel> models_;
};

// Escapes a Prometheus label value.
std::string prometheus_escape(const std::string& value);

}  // namespace infera::server
