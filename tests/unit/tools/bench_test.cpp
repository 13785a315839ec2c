// infera bench against a real `infera serve` on stories260K (small request set), the
// result JSON's fields, extreme inputs counted as clean errors, --compare, and the SVG
// charts.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/tools/bench.h"
#include "infera/tools/svg_chart.h"

extern char** environ;

namespace infera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kSource = INFERA_SOURCE_DIR;
const std::string kInfera = std::string(INFERA_BINARY_DIR) + "/infera";

using test::free_port;
using test::slurp;

pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

int shell(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  std::string s;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) s.append(buf, n);
  const int st = ::pclose(p);
  if (out) *out = s;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

class BenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kInfera)) << "the infera binary is missing (it is built with the tests)";
    INFERA_REQUIRE_FIXTURE(test::stories_dir());
    dir_ = fs::temp_directory_path() / ("infera_bench_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // stories260K has no chat template; a plain one joins the messages.
    std::ofstream(dir_ / "t.jinja") << "{% for m in messages %}{{ m['content'] }}\n{% endfor %}";
    port_ = free_port();
    server_ = spawn({kInfera, "serve", "-m", test::stories_dir(), "--port", std::to_string(port_), "--chat-template",
                     (dir_ / "t.jinja").string(), "-t", "1"},
                    (dir_ / "serve.log").string());
    ASSERT_GT(server_, 0);
    // Ready when /ready answers 200 (the port opens before the model has loaded).
    for (int i = 0; i < 300; ++i) {
      if (shell("curl -sf http://127.0.0.1:" + std::to_string(port_) + "/ready > /dev/null 2>&1") == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << "infera serve did not come up";
  }
  void TearDown() override {
    if (server_ > 0) {
      ::kill(server_, SIGTERM);
      int st = 0;
      ::waitpid(server_, &st, 0);
    }
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  fs::path dir_;
  int port_ = 0;
  pid_t server_ = -1;
};

TEST_F(BenchTest, AgainstInferaServe) {
  const std::string out = (dir_ / "a.json").string(), chart = (dir_ / "a.svg").string();
  std::string text;
  const int rc = shell(kInfera + " bench --url " + url() +
                           " --concurrency 1,3 --requests 6 --max-tokens 8 --max-context 512 --warmup 1 --out " + out +
                           " --chart " + chart + " 2>/dev/null",
                       &text);
  ASSERT_EQ(rc, 0) << text;
  json r;
  std::ifstream(out) >> r;
  EXPECT_EQ(r["model"], "stories260K");
  ASSERT_EQ(r["levels"].size(), 2u);
  for (const auto& l : r["levels"]) {
    for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}) {
      for (const char* p : {"p50", "p95", "p99"}) EXPECT_TRUE(l[k].contains(p)) << k << "." << p;
    }
    EXPECT_EQ(l["requests"], 6);
    EXPECT_EQ(l["errors"], 0) << l["error_samples"].dump();
    EXPECT_GT(l["output_tokens_per_s"].get<double>(), 0);
    EXPECT_GT(l["requests_per_s"].get<double>(), 0);
    EXPECT_GT(l["ttft_ms"]["p50"].get<double>(), 0);
    EXPECT_LE(l["ttft_ms"]["p50"].get<double>(), l["e2e_ms"]["p50"].get<double>());
    // Extreme inputs: every one answered cleanly (4xx JSON error or a normal answer),
    // the empty conversation and the overlong prompt are refused.
    const json& ex = l["extreme"];
    EXPECT_EQ(ex["total"], 5);
    EXPECT_EQ(ex["unclean"], 0) << l["error_samples"].dump();
    EXPECT_GE(ex["clean_errors"].get<int>(), 2);
    EXPECT_EQ(ex["clean_errors"].get<int>() + ex["ok"].get<int>(), 5);
    EXPECT_TRUE(l.contains("kv_usage"));  // an Infera target exposes infera_kv_blocks_*
    EXPECT_FALSE(l["kv_usage"].is_null());
  }
  EXPECT_EQ(r["levels"][1]["concurrency"], 3);
  // The chart is an SVG with both panels and one line per series (6, two levels each).
  const std::string svg = slurp(chart);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u) << svg.substr(0, 200);
  EXPECT_NE(svg.find(">Latency<"), std::string::npos);
  EXPECT_NE(svg.find(">Throughput<"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 6);

  // --compare: identical results have no regression; a slower B is flagged, exit 1.
  std::string cmp;
  EXPECT_EQ(shell(kInfera + " bench --compare " + out + " " + out, &cmp), 0) << cmp;
  EXPECT_NE(cmp.find("0 regressions"), std::string::npos) << cmp;
  json slow = r;
  for (auto& l : slow["levels"]) {
    l["ttft_ms"]["p50"] = l["ttft_ms"]["p50"].get<double>() * 2;
    l["output_tokens_per_s"] = l["output_tokens_per_s"].get<double>() / 2;
  }
  std::ofstream(dir_ / "b.json") << slow.dump();
  EXPECT_EQ(shell(kInfera + " bench --compare " + out + " " + (dir_ / "b.json").string(), &cmp), 1) << cmp;
  EXPECT_NE(cmp.find("REGRESSION"), std::string::npos) << cmp;
  EXPECT_NE(cmp.find("4 regressions"), std::string::npos) << cmp;
  // --compare draws only when --chart is given: both results, B dashed; a .png path
  // (the former chart format) is written as .svg.
  EXPECT_FALSE(fs::exists(dir_ / "bench_result.svg"));
  const std::string cmp_png = (dir_ / "cmp.png").string();
  EXPECT_EQ(shell(kInfera + " bench --compare " + out + " " + (dir_ / "b.json").string() + " --chart " + cmp_png +
                      " 2>/dev/null",
                  &cmp),
            1)
      << cmp;
  EXPECT_FALSE(fs::exists(cmp_png));
  const std::string both = slurp(dir_ / "cmp.svg");
  EXPECT_EQ(count(both, "<polyline"), 12);
  EXPECT_EQ(count(both, "stroke-dasharray"), 2 * 6);  // B's lines and legend entries
  EXPECT_NE(both.find("(" + (dir_ / "b.json").string() + ")"), std::string::npos);
}

TEST_F(BenchTest, RateModeAndRequestsFile) {
  std::ofstream(dir_ / "reqs.jsonl")
      << R"({"prompt": "Once upon a time"})"
         "\n"
      << R"({"messages": [{"role": "user", "content": "Lily had a dog"}], "max_tokens": 4})"
         "\n"
      << R"({"messages": [], "extreme": true, "kind": "empty"})"
         "\n";
  const std::string out = (dir_ / "r.json").string();
  std::string text;
  ASSERT_EQ(shell(kInfera + " bench --url " + url() + " --rate 20 --requests 6 --max-tokens 4 --requests-file " +
                      (dir_ / "reqs.jsonl").string() + " --out " + out + " --chart '' 2>/dev/null",
                  &text),
            0)
      << text;
  json r;
  std::ifstream(out) >> r;
  ASSERT_EQ(r["levels"].size(), 1u);
  const json& l = r["levels"][0];
  EXPECT_EQ(l["rate"], 20.0);
  EXPECT_EQ(l["requests"], 6);
  EXPECT_EQ(l["errors"], 0) << l["error_samples"].dump();
  EXPECT_EQ(l["extreme"]["total"], 1);
  EXPECT_EQ(l["extreme"]["clean_errors"], 1);
  EXPECT_EQ(l["kinds"]["file"], 6);
}

TEST(SvgChart, DrawsPanelsSeriesAndLegends) {
  tools::ChartPanel p{"Latency <ms>", "concurrency", "milliseconds", {1, 4, 16}, true, {}};
  p.series.push_back({"TTFT p50 & more", "#1f77b4", {10, 20, 40}, false});
  p.series.push_back({"ITL", "#2ca02c", {5, NAN, 7}, true});  // a gap: two pieces, no line across it
  tools::ChartPanel q{"Throughput", "concurrency", "tokens/s",
                      {1, 4, 16},   true,          {{"tok/s", "#ff7f0e", {100, 300, 500}, false}}};
  const std::string svg = tools::render_svg_chart({p, q}, 500, 300);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"300\"", 0), 0u) << svg;
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<g class=\"panel\""), 2);
  // Text is escaped.
  EXPECT_NE(svg.find(">Latency &lt;ms&gt;<"), std::string::npos);
  EXPECT_NE(svg.find(">TTFT p50 &amp; more<"), std::string::npos);
  EXPECT_EQ(svg.find("<ms>"), std::string::npos);
  // Lines: 1 + 2 (the gap splits ITL; its single points are still marked) + 1; markers: 3 + 2 + 3.
  EXPECT_EQ(count(svg, "<polyline"), 4);
  EXPECT_EQ(count(svg, "<rect x="), 8);
  EXPECT_EQ(count(svg, "stroke-dasharray"), 2 + 1);  // ITL's two pieces and its legend line
  // Log2 x axis: 1, 4 and 16 are evenly spaced; larger y is higher (smaller SVG y).
  const std::string line = svg.substr(svg.find("<polyline"));
  double x0, y0, x1, y1, x2, y2;
  ASSERT_EQ(std::sscanf(line.c_str() + line.find("points=\"") + 8, "%lf,%lf %lf,%lf %lf,%lf", &x0, &y0, &x1, &y1, &x2,
                        &y2),
            6);
  EXPECT_NEAR(x1 - x0, x2 - x1, 0.2);
  EXPECT_GT(y0, y1);
  EXPECT_GT(y1, y2);
  // Nothing to plot still gives a valid, empty chart.
  EXPECT_NE(tools::render_svg_chart({tools::ChartPanel{}}).find("</svg>"), std::string::npos);
  EXPECT_THROW(tools::write_svg_chart("/nonexistent-dir/x.svg", {p}), std::exception);
}

TEST(SvgChart, PngChartPathsBecomeSvg) {
  EXPECT_EQ(tools::bench_chart_path("out/bench_result.png"), "out/bench_result.svg");
  EXPECT_EQ(tools::bench_chart_path("a.svg"), "a.svg");
  EXPECT_EQ(tools::bench_chart_path("chart"), "chart");
}

}  // namespace
}  // namespace infera
