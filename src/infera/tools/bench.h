// The serving benchmark client behind `infera bench`: a fixed request set (or a JSONL
// file) streamed to any OpenAI-compatible URL at several concurrency levels or a Poisson
// rate, per-level latency and throughput figures, an SVG chart of them, and the comparison
// of two result files. docs/operations.md describes the figures and the result JSON.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace infera::tools {

struct BenchOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model;  // "" = the first of /v1/models
  std::string api_key;
  std::string concurrency = "1,4,16";
  double rate = 0;  // > 0: Poisson arrivals instead of concurrency levels
  int requests = 32;
  double duration = 0;
  int warmup = 2;
  int max_tokens = 64;
  int max_context = 4096;
  std::string requests_file;
  std::string out = "bench_result.json";
  std::string chart = "bench_result.svg";  // "" = none
  bool no_extreme = false;
  double timeout = 300;
  std::vector<std::string> compare;
  double regression_threshold = 10.0;  // percent
  double tokens_per_word = 1.3;  // measured through /tokenize when the target has it
};

// Runs the benchmark (or, with two `compare` files, the comparison); prints the table and
// writes `out` and `chart`. Returns the exit code: 0, or 1 when --compare finds a
// regression. Throws infera::Error for what the user can fix (bad URL, unreadable file).
int run_bench(BenchOptions o);

// Prints A and B level by level with the change of each metric and flags regressions;
// returns their number. With a chart path, also draws both results in one chart.
int compare_bench_results(const nlohmann::json& a, const nlohmann::json& b, double regression_threshold,
                          const std::string& chart = "", const std::string& name_a = "A",
                          const std::string& name_b = "B");

// Latency and throughput against concurrency (or offered rate) of one or more bench
// results, as an SVG file; results after the first are drawn dashed, named in the legend.
void write_bench_chart(const std::vector<nlohmann::json>& results, const std::vector<std::string>& names,
                       const std::string& path);

// Charts are SVG; a --chart path ending in .png (the former format) is written as .svg.
std::string bench_chart_path(const std::string& requested);

}  // namespace infera::tools
