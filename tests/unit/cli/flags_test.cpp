// `infera run` and `infera serve` flags, generated from the declared options: every flag
// that existed before keeps its name, meaning and default; every declared option has its
// flag; serve flags land on the same fields as their deploy.yaml keys.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/base/options.h"
#include "infera/cli/option_flags.h"
#include "infera/cli/run_options.h"
#include "infera/cli/serve_options.h"
#include "infera/runtime/engine_config.h"
#include "infera/server/openai_api.h"

namespace infera::cli {
namespace {

using server::DeployConfig;
using server::ModelDeployConfig;

// Parses `args` as `infera run ARGS`; throws CLI::ParseError on a rejected flag.
RunOptions parse_run(std::vector<std::string> args) {
  CLI::App app;
  RunOptions o;
  add_run_flags(app.add_subcommand("run"), o);
  args.insert(args.begin(), "run");
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments reversed
  app.parse(args);
  return o;
}

struct Serve {
  CLI::App app;
  ServeOptions o;
  explicit Serve(std::vector<std::string> args) {
    add_serve_flags(app.add_subcommand("serve"), o);
    args.insert(args.begin(), "serve");
    std::reverse(args.begin(), args.end());
    app.parse(args);
  }
  DeployConfig config() const { return serve_deploy_config(o); }
};

bool run_rejects(const std::vector<std::string>& args) {
  try {
    parse_run(args);
  } catch (const CLI::ParseError&) {
    return true;
  }
  return false;
}

// The sampling flags a user gave are marked: the model's own defaults (--generation-config,
// auto unless told) fill only the others.
TEST(RunFlags, SamplingFlagsGivenAreMarked) {
  EXPECT_EQ(parse_run({}).given, 0u) << "defaults are not given";
  EXPECT_EQ(parse_run({}).generation_config, "auto");
  EXPECT_EQ(parse_run({"--generation-config", "none"}).generation_config, "none");
  const std::pair<std::vector<std::string>, uint32_t> flags[] = {
      {{"--temp", "0.5"}, server::kGivenTemperature},
      {{"--top-k", "3"}, server::kGivenTopK},
      {{"--top-p", "0.9"}, server::kGivenTopP},
      {{"--min-p", "0.1"}, server::kGivenMinP},
      {{"--repeat-penalty", "1.1"}, server::kGivenRepetitionPenalty},
      {{"--presence-penalty", "0.5"}, server::kGivenPresencePenalty},
      {{"--frequency-penalty", "0.5"}, server::kGivenFrequencyPenalty},
      {{"--temp", "0.8"}, server::kGivenTemperature},  // (a value equal to the default is given too)
  };
  for (const auto& [args, bit] : flags) EXPECT_EQ(parse_run(args).given, bit) << args[0];
  EXPECT_EQ(parse_run({"--temp", "0", "--top-k", "1", "-n", "4"}).given,
            server::kGivenTemperature | server::kGivenTopK);
}

TEST(RunFlags, DefaultsAreThoseOfBefore) {
  const RunOptions o = parse_run({});
  EXPECT_EQ(o.model_dir, "");
  EXPECT_EQ(o.n_predict, 128);
  EXPECT_EQ(o.threads, 0);
  EXPECT_EQ(o.ctx, 4096);
  EXPECT_EQ(o.chunk, 512);
  EXPECT_EQ(o.kv_dtype, "f32");
  EXPECT_FLOAT_EQ(o.temperature, 0.8f);
  EXPECT_EQ(o.top_k, 40);
  EXPECT_FLOAT_EQ(o.top_p, 0.95f);
  EXPECT_FLOAT_EQ(o.min_p, 0.05f);
  EXPECT_FLOAT_EQ(o.repeat_penalty, 1.0f);
  EXPECT_FLOAT_EQ(o.presence_penalty, 0.0f);
  EXPECT_FLOAT_EQ(o.frequency_penalty, 0.0f);
  EXPECT_EQ(o.seed, -1);
  EXPECT_FALSE(o.json);
  EXPECT_FALSE(o.ignore_eos);
  EXPECT_FALSE(o.no_mmap);
  EXPECT_EQ(o.logprobs, -1);
  EXPECT_EQ(o.speculative, "none");
  EXPECT_EQ(o.draft_tokens, 0);
  EXPECT_EQ(o.tp, 1);
  EXPECT_EQ(o.ep, 1);
  EXPECT_DOUBLE_EQ(o.tp_timeout, 300.0);
  EXPECT_FALSE(o.tp_textbook_sync);
  EXPECT_EQ(o.ep_dispatch, "allreduce");
}

TEST(RunFlags, EveryFlagOfBeforeParsesToItsField) {
  const RunOptions o = parse_run({"-m",
                                  "/m",
                                  "-p",
                                  "hello",
                                  "-n",
                                  "7",
                                  "-t",
                                  "3",
                                  "-c",
                                  "2048",
                                  "--prefill-chunk",
                                  "64",
                                  "--kv-dtype",
                                  "int8",
                                  "--temp",
                                  "0.5",
                                  "--top-k",
                                  "7",
                                  "--top-p",
                                  "0.5",
                                  "--min-p",
                                  "0.1",
                                  "--repeat-penalty",
                                  "1.2",
                                  "--presence-penalty",
                                  "0.3",
                                  "--frequency-penalty",
                                  "-0.4",
                                  "--seed",
                                  "42",
                                  "--json",
                                  "--logprobs",
                                  "3",
                                  "--ignore-eos",
                                  "--no-mmap",
                                  "--logits-file",
                                  "/tmp/l.bin",
                                  "--speculative",
                                  "ngram",
                                  "--draft-tokens",
                                  "5",
                                  "--tp",
                                  "2",
                                  "--ep",
                                  "2",
                                  "--tp-timeout",
                                  "12.5",
                                  "--tp-textbook-sync",
                                  "--ep-dispatch",
                                  "all-to-all"});
  EXPECT_EQ(o.model_dir, "/m");
  EXPECT_EQ(o.prompt, "hello");
  EXPECT_EQ(o.n_predict, 7);
  EXPECT_EQ(o.threads, 3);
  EXPECT_EQ(o.ctx, 2048);
  EXPECT_EQ(o.chunk, 64);
  EXPECT_EQ(o.kv_dtype, "int8");
  EXPECT_FLOAT_EQ(o.temperature, 0.5f);
  EXPECT_EQ(o.top_k, 7);
  EXPECT_FLOAT_EQ(o.top_p, 0.5f);
  EXPECT_FLOAT_EQ(o.min_p, 0.1f);
  EXPECT_FLOAT_EQ(o.repeat_penalty, 1.2f);
  EXPECT_FLOAT_EQ(o.presence_penalty, 0.3f);
  EXPECT_FLOAT_EQ(o.frequency_penalty, -0.4f);
  EXPECT_EQ(o.seed, 42);
  EXPECT_TRUE(o.json);
  EXPECT_EQ(o.logprobs, 3);
  EXPECT_TRUE(o.ignore_eos);
  EXPECT_TRUE(o.no_mmap);
  EXPECT_EQ(o.logits_file, "/tmp/l.bin");
  EXPECT_EQ(o.speculative, "ngram");
  EXPECT_EQ(o.draft_tokens, 5);
  EXPECT_EQ(o.tp, 2);
  EXPECT_EQ(o.ep, 2);
  EXPECT_DOUBLE_EQ(o.tp_timeout, 12.5);
  EXPECT_TRUE(o.tp_textbook_sync);
  EXPECT_EQ(o.ep_dispatch, "all-to-all");
  // The long spellings and the other prompt sources.
  const RunOptions l =
      parse_run({"--model", "/m2", "--file", "/p.txt", "--n-predict", "9", "--threads", "1", "--ctx", "99"});
  EXPECT_EQ(l.model_dir, "/m2");
  EXPECT_EQ(l.prompt_file, "/p.txt");
  EXPECT_EQ(l.n_predict, 9);
  EXPECT_EQ(l.threads, 1);
  EXPECT_EQ(l.ctx, 99);
  EXPECT_EQ(parse_run({"--prompt-ids", "[1,2]"}).prompt_ids, "[1,2]");
  EXPECT_EQ(parse_run({"--prompt", "x"}).prompt, "x");
  // serve's spelling of --no-mmap is accepted too.
  EXPECT_TRUE(parse_run({"--load-into-memory"}).no_mmap);
}

TEST(RunFlags, ValuesRejectedBeforeAreRejected) {
  EXPECT_TRUE(run_rejects({"--kv-dtype", "fp8"}));
  EXPECT_TRUE(run_rejects({"--top-p", "1.5"}));
  EXPECT_TRUE(run_rejects({"--min-p", "-0.1"}));
  EXPECT_TRUE(run_rejects({"--draft-tokens", "17"}));
  EXPECT_TRUE(run_rejects({"--tp", "0"}));
  EXPECT_TRUE(run_rejects({"--ep", "0"}));
  EXPECT_TRUE(run_rejects({"-c", "0"}));
  EXPECT_TRUE(run_rejects({"--prefill-chunk", "0"}));
  EXPECT_TRUE(run_rejects({"-n", "-1"}));
  EXPECT_TRUE(run_rejects({"-t", "-1"}));
  EXPECT_TRUE(run_rejects({"--temp", "-0.1"}));
  EXPECT_TRUE(run_rejects({"--top-k", "-1"}));
  EXPECT_TRUE(run_rejects({"--repeat-penalty", "0"}));
  EXPECT_TRUE(run_rejects({"--logprobs", "21"}));
  EXPECT_TRUE(run_rejects({"--tp-timeout", "-1"}));
  EXPECT_TRUE(run_rejects({"--speculative", "medusa"}));
  EXPECT_TRUE(run_rejects({"--ep-dispatch", "broadcast"}));
  EXPECT_TRUE(run_rejects({"-p", "x", "-f", "y"}));
  EXPECT_TRUE(run_rejects({"--prompt-ids", "[1]", "-p", "x"}));
  EXPECT_TRUE(run_rejects({"-n", "many"}));
  EXPECT_FALSE(run_rejects({"--temp", "3"}));  // no upper bound, as before
}

TEST(RunFlags, LimitsMatchTheEngine) { EXPECT_EQ(option_spec("draft_tokens").max, SpeculativeConfig::kMaxDraftTokens); }

TEST(Flags, EveryDeclaredOptionHasItsFlag) {
  CLI::App app;
  RunOptions run;
  ServeOptions serve;
  CLI::App* run_cmd = app.add_subcommand("run");
  CLI::App* serve_cmd = app.add_subcommand("serve");
  add_run_flags(run_cmd, run);
  add_serve_flags(serve_cmd, serve);
  EXPECT_EQ(missing_declared_flags(*run_cmd, kUseRun), std::vector<std::string>{});
  EXPECT_EQ(missing_declared_flags(*serve_cmd, kUseServe), std::vector<std::string>{});
  // --help names the environment variables.
  EXPECT_NE(run_cmd->help().find("INFERA_DEFAULT_MODEL"), std::string::npos);
  EXPECT_NE(serve_cmd->help().find("INFERA_API_KEYS"), std::string::npos);
  EXPECT_NE(serve_cmd->help().find("models[].kv_dtype"), std::string::npos);
}

class ServeFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("INFERA_API_KEYS");
    ::setenv("INFERA_DEFAULT_MODEL", "/models/builtin", 1);
  }
  void TearDown() override { ::unsetenv("INFERA_DEFAULT_MODEL"); }
};

TEST_F(ServeFlags, DefaultsAreThoseOfBefore) {
  DeployConfig expected;
  ModelDeployConfig m;
  m.path = "/models/builtin";
  m.name = "infera-default";
  expected.models.push_back(m);
  EXPECT_EQ(Serve({}).config(), expected);
  // -m: the directory's name (prepare_models) unless --name.
  expected.models[0].path = "/m";
  expected.models[0].name = "";
  EXPECT_EQ(Serve({"-m", "/m"}).config(), expected);
  expected.models[0].name = "chat";
  EXPECT_EQ(Serve({"--model", "/m", "--name", "chat"}).config(), expected);
}

TEST_F(ServeFlags, EveryFlagOfBeforeSetsItsField) {
  const Serve s({"-m",
                 "/m",
                 "--name",
                 "chat",
                 "--host",
                 "0.0.0.0",
                 "--port",
                 "9000",
                 "-t",
                 "3",
                 "--api-key",
                 "first-key-123",
                 "--api-key",
                 "second-key-456",
                 "--kv-cache-memory",
                 "2GiB",
                 "--kv-dtype",
                 "bf16",
                 "--max-input-len",
                 "100",
                 "--max-output-len",
                 "50",
                 "--max-batch-tokens",
                 "256",
                 "--max-num-seqs",
                 "8",
                 "--prefill-chunk",
                 "128",
                 "--profile",
                 "long-context",
                 "--chat-template",
                 "/t.jinja",
                 "--audit-log",
                 "/tmp/a.jsonl",
                 "--audit-log-prompts",
                 "--body-limit",
                 "1MiB",
                 "--request-timeout",
                 "30",
                 "--head-timeout",
                 "2.5",
                 "--drain-grace",
                 "5",
                 "--load-into-memory",
                 "--no-prefix-cache",
                 "--speculative",
                 "ngram",
                 "--draft-tokens",
                 "3",
                 "--tp",
                 "2",
                 "--ep",
                 "2",
                 "--tp-timeout",
                 "60",
                 "--allowed-host",
                 "a.local",
                 "--allowed-host",
                 "b.local",
                 "--allowed-origin",
                 "http://localhost:3000"});
  const DeployConfig c = s.config();
  EXPECT_EQ(c.server.host, "0.0.0.0");
  EXPECT_EQ(c.server.port, 9000);
  ASSERT_EQ(c.server.api_keys.size(), 2u);
  EXPECT_EQ(c.server.api_keys[0].id, "key-0");
  EXPECT_EQ(c.server.api_keys[0].key, "first-key-123");
  EXPECT_EQ(c.server.api_keys[1].id, "key-1");
  EXPECT_EQ(c.server.api_keys[1].key, "second-key-456");
  EXPECT_EQ(c.server.audit_log_path, "/tmp/a.jsonl");
  EXPECT_TRUE(c.server.audit_log_prompts);
  EXPECT_EQ(c.server.body_limit_bytes, 1 << 20);
  EXPECT_DOUBLE_EQ(c.server.request_timeout_s, 30);
  EXPECT_DOUBLE_EQ(c.server.head_timeout_s, 2.5);
  EXPECT_DOUBLE_EQ(c.server.drain_grace_s, 5);
  EXPECT_TRUE(c.server.metrics);
  EXPECT_EQ(c.server.http_threads, 64);
  EXPECT_EQ(c.server.allowed_hosts, (std::vector<std::string>{"a.local", "b.local"}));
  EXPECT_EQ(c.server.allowed_origins, std::vector<std::string>{"http://localhost:3000"});
  ASSERT_EQ(c.models.size(), 1u);
  const ModelDeployConfig& m = c.models[0];
  EXPECT_EQ(m.path, "/m");
  EXPECT_EQ(m.name, "chat");
  EXPECT_EQ(m.threads, 3);
  EXPECT_EQ(m.kv_cache_bytes, int64_t{2} << 30);
  EXPECT_EQ(m.kv_dtype, DType::kBF16);
  EXPECT_EQ(m.max_input_len, 100);
  EXPECT_EQ(m.max_output_len, 50);
  EXPECT_EQ(m.max_batch_tokens, 256);
  EXPECT_EQ(m.max_num_seqs, 8);
  EXPECT_EQ(m.prefill_chunk, 128);
  EXPECT_EQ(m.profile, "long-context");
  EXPECT_EQ(m.chat_template_file, "/t.jinja");
  EXPECT_TRUE(m.load_into_memory);
  EXPECT_FALSE(m.enable_prefix_cache);
  EXPECT_EQ(m.speculative.method, "ngram");
  EXPECT_EQ(m.speculative.num_draft_tokens, 3);
  EXPECT_EQ(m.tp, 2);
  EXPECT_EQ(m.ep, 2);
  EXPECT_DOUBLE_EQ(s.o.tp_timeout, 60);
  EXPECT_DOUBLE_EQ(Serve({}).o.tp_timeout, 300);
  // run's spelling of --load-into-memory is accepted too.
  EXPECT_TRUE(Serve({"--no-mmap"}).config().models[0].load_into_memory);
}

TEST_F(ServeFlags, ZeroLimitsMeanNotGiven) {
  const ModelDeployConfig m = Serve({"--max-input-len", "0", "--max-output-len", "0", "--max-batch-tokens", "0",
                                     "--max-num-seqs", "0", "--prefill-chunk", "0"})
                                  .config()
                                  .models[0];
  EXPECT_FALSE(m.max_input_len);
  EXPECT_FALSE(m.max_output_len);
  EXPECT_FALSE(m.max_batch_tokens);
  EXPECT_FALSE(m.max_num_seqs);
  EXPECT_FALSE(m.prefill_chunk);
}

TEST_F(ServeFlags, ApiKeysComeFromTheEnvironmentWhenNoFlagGivesOne) {
  ::setenv("INFERA_API_KEYS", "env-key-12345,,env-key-67890", 1);
  const DeployConfig c = Serve({}).config();
  ASSERT_EQ(c.server.api_keys.size(), 2u);
  EXPECT_EQ(c.server.api_keys[0].key, "env-key-12345");
  EXPECT_EQ(c.server.api_keys[1].key, "env-key-67890");
  const DeployConfig flag = Serve({"--api-key", "flag-key-1234"}).config();
  ASSERT_EQ(flag.server.api_keys.size(), 1u);
  EXPECT_EQ(flag.server.api_keys[0].key, "flag-key-1234");
  ::unsetenv("INFERA_API_KEYS");
}

TEST_F(ServeFlags, ConfigFileTakesHostAndPortFromTheCommandLine) {
  const auto file =
      std::filesystem::temp_directory_path() / ("infera_flags_test_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(file) << "server: {host: 127.0.0.2, port: 7000, allowed_hosts: [f.local]}\nmodels:\n"
                         "  - {name: a, path: /a, threads: 2}\n";
  const DeployConfig file_only = Serve({"--config", file.string()}).config();
  EXPECT_EQ(file_only.server.host, "127.0.0.2");
  EXPECT_EQ(file_only.server.port, 7000);
  const DeployConfig overridden =
      Serve({"--config", file.string(), "--host", "0.0.0.0", "--port", "7001", "-t", "9"}).config();
  EXPECT_EQ(overridden.server.host, "0.0.0.0");
  EXPECT_EQ(overridden.server.port, 7001);
  EXPECT_EQ(overridden.models.at(0).threads, 2);  // other flags do not apply with --config
  // The allowed hosts and origins of the flags join the file's.
  const DeployConfig joined =
      Serve({"--config", file.string(), "--allowed-host", "g.local", "--allowed-origin", "*"}).config();
  EXPECT_EQ(joined.server.allowed_hosts, (std::vector<std::string>{"f.local", "g.local"}));
  EXPECT_EQ(joined.server.allowed_origins, std::vector<std::string>{"*"});
  EXPECT_THROW(Serve({"--config", file.string(), "-m", "/m"}).config(), Error);
  EXPECT_THROW(Serve({"--config", file.string(), "--tp", "2"}).config(), Error);
  std::filesystem::remove(file);
}

TEST_F(ServeFlags, BadValuesAreRejected) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{{"--kv-dtype", "fp8"},
                                                                                    {"--draft-tokens", "17"},
                                                                                    {"--tp", "0"},
                                                                                    {"--kv-cache-memory", "lots"},
                                                                                    {"--port", "70000"},
                                                                                    {"--threads", "x"},
                                                                                    {"--profile", "huge"},
                                                                                    {"--speculative", "medusa"}}) {
    EXPECT_THROW(Serve{args}, CLI::ParseError) << args[0] << " " << args[1];
  }
}

// Models in Ollama's store: `run -m ollama:NAME` opens the blob; `serve -m ollama:NAME` (and
// a deploy.yaml path) serves it under the name Ollama's clients ask for, unless --name; a
// name the store lacks is the flag's error.
TEST_F(ServeFlags, OllamaReferencesResolveToTheirBlobs) {
  namespace fs = std::filesystem;
  test::TempDir store("infera_flags_ollama");
  const std::string hex(64, 'a');
  fs::create_directories(store.path() / "blobs");
  fs::create_directories(store.path() / "manifests/registry.ollama.ai/library/qwen3");
  std::ofstream(store.path() / "blobs" / ("sha256-" + hex)) << "GGUF";
  const std::string params_hex(64, 'b');
  std::ofstream(store.path() / "blobs" / ("sha256-" + params_hex)) << R"({"temperature": 0.6})";
  const std::string system_hex(64, 'c');
  std::ofstream(store.path() / "blobs" / ("sha256-" + system_hex)) << "You are a pirate.";
  const std::string messages_hex(64, 'd');
  std::ofstream(store.path() / "blobs" / ("sha256-" + messages_hex)) << R"([{"role":"user","content":"Ahoy?"}])";
  std::ofstream(store.path() / "manifests/registry.ollama.ai/library/qwen3/8b")
      << R"({"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:)" << hex
      << R"("},{"mediaType":"application/vnd.ollama.image.params","digest":"sha256:)" << params_hex
      << R"("},{"mediaType":"application/vnd.ollama.image.system","digest":"sha256:)" << system_hex
      << R"("},{"mediaType":"application/vnd.ollama.image.messages","digest":"sha256:)" << messages_hex << R"("}]})";
  test::ScopedEnv env("OLLAMA_MODELS", store.path().c_str());
  const std::string blob = (store.path() / "blobs" / ("sha256-" + hex)).string();
  EXPECT_EQ(parse_run({"-m", "ollama:qwen3:8b"}).model_dir, blob);
  EXPECT_EQ(parse_run({"-m", "ollama:qwen3:8b"}).ollama_params,
            (store.path() / "blobs" / ("sha256-" + params_hex)).string())
      << "run takes its params layer's sampling defaults too";
  EXPECT_EQ(parse_run({"-m", "/plain/dir"}).ollama_params, "");
  EXPECT_EQ(parse_run({"-m", "/plain/dir"}).model_dir, "/plain/dir");
  EXPECT_TRUE(run_rejects({"-m", "ollama:qwen3:14b"}));
  DeployConfig c = Serve({"-m", "ollama:qwen3:8b"}).config();
  EXPECT_EQ(c.models.at(0).path, blob);
  EXPECT_EQ(c.models.at(0).name, "qwen3:8b");
  EXPECT_EQ(c.models.at(0).ollama_params, (store.path() / "blobs" / ("sha256-" + params_hex)).string())
      << "its params layer: the model's sampling defaults";
  EXPECT_EQ(c.models.at(0).ollama_system, (store.path() / "blobs" / ("sha256-" + system_hex)).string())
      << "its system layer: the system prompt of chats without one";
  EXPECT_EQ(c.models.at(0).ollama_messages, (store.path() / "blobs" / ("sha256-" + messages_hex)).string())
      << "its messages layer: the preset turns of every chat";
  {
    // The built-in model's variable may name one too; serve keeps what the reference brings.
    test::ScopedEnv builtin("INFERA_DEFAULT_MODEL", "ollama:qwen3:8b");
    c = Serve({}).config();
    EXPECT_EQ(c.models.at(0).path, blob);
    EXPECT_EQ(c.models.at(0).name, "infera-default");
    EXPECT_FALSE(c.models.at(0).ollama_params.empty());
  }
  c = Serve({"-m", "ollama:qwen3:8b", "--name", "chat"}).config();
  EXPECT_EQ(c.models.at(0).name, "chat");
  const std::string file = store.file("deploy.yaml");
  std::ofstream(file) << "models:\n  - {path: 'ollama:qwen3:8b'}\n  - {path: 'ollama:qwen3:14b', name: b}\n";
  std::string e;
  try {
    Serve({"--config", file}).config();
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("models[1].path: ollama:qwen3:14b: Ollama has no tag '14b' of qwen3 (its tags here: 8b)"),
            std::string::npos)
      << e;
  std::ofstream(file) << "models:\n  - {path: 'ollama:qwen3:8b', quantized: 'ollama:qwen3:8b'}\n";
  c = Serve({"--config", file}).config();
  EXPECT_EQ(c.models.at(0).path, blob);
  EXPECT_EQ(c.models.at(0).name, "qwen3:8b");
  EXPECT_EQ(c.models.at(0).quantized_path, blob) << "quantized: resolves as path: does";
}

}  // namespace
}  // namespace infera::cli
