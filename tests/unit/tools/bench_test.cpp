// infera bench against a real `infera serve` on stories260K (small request set), the
// result JSON's fields, extreme inputs counted as clean errors, --compare, and the PNG
// writer.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "infera/tools/png.h"

extern char** environ;

namespace infera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kSource = INFERA_SOURCE_DIR;
const std::string kInfera = std::string(INFERA_BINARY_DIR) + "/infera";

int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

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

class BenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kInfera)) << "the infera binary is missing (it is built with the tests)";
    dir_ = fs::temp_directory_path() / ("infera_bench_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // stories260K has no chat template; a plain one joins the messages.
    std::ofstream(dir_ / "t.jinja") << "{% for m in messages %}{{ m['content'] }}\n{% endfor %}";
    port_ = free_port();
    server_ = spawn({kInfera, "serve", "-m", kSource + "/../shared/models/stories260K", "--port", std::to_string(port_),
                     "--chat-template", (dir_ / "t.jinja").string(), "-t", "1"},
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
    fs::remove_all(dir_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  fs::path dir_;
  int port_ = 0;
  pid_t server_ = -1;
};

TEST_F(BenchTest, AgainstInferaServe) {
  const std::string out = (dir_ / "a.json").string(), chart = (dir_ / "a.png").string();
  std::string text;
  const int rc = shell(kInfera + " bench --url " + url() + " --concurrency 1,3 --requests 6 --max-tokens 8 --max-context 512 --warmup 1 --out " +
                           out + " --chart " + chart + " 2>/dev/null",
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
  // The chart is a PNG.
  std::ifstream png(chart, std::ios::binary);
  char sig[8] = {};
  png.read(sig, 8);
  EXPECT_EQ(std::string(sig + 1, 3), "PNG");

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
}

TEST_F(BenchTest, RateModeAndRequestsFile) {
  std::ofstream(dir_ / "reqs.jsonl") << R"({"prompt": "Once upon a time"})" "\n"
                                     << R"({"messages": [{"role": "user", "content": "Lily had a dog"}], "max_tokens": 4})" "\n"
                                     << R"({"messages": [], "extreme": true, "kind": "empty"})" "\n";
  const std::string out = (dir_ / "r.json").string();
  std::string text;
  ASSERT_EQ(shell(kInfera + " bench --url " + url() + " --rate 20 --requests 6 --max-tokens 4 --requests-file " +
                      (dir_ / "reqs.jsonl").string() + " --out " + out + " --chart '' 2>/dev/null", &text), 0) << text;
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

TEST(Png, EncodesWhatWasDrawn) {
  Canvas cv(40, 20);
  cv.line(0, 0, 39, 19, {255, 0, 0}, 1);
  EXPECT_EQ(cv.at(0, 0).r, 255);
  EXPECT_EQ(cv.at(39, 19).r, 255);
  EXPECT_EQ(cv.at(39, 0).g, 255);  // untouched background
  const std::vector<uint8_t> png = encode_png_rgb(cv.width(), cv.height(), cv.pixels());
  ASSERT_GT(png.size(), 33u);
  EXPECT_EQ(png[1], 'P');
  // IHDR: width and height big-endian at bytes 16..23.
  EXPECT_EQ((png[16] << 24) | (png[17] << 16) | (png[18] << 8) | png[19], 40);
  EXPECT_EQ((png[20] << 24) | (png[21] << 16) | (png[22] << 8) | png[23], 20);
  // IDAT inflates to rows of (filter byte + RGB).
  const size_t idat_len = (png[33] << 24) | (png[34] << 16) | (png[35] << 8) | png[36];
  ASSERT_EQ(std::string(png.begin() + 37, png.begin() + 41), "IDAT");
  std::vector<uint8_t> raw(20 * (40 * 3 + 1));
  uLongf raw_len = raw.size();
  ASSERT_EQ(uncompress(raw.data(), &raw_len, png.data() + 41, idat_len), Z_OK);
  EXPECT_EQ(raw_len, raw.size());
  EXPECT_EQ(raw[0], 0);
  EXPECT_EQ(raw[1], 255);  // pixel (0, 0) red
  EXPECT_EQ(raw[2], 0);
  EXPECT_THROW(encode_png_rgb(4, 4, std::vector<uint8_t>(5)), std::exception);
  // Text draws pixels.
  Canvas t(60, 10);
  EXPECT_GT(t.text(0, 0, "TTFT 1.5ms", {0, 0, 0}), 0);
  int dark = 0;
  for (int y = 0; y < 10; ++y) for (int x = 0; x < 60; ++x) dark += t.at(x, y).r == 0 ? 1 : 0;
  EXPECT_GT(dark, 40);
}

}  // namespace
}  // namespace infera
