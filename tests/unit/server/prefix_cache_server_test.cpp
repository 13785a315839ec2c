// Prefix caching through `infera serve` on the trained hybrid default (models/infera-default,
// Qwen3.5-MoE-shaped, Gated DeltaNet): a chat's second turn reports cached_tokens covering
// the first turn; two API keys do not share cached prefixes unless they send the same
// cache_salt (or the server shares its cache); with --cache-dir the conversation survives a
// restart (serve, chat, SIGTERM, serve again: the next turn is cached from disk), and a
// corrupted disk entry is a miss with the same output.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"

namespace infera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::slurp;

const std::string kInfera = std::string(INFERA_BINARY_DIR) + "/infera";
const std::string kModel = std::string(INFERA_SOURCE_DIR) + "/models/infera-default";

using Server = test::ServeProcess;

class PrefixCacheServer : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(fs::exists(kInfera)) << "the infera binary is missing"; }
  void TearDown() override {
    for (Server& s : servers_) stop(s);
  }

  Server& start(std::vector<std::string> args, const std::string& name) {
    if (args.empty() || args[0] != "--config") args.insert(args.begin(), {"--model", kModel, "--threads", "1"});
    // up to 60 s on a loaded machine
    servers_.push_back(test::spawn_serve(kInfera, std::move(args), dir_.path() / (name + ".log"), 60));
    return servers_.back();
  }

  // SIGTERM, then the exit code (-1: had to be killed).
  static int stop(Server& s) {
    if (s.pid < 0) return 0;
    ::kill(s.pid, SIGTERM);
    return test::wait_exit(s, 60);
  }

  json chat(const Server& s, const json& messages, const std::string& key = "", const std::string& salt = "") {
    json body = {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}};
    if (!salt.empty()) body["cache_salt"] = salt;
    const fs::path in = dir_.path() / "req.json", out = dir_.path() / "resp.json";
    std::ofstream(in) << body.dump();
    std::string cmd = "curl -s http://127.0.0.1:" + std::to_string(s.port) +
                      "/v1/chat/completions -H 'Content-Type: application/json' --data @" + in.string() + " -o " +
                      out.string();
    if (!key.empty()) cmd += " -H 'Authorization: Bearer " + key + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    try {
      return json::parse(slurp(out));
    } catch (const json::exception&) {
      ADD_FAILURE() << "not JSON: " << slurp(out) << "\n" << slurp(s.log);
      return json::object();
    }
  }

  static int64_t cached(const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(); }
  static int64_t prompt(const json& r) { return r["usage"]["prompt_tokens"].get<int64_t>(); }
  static std::string text(const json& r) { return r["choices"][0]["message"]["content"].get<std::string>(); }

  // A two-turn conversation: the first turn's messages, and the second's given the answer.
  static json first_turn() {
    return json::array({{{"role", "system"}, {"content", "You are a helpful assistant who answers briefly."}},
                        {{"role", "user"}, {"content", "Tell me a short story about a dog and a cat in a garden."}}});
  }
  static json second_turn(const json& first, const std::string& answer) {
    json m = first;
    m.push_back({{"role", "assistant"}, {"content", answer}});
    m.push_back({{"role", "user"}, {"content", "And what happened next?"}});
    return m;
  }

  test::TempDir dir_{"infera_prefix_server"};
  std::deque<Server> servers_;  // start() hands out references that later starts keep valid
};

TEST_F(PrefixCacheServer, SecondTurnIsCachedAndKeysDoNotShare) {
  const fs::path deploy = dir_.path() / "deploy.yaml";
  std::ofstream(deploy) << "server:\n  api_keys:\n    - {id: alice, key: alice-secret-1}\n"
                           "    - {id: bob, key: bob-secret-22}\n"
                           "models:\n  - {name: m, threads: 1, path: "
                        << kModel << "}\n";
  Server& s = start({"--config", deploy.string()}, "keys");
  ASSERT_GT(s.pid, 0);
  const json t1 = chat(s, first_turn(), "alice-secret-1");
  ASSERT_TRUE(t1.contains("usage")) << t1.dump();
  EXPECT_EQ(cached(t1), 0);
  const json m2 = second_turn(first_turn(), text(t1));
  const json t2 = chat(s, m2, "alice-secret-1");
  // The second turn resumes after the whole first prompt (down to a 16-token block).
  EXPECT_GE(cached(t2), prompt(t1) / 16 * 16) << t2.dump();
  EXPECT_LT(cached(t2), prompt(t2));
  // Another key sends the same conversation: nothing of alice's is served to it.
  const json b2 = chat(s, m2, "bob-secret-22");
  EXPECT_EQ(cached(b2), 0) << b2.dump();
  EXPECT_EQ(text(b2), text(t2));
  // The same cache_salt shares between keys; a different one does not.
  const json a3 = chat(s, m2, "alice-secret-1", "team-salt");
  EXPECT_EQ(cached(a3), 0);
  const json b3 = chat(s, m2, "bob-secret-22", "team-salt");
  EXPECT_GE(cached(b3), prompt(t1) / 16 * 16);
  const json b4 = chat(s, m2, "bob-secret-22", "other-salt");
  EXPECT_EQ(cached(b4), 0);
  EXPECT_EQ(text(b4), text(t2));
}

TEST_F(PrefixCacheServer, SharedCacheSettingSharesBetweenKeys) {
  const fs::path deploy = dir_.path() / "deploy.yaml";
  std::ofstream(deploy) << "server:\n  shared_prefix_cache: true\n  api_keys:\n"
                           "    - {id: alice, key: alice-secret-1}\n    - {id: bob, key: bob-secret-22}\n"
                           "models:\n  - {name: m, threads: 1, path: "
                        << kModel << "}\n";
  Server& s = start({"--config", deploy.string()}, "shared");
  ASSERT_GT(s.pid, 0);
  const json t1 = chat(s, first_turn(), "alice-secret-1");
  const json b1 = chat(s, first_turn(), "bob-secret-22");
  EXPECT_GT(cached(b1), 0) << b1.dump();
  EXPECT_EQ(text(b1), text(t1));
}

TEST_F(PrefixCacheServer, RestartResumesFromDiskAndACorruptEntryIsAMiss) {
  const std::string cache = (dir_.path() / "cache").string();
  json t1, t2_cold;
  {
    Server& s = start({"--cache-dir", cache, "--cache-disk-size", "64MiB"}, "first");
    ASSERT_GT(s.pid, 0);
    t1 = chat(s, first_turn());
    ASSERT_TRUE(t1.contains("choices")) << t1.dump();
    EXPECT_EQ(stop(s), 0) << slurp(s.log);
  }
  ASSERT_FALSE(fs::is_empty(cache)) << "nothing was written to the disk tier";
  const json m2 = second_turn(first_turn(), text(t1));
  {
    Server& s = start({"--no-prefix-cache"}, "cold");
    t2_cold = chat(s, m2);
    stop(s);
  }
  {
    Server& s = start({"--cache-dir", cache, "--cache-disk-size", "64MiB"}, "restarted");
    ASSERT_GT(s.pid, 0);
    const json t2 = chat(s, m2);
    EXPECT_GE(cached(t2), prompt(t1) / 16 * 16) << t2.dump() << slurp(s.log);
    EXPECT_EQ(text(t2), text(t2_cold));
    const std::string metrics_cmd =
        "curl -s http://127.0.0.1:" + std::to_string(s.port) + "/metrics -o " + (dir_.path() / "metrics.txt").string();
    ASSERT_EQ(std::system(metrics_cmd.c_str()), 0);
    const std::string metrics = slurp(dir_.path() / "metrics.txt");
    EXPECT_NE(metrics.find("infera_prefix_cache_disk_reads_total{model="), std::string::npos);
    EXPECT_NE(metrics.find("infera_prefix_cache_checkpoint_hits_total{model="), std::string::npos);
    stop(s);
  }
  // Flip a byte in every entry: misses, the same answer.
  for (const auto& de : fs::directory_iterator(cache)) {
    std::fstream f(de.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 1);
    f.seekp(100);
    f.write(&c, 1);
  }
  {
    Server& s = start({"--cache-dir", cache, "--cache-disk-size", "64MiB"}, "corrupt");
    ASSERT_GT(s.pid, 0);
    const json t2 = chat(s, m2);
    EXPECT_EQ(cached(t2), 0) << t2.dump();
    EXPECT_EQ(text(t2), text(t2_cold));
    stop(s);
  }
}

}  // namespace
}  // namespace infera
