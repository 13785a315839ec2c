// infera bench: a serving benchmark against any OpenAI-compatible URL (the client is
// tools/bench.*; this file declares the command line).
//
//   infera bench --url http://127.0.0.1:8000 [--concurrency 1,4,16 | --rate R]
//                [--requests N | --duration S] [--requests-file reqs.jsonl]
//                [--out result.json] [--chart result.svg]
//   infera bench --compare A.json B.json [--chart compare.svg]
#include <memory>

#include "infera/cli/command.h"
#include "infera/tools/bench.h"

namespace infera::cli {
namespace {

void setup(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("bench", "Serving benchmark against an OpenAI-compatible URL (or --compare two results)");
  auto o = std::make_shared<tools::BenchOptions>();
  cmd->add_option("--url", o->url, "Server base URL")->default_val("http://127.0.0.1:8000");
  cmd->add_option("--model", o->model, "Model name to send (default: the first of /v1/models)");
  cmd->add_option("--api-key", o->api_key, "Bearer token");
  cmd->add_option("--concurrency", o->concurrency, "Comma-separated concurrency levels")->default_val("1,4,16");
  cmd->add_option("--rate", o->rate, "Poisson arrivals at this many requests/s instead of concurrency levels");
  cmd->add_option("--requests", o->requests, "Requests per level (normal ones; extreme inputs are added)")
      ->default_val(32);
  cmd->add_option("--duration", o->duration, "Seconds per level instead of --requests");
  cmd->add_option("--warmup", o->warmup, "Warm-up requests (excluded)")->default_val(2);
  cmd->add_option("--max-tokens", o->max_tokens, "max_tokens of each request")->default_val(64);
  cmd->add_option("--max-context", o->max_context, "Model context; sizes the long and overlong prompts")
      ->default_val(4096);
  cmd->add_option("--requests-file", o->requests_file,
                  "JSONL of chat/completions bodies (or {\"prompt\": ...}) instead of the built-in set");
  cmd->add_option("--out", o->out, "Result JSON file")->default_val("bench_result.json");
  // The chart was a PNG before: a .png path is still accepted and written as .svg.
  auto* chart =
      cmd->add_option("--chart", o->chart,
                      "SVG chart of latency and throughput per level ('' = none; with --compare: both results, "
                      "only when given)");
  chart->default_val("bench_result.svg");
  cmd->add_flag("--no-extreme", o->no_extreme, "Leave out the extreme inputs");
  cmd->add_option("--timeout", o->timeout, "Seconds per request")->default_val(300);
  cmd->add_option("--compare", o->compare, "Two result files: print differences, flag regressions (exit 1 if any)")
      ->expected(2);
  cmd->add_option("--regression-threshold", o->regression_threshold, "Percent change counted as a regression")
      ->default_val(10);
  cmd->callback([o, chart] {
    tools::BenchOptions run = *o;
    if (!run.compare.empty() && chart->count() == 0) run.chart.clear();  // --compare draws only when asked
    set_exit_code(tools::run_bench(run));
  });
}

}  // namespace

INFERA_REGISTER_COMMAND(bench, setup);

}  // namespace infera::cli
