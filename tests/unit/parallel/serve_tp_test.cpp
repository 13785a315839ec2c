// `infera serve` over a group of ranks, end to end on loopback: a TP 2 server (from a
// deploy file's `tp: 2`) answers /v1/completions with the greedy text of a one-process
// server, for requests that run batched together; SIGTERM drains the group and every
// process exits 0; a killed worker rank ends the server with a message naming it. The
// prefix cache's disk tier keeps each rank's shard and survives a restart of the group.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/parallel/communicator.h"
#include "process_util.h"

namespace infera {
namespace {

namespace fs = std::filesystem;
using test::slurp;

const std::string kSource = INFERA_SOURCE_DIR;
const std::string kInfera = std::string(INFERA_BINARY_DIR) + "/infera";
const std::string kStories = test::stories_dir();
const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog", "Tom and Sue went"};

using test::free_port;

using Server = test::ServeProcess;
using test::wait_exit;

class ServeTp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("infera_serve_tp_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    if (!parallel::mpi_available()) GTEST_SKIP() << "built without MPI";
    ASSERT_TRUE(fs::exists(kInfera)) << "the infera binary is missing (it is built with the tests)";
  }

  // Starts `infera serve <args> --port P` and waits until /ready answers (up to 30 s).
  static Server start(std::vector<std::string> args, const std::string& name) {
    return test::spawn_serve(kInfera, std::move(args), dir_ / (name + ".log"), 30);
  }

  // The prompts sent at once (so the engine batches them); greedy text of each.
  static std::vector<std::string> complete_all(const Server& s) {
    std::string cmd;
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      const nlohmann::json body = {{"model", "m"}, {"prompt", kPrompts[i]}, {"max_tokens", 24}, {"temperature", 0}};
      const fs::path in = dir_ / ("req" + std::to_string(i) + ".json"),
                     out = dir_ / ("resp" + std::to_string(i) + ".json");
      std::ofstream(in) << body.dump();
      cmd += "curl -s http://127.0.0.1:" + std::to_string(s.port) +
             "/v1/completions -H 'Content-Type: application/json' "
             "--data @" +
             in.string() + " -o " + out.string() + " & ";
    }
    EXPECT_EQ(std::system((cmd + "wait").c_str()), 0);
    std::vector<std::string> texts;
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      const std::string text = slurp(dir_ / ("resp" + std::to_string(i) + ".json"));
      try {
        texts.push_back(nlohmann::json::parse(text)["choices"][0]["text"].get<std::string>());
      } catch (const nlohmann::json::exception&) {
        ADD_FAILURE() << "not a completion: " << text << "\n" << slurp(s.log);
        texts.emplace_back();
      }
    }
    return texts;
  }

  static fs::path dir_;
};

fs::path ServeTp::dir_;

TEST_F(ServeTp, Tp2ServerAnswersWithTheGreedyTextOfOneProcessAndDrainsOnSigterm) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server one = start({"-m", kStories, "--name", "m", "-t", "1"}, "tp1");
  ASSERT_GT(one.pid, 0);
  const std::vector<std::string> expected = complete_all(one);
  ::kill(one.pid, SIGTERM);
  EXPECT_EQ(wait_exit(one, 15), 0) << slurp(one.log);
  ASSERT_FALSE(expected[0].empty());

  // The deploy file's per-model tp (the --tp flag takes the same path).
  const fs::path yaml = dir_ / "deploy.yaml";
  std::ofstream(yaml) << "models:\n  - name: m\n    path: " << kStories << "\n    tp: 2\n";
  Server two = start({"--config", yaml.string()}, "tp2");
  ASSERT_GT(two.pid, 0);
  EXPECT_EQ(complete_all(two), expected) << slurp(two.log);
  // Rank 0's collectives are exported (the engine publishes its stats after each step).
  const fs::path metrics = dir_ / "metrics.txt";
  ASSERT_EQ(std::system(
                ("curl -sf http://127.0.0.1:" + std::to_string(two.port) + "/metrics -o " + metrics.string()).c_str()),
            0);
  const std::string text = slurp(metrics);
  EXPECT_NE(text.find("infera_parallel_ranks{model=\"m\"} 2"), std::string::npos) << text;
  const size_t at = text.find("infera_parallel_collectives_total{model=\"m\"} ");
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_GT(std::stoll(text.substr(at + std::string("infera_parallel_collectives_total{model=\"m\"} ").size())), 0)
      << text;
  const size_t ranks = test::descendants_of(two.pid).size();  // mpirun + 2 ranks
  EXPECT_GE(ranks, 3u);
  ::kill(two.pid, SIGTERM);  // drains: rank 0 stops the workers, every rank exits 0
  EXPECT_EQ(wait_exit(two, 15), 0) << slurp(two.log);
  EXPECT_NE(slurp(two.log).find("draining"), std::string::npos) << slurp(two.log);
}

TEST_F(ServeTp, Tp2NgramSpeculationGivesTheGreedyTextOfOneProcess) {
  // N-gram drafts over a TP 2 group (an attention-only model): verify chunks are forwards
  // with every row's logits gathered to rank 0, and a rejected draft only rewinds rank 0's
  // positions. Same greedy text as one process without speculation; drafts were verified.
  INFERA_REQUIRE_FIXTURE(kStories);
  Server one = start({"-m", kStories, "--name", "m", "-t", "1"}, "spec_tp1");
  ASSERT_GT(one.pid, 0);
  const std::vector<std::string> expected = complete_all(one);
  ::kill(one.pid, SIGTERM);
  EXPECT_EQ(wait_exit(one, 15), 0) << slurp(one.log);
  Server two = start({"-m", kStories, "--name", "m", "-t", "1", "--tp", "2", "--speculative", "ngram"}, "spec_tp2");
  ASSERT_GT(two.pid, 0);
  EXPECT_EQ(complete_all(two), expected) << slurp(two.log);
  const fs::path metrics = dir_ / "spec_metrics.txt";
  ASSERT_EQ(std::system(
                ("curl -sf http://127.0.0.1:" + std::to_string(two.port) + "/metrics -o " + metrics.string()).c_str()),
            0);
  const std::string text = slurp(metrics);
  const std::string key = "infera_spec_drafted_total{model=\"m\"} ";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_GT(std::stoll(text.substr(at + key.size())), 0) << text;
  ::kill(two.pid, SIGTERM);
  EXPECT_EQ(wait_exit(two, 15), 0) << slurp(two.log);
}

TEST_F(ServeTp, HybridTp2ServerMatchesOneProcess) {
  // Gated DeltaNet layers keep per-sequence recurrent state in slots the engine hands out;
  // the workers follow rank 0's slot count from each step. Three sequences at once.
  const fs::path m = dir_ / "qwen35_moe";
  const std::string gen =
      "/usr/bin/python3 " + kSource + "/tools/gen_model.py " + m.string() +
      " --arch qwen3_5_moe --heads 4 --kv-heads 2 --layers 4 --lin-k-heads 2 --lin-v-heads 4 > /dev/null 2>&1";
  ASSERT_EQ(std::system(gen.c_str()), 0) << gen;
  Server one = start({"-m", m.string(), "--name", "m", "-t", "1"}, "hybrid1");
  ASSERT_GT(one.pid, 0);
  const std::vector<std::string> expected = complete_all(one);
  ::kill(one.pid, SIGTERM);
  EXPECT_EQ(wait_exit(one, 15), 0) << slurp(one.log);
  Server two = start({"-m", m.string(), "--name", "m", "-t", "1", "--tp", "2"}, "hybrid2");
  ASSERT_GT(two.pid, 0);
  EXPECT_EQ(complete_all(two), expected) << slurp(two.log);
  ::kill(two.pid, SIGTERM);
  EXPECT_EQ(wait_exit(two, 15), 0) << slurp(two.log);
}

// One greedy completion; the response (null when the server answered no JSON).
nlohmann::json complete(const test::ServeProcess& s, const fs::path& dir, const std::string& prompt, int max_tokens) {
  const nlohmann::json body = {
      {"model", "m"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"logprobs", 1}};
  const fs::path in = dir / "turn_req.json", out = dir / "turn_resp.json";
  std::ofstream(in) << body.dump();
  fs::remove(out);
  const std::string cmd = "curl -s http://127.0.0.1:" + std::to_string(s.port) +
                          "/v1/completions -H 'Content-Type: application/json' --data @" + in.string() + " -o " +
                          out.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  try {
    return nlohmann::json::parse(slurp(out));
  } catch (const nlohmann::json::exception&) {
    ADD_FAILURE() << "not a completion: " << slurp(out) << "\n" << slurp(s.log);
    return nullptr;
  }
}

TEST_F(ServeTp, HybridTp2PrefixCacheKeepsTheUncachedTokens) {
  // Hybrid prefix caching over a TP 2 group: rank 0 decides every lookup and gathers each
  // rank's part of a state checkpoint / scatters it back on a hit. A conversation of three
  // turns (each prompt is the last one, its answer and a new sentence) gives the same greedy
  // text with the cache as without, and the later turns resume from cached prefixes. The
  // tiny model's greedy text barely depends on the state, so the sampled tokens'
  // log-probabilities are compared too (a worker resuming from a wrong state moves them by
  // ~0.03; prefill chunked differently, by float rounding only).
  const fs::path m = dir_ / "qwen35_moe_cache";
  const std::string gen =
      "/usr/bin/python3 " + kSource + "/tools/gen_model.py " + m.string() +
      " --arch qwen3_5_moe --heads 4 --kv-heads 2 --layers 4 --lin-k-heads 2 --lin-v-heads 4 > /dev/null 2>&1";
  ASSERT_EQ(std::system(gen.c_str()), 0) << gen;
  const std::vector<std::string> sentences = {
      "Once upon a time there was a little dog who liked to run in the park with his friends. ",
      "One day the dog found a red ball under a big tree and took it home. ",
      "His mother asked him where the ball came from and what he would do with it. "};
  auto converse = [&](const Server& s, std::vector<int64_t>& cached, std::vector<double>& logprobs) {
    std::vector<std::string> answers;
    std::string prompt;
    for (const std::string& next : sentences) {
      prompt += next;
      const nlohmann::json r = complete(s, dir_, prompt, 12);
      if (r.is_null()) return answers;
      answers.push_back(r["choices"][0]["text"].get<std::string>());
      cached.push_back(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>());
      for (const auto& lp : r["choices"][0]["logprobs"]["token_logprobs"]) logprobs.push_back(lp.get<double>());
      prompt += answers.back();
    }
    return answers;
  };
  std::vector<int64_t> cached_off, cached_on;
  std::vector<double> logprobs_off, logprobs_on;
  Server off = start({"-m", m.string(), "--name", "m", "-t", "1", "--tp", "2", "--no-prefix-cache"}, "cache_off");
  ASSERT_GT(off.pid, 0);
  const std::vector<std::string> expected = converse(off, cached_off, logprobs_off);
  ::kill(off.pid, SIGTERM);
  EXPECT_EQ(wait_exit(off, 15), 0) << slurp(off.log);
  ASSERT_EQ(expected.size(), sentences.size());
  EXPECT_EQ(cached_off, (std::vector<int64_t>{0, 0, 0}));

  Server on = start({"-m", m.string(), "--name", "m", "-t", "1", "--tp", "2"}, "cache_on");
  ASSERT_GT(on.pid, 0);
  EXPECT_EQ(converse(on, cached_on, logprobs_on), expected) << slurp(on.log);
  ASSERT_EQ(logprobs_on.size(), logprobs_off.size());
  ASSERT_EQ(logprobs_off.size(), 12 * sentences.size());
  for (size_t i = 0; i < logprobs_on.size(); ++i) EXPECT_NEAR(logprobs_on[i], logprobs_off[i], 2e-3) << "token " << i;
  ASSERT_EQ(cached_on.size(), sentences.size());
  EXPECT_EQ(cached_on[0], 0);
  EXPECT_GT(cached_on[1], 0);
  EXPECT_GT(cached_on[2], cached_on[1]);
  EXPECT_NE(slurp(on.log).find("recurrent-state checkpoints"), std::string::npos) << slurp(on.log);
  ::kill(on.pid, SIGTERM);
  EXPECT_EQ(wait_exit(on, 15), 0) << slurp(on.log);
}

TEST_F(ServeTp, HybridTp2DiskTierSurvivesARestartAndAMissingShardIsAMissOnEveryRank) {
  // The disk tier over a TP 2 group: each rank writes its shard of the KV blocks to its own
  // folder (rank 0's entries carry the whole state checkpoints). After a restart the second
  // turn resumes from disk with the text and log-probabilities of an uncached group. With
  // rank 1's shards gone, rank 0 still has its entries, but the ranks decide together: a
  // miss on every rank, the same answer.
  const fs::path m = dir_ / "qwen35_moe_disk";
  const std::string gen =
      "/usr/bin/python3 " + kSource + "/tools/gen_model.py " + m.string() +
      " --arch qwen3_5_moe --heads 4 --kv-heads 2 --layers 4 --lin-k-heads 2 --lin-v-heads 4 > /dev/null 2>&1";
  ASSERT_EQ(std::system(gen.c_str()), 0) << gen;
  const std::string first = "Once upon a time there was a little dog who liked to run in the park with his friends. ";
  const std::string next = "One day the dog found a red ball under a big tree and took it home. ";
  const std::string cache = (dir_ / "disk_cache").string();
  const std::vector<std::string> base = {"-m", m.string(), "--name", "m", "-t", "1", "--tp", "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  auto logprobs = [](const nlohmann::json& r) {
    std::vector<double> out;
    for (const auto& lp : r["choices"][0]["logprobs"]["token_logprobs"]) out.push_back(lp.get<double>());
    return out;
  };
  auto cached = [](const nlohmann::json& r) {
    return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  };
  auto stop = [](Server& s) {
    ::kill(s.pid, SIGTERM);
    EXPECT_EQ(wait_exit(s, 15), 0) << slurp(s.log);
  };

  std::string second;
  nlohmann::json cold;
  {
    Server s = start(with({"--cache-dir", cache, "--cache-disk-size", "64MiB"}), "disk_first");
    ASSERT_GT(s.pid, 0);
    const nlohmann::json t1 = complete(s, dir_, first, 12);
    ASSERT_FALSE(t1.is_null());
    second = first + t1["choices"][0]["text"].get<std::string>() + next;
    stop(s);  // the engine writes what memory caches; each rank flushes its shard
  }
  for (const char* rank : {"rank0of2", "rank1of2"}) {
    ASSERT_TRUE(fs::exists(fs::path(cache) / rank) && !fs::is_empty(fs::path(cache) / rank)) << rank;
  }
  {
    Server s = start(with({"--no-prefix-cache"}), "disk_cold");
    ASSERT_GT(s.pid, 0);
    cold = complete(s, dir_, second, 12);
    ASSERT_FALSE(cold.is_null());
    stop(s);
  }
  const std::vector<double> cold_logprobs = logprobs(cold);
  ASSERT_EQ(cold_logprobs.size(), 12u);
  auto expect_as_cold = [&](const nlohmann::json& r) {
    EXPECT_EQ(r["choices"][0]["text"], cold["choices"][0]["text"]);
    const std::vector<double> lp = logprobs(r);
    ASSERT_EQ(lp.size(), cold_logprobs.size());
    for (size_t i = 0; i < lp.size(); ++i) EXPECT_NEAR(lp[i], cold_logprobs[i], 2e-3) << "token " << i;
  };
  {
    Server s = start(with({"--cache-dir", cache, "--cache-disk-size", "64MiB"}), "disk_restarted");
    ASSERT_GT(s.pid, 0);
    const nlohmann::json t2 = complete(s, dir_, second, 12);
    ASSERT_FALSE(t2.is_null());
    EXPECT_GT(cached(t2), 0) << t2.dump() << slurp(s.log);
    expect_as_cold(t2);
    stop(s);
  }
  fs::remove_all(fs::path(cache) / "rank1of2");
  {
    Server s = start(with({"--cache-dir", cache, "--cache-disk-size", "64MiB"}), "disk_shard_gone");
    ASSERT_GT(s.pid, 0);
    const nlohmann::json t2 = complete(s, dir_, second, 12);
    ASSERT_FALSE(t2.is_null());
    EXPECT_EQ(cached(t2), 0) << t2.dump() << slurp(s.log);
    expect_as_cold(t2);
    stop(s);
  }
}

TEST_F(ServeTp, GroupMistakesAreRefusedBeforeAnyRankStarts) {
  INFERA_REQUIRE_FIXTURE(kStories);
  // Checked in the launching process: plain messages, no MPI start-up.
  auto serve_error = [&](const std::string& models) {
    const fs::path yaml = dir_ / "bad.yaml", log = dir_ / "bad.log";
    std::ofstream(yaml) << "models:\n" << models;
    const std::string cmd = kInfera + " serve --config " + yaml.string() + " --port " + std::to_string(free_port()) +
                            " > " + log.string() + " 2>&1";
    EXPECT_NE(std::system(cmd.c_str()), 0) << models;
    return slurp(log);
  };
  const std::string entry = "  - name: a\n    path: " + kStories + "\n";
  std::string err = serve_error(entry + "    tp: 2\n    ep: 4\n");
  EXPECT_NE(err.find("models[0]: tp 2 with ep 4: each must be 1 or the group's size"), std::string::npos) << err;
  err = serve_error(entry + "    tp: 2\n  - name: b\n    path: " + kStories + "\n    tp: 2\n");
  EXPECT_NE(err.find("models[0] and models[1] both set tp/ep above 1"), std::string::npos) << err;
  err = serve_error(entry + "    tp: 3\n");
  EXPECT_NE(err.find("--tp 3 must divide num_attention_heads (8)"), std::string::npos) << err;
  EXPECT_EQ(err.find("mpirun"), std::string::npos) << "no rank should have started:\n" << err;
}

TEST_F(ServeTp, AKilledWorkerRankEndsTheServer) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s = start({"-m", kStories, "--name", "m", "-t", "1", "--tp", "2"}, "kill");
  ASSERT_GT(s.pid, 0);
  const pid_t victim = test::find_rank(s.pid, 1);
  ASSERT_NE(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const int code = wait_exit(s, 10);
  EXPECT_NE(code, -1) << "the server was still running 10 s after rank 1 died";
  EXPECT_NE(code, 0);
  const std::string log = slurp(s.log);
  EXPECT_NE(log.find("process rank 1"), std::string::npos) << log;
  EXPECT_NE(log.find("error: the group of 2 ranks ended"), std::string::npos) << log;
}

}  // namespace
}  // namespace infera
