// Helpers shared by the unit tests of several modules (kept here once, not copied between
// test files): fixtures of ../shared/models, scratch folders, files and processes, the ISA
// paths of this CPU, tiny generated models and delta-rule inputs.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "infera/base/cpu.h"
#include "infera/base/error.h"
#include "infera/kernels/delta.h"
#include "infera/kernels/quant.h"
#include "infera/model/kv_pool.h"
#include "infera/model/model.h"

extern char** environ;

namespace infera::test {

// Fixtures kept beside the source tree, in ../shared/models: the trained stories260K model
// (Hugging Face layout), its llama.cpp GGUF and their golden outputs. A plain clone has no
// ../shared; the tests that read it skip (INFERA_REQUIRE_FIXTURE) and everything else runs.
inline std::string shared_models_dir() { return std::string(INFERA_SOURCE_DIR) + "/../shared/models"; }
inline std::string stories_dir() { return shared_models_dir() + "/stories260K"; }
inline std::string stories_gguf() { return shared_models_dir() + "/stories260K.gguf"; }

// Skips the current test, naming the fixture, when `path` does not exist. Usable in a test
// body or a fixture's SetUp().
#define INFERA_REQUIRE_FIXTURE(path)                                                                \
  do {                                                                                              \
    if (!::std::filesystem::exists(path))                                                           \
      GTEST_SKIP() << "fixture " << (path) << " not found (the ../shared/models folder beside the " \
                   << "source tree; a plain clone does not have it)";                               \
  } while (0)

// Under ThreadSanitizer (GCC's runtime) every application page touched also touches four
// times its size of shadow, which resident memory counts too: 5 resident bytes per byte.
// Memory tests divide resident growth by it.
#if defined(__SANITIZE_THREAD__)
constexpr int64_t kResidentBytesPerByte = 5;
#else
constexpr int64_t kResidentBytesPerByte = 1;
#endif

// Resident memory of this process (the resident pages of /proc/self/statm), bytes.
inline int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

// n samples of N(0, scale²), reproducible from `seed`.
inline std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Removes a folder when the test binary ends (register with AddGlobalTestEnvironment).
class RemoveDirAtExit : public ::testing::Environment {
 public:
  explicit RemoveDirAtExit(std::filesystem::path dir) : dir_(std::move(dir)) {}
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::filesystem::path dir_;
};

// Runs a shell command, returns {exit status, stdout}.
inline std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// <temp>/<prefix>_<pid>: a scratch folder of this test process, removed at exit.
inline std::filesystem::path process_scratch_dir(const std::string& prefix) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  ::testing::AddGlobalTestEnvironment(new RemoveDirAtExit(dir));
  return dir;
}

// A fresh folder <temp>/<prefix>_<pid>_<n>, removed with everything in it when the object
// goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "infera_test") {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// The whole file, bytes as they are ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The message of the infera::Error that fn throws, "" when it throws none.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A loopback TCP port that is free now (for a server a test starts).
// Polls `cond` every 5 ms until it holds or `limit` has passed; its last answer. For effects
// that land just after a client has its response (metrics, freed blocks, cancels).
inline bool wait_for(const std::function<bool()>& cond, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// `infera serve` as a child process, for tests that need the real binary (signals,
// restarts, MPI ranks).
struct ServeProcess {
  pid_t pid = -1;  // -1: not running
  int port = 0;
  std::filesystem::path log;  // its stdout and stderr
};

// Starts `binary serve <args> --port P` on a free port and waits up to `ready_s` seconds for
// /ready; a failure of the test (naming the log) when it exits or is not ready by then.
inline ServeProcess spawn_serve(const std::string& binary, std::vector<std::string> args,
                                const std::filesystem::path& log, double ready_s) {
  ServeProcess s;
  s.port = free_port();
  s.log = log;
  args.insert(args.begin(), {binary, "serve"});
  args.insert(args.end(), {"--port", std::to_string(s.port)});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, s.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  EXPECT_EQ(posix_spawn(&s.pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  const std::string probe = "curl -sf http://127.0.0.1:" + std::to_string(s.port) + "/ready > /dev/null 2>&1";
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(ready_s);
  while (std::chrono::steady_clock::now() < until) {
    if (std::system(probe.c_str()) == 0) return s;
    int status = 0;
    if (::waitpid(s.pid, &status, WNOHANG) == s.pid) {
      ADD_FAILURE() << "infera serve exited before it was ready:\n" << slurp(s.log);
      s.pid = -1;
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "infera serve did not become ready:\n" << slurp(s.log);
  return s;
}

// Waits up to `seconds` for the server to exit: its exit code (128 + the signal when one ended
// it), or -1 when it had to be killed.
inline int wait_exit(ServeProcess& s, double seconds) {
  if (s.pid < 0) return 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (::waitpid(s.pid, &status, WNOHANG) == s.pid) {
      s.pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(s.pid, SIGKILL);
  ::waitpid(s.pid, &status, 0);
  s.pid = -1;
  return -1;
}

// The kernel paths this CPU can run, scalar first.
inline std::vector<Isa> available_isas() {
  std::vector<Isa> out = {Isa::kScalar};
  if (cpu_features().has_avx2_path()) out.push_back(Isa::kAvx2);
  if (cpu_features().has_avx512_path()) out.push_back(Isa::kAvx512);
  return out;
}

// A path of the quantized kernels to test: its Isa, and on the AVX2 path of a CPU with
// AVX-VNNI both of its kernel sets (vpmaddubsw first, then the AVX-VNNI ones, which stay
// selected after a loop over quant_paths(), as by default). select() sets the switch and
// gives the Isa; name() says which set runs (after select()).
struct QuantPath {
  Isa isa;
  bool vnni = true;
  Isa select() const {
    kernels::set_quant_avxvnni(vnni);
    return isa;
  }
  std::string name() const {
    if (isa != Isa::kAvx2) return isa_name(isa);
    return std::string(isa_name(isa)) + (kernels::avxvnni_unavailable_reason() == nullptr ? " avx-vnni" : " maddubs");
  }
};
inline std::vector<QuantPath> quant_paths() {
  std::vector<QuantPath> out;
  for (Isa isa : available_isas()) {
    if (isa == Isa::kAvx2 && cpu_features().avxvnni) out.push_back({isa, false});
    out.push_back({isa, true});
  }
  return out;
}

// Writes a random-weight model with tools/gen_model.py into `dir` (unless a model is there
// already) and returns the folder.
inline std::string generate_model(const std::filesystem::path& dir, const std::string& args) {
  if (!std::filesystem::exists(dir / "config.json")) {
    const std::string cmd = "/usr/bin/python3 " + std::string(INFERA_SOURCE_DIR) + "/tools/gen_model.py " +
                            dir.string() + " " + args + " > /dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  return dir.string();
}

// One forward of `tokens` as one sequence from position 0, over KV blocks 0..n_blocks-1 of
// kv (a hybrid gets a fresh recurrent state): the logits of every position with all_logits,
// else of the last.
inline std::vector<float> forward_chunk(Model& model, KvPool& kv, const std::vector<int32_t>& tokens, int32_t n_blocks,
                                        bool all_logits) {
  std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
  for (int32_t i = 0; i < n_blocks; ++i) blocks[i] = i;
  ForwardBatch b;
  b.tokens = tokens;
  SeqChunk s;
  s.n_tokens = static_cast<int32_t>(tokens.size());
  s.block_table = blocks.data();
  s.n_blocks = n_blocks;
  s.all_logits = all_logits;
  std::vector<float> state(static_cast<size_t>(model.state_shape().floats()));
  if (!state.empty()) s.state = state.data();
  b.seqs.push_back(s);
  std::vector<float> logits(static_cast<size_t>(b.num_logit_rows()) * model.config().vocab_size);
  model.forward(b, kv, logits.data());
  return logits;
}

// Loads the model in `dir` and runs forward_chunk() on a KV pool of two 16-token blocks.
inline std::vector<float> model_logits(const std::string& dir, const std::vector<int32_t>& tokens, bool all_logits) {
  std::unique_ptr<Model> model = load_model(dir);
  KvPoolShape shape = model->kv_shape(16);
  shape.num_blocks = 2;
  KvPool kv(shape);
  return forward_chunk(*model, kv, tokens, 2, all_logits);
}

// Sets an environment variable for the scope (nullptr: unsets it), then restores the value it
// had before (HOME, say, is set in every process).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A tiny Qwen3.5-MoE hybrid (Gated DeltaNet + attention + MoE with a shared expert, MTP head).
inline constexpr const char* kTinyHybridArgs =
    "--arch qwen3_5_moe --hidden 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 32"
    " --lin-k-heads 2 --lin-v-heads 4 --lin-dk 16 --lin-dv 16 --experts 8 --experts-per-tok 2"
    " --moe-ffn 32 --shared-ffn 48 --vocab 300 --seed 5";

// Gated delta rule inputs shaped like a real layer's: L2-normed q (scaled) and k, decays g
// and betas from the layer's gates, where neg_exp_a(h) is head h's -exp(A_log), and a
// starting state.
struct DeltaInputs {
  std::vector<float> q, k, v, g, beta, state;
};

inline DeltaInputs delta_rule_inputs(int64_t T, const kernels::DeltaShape& s, uint32_t seed,
                                     const std::function<float(int64_t head)>& neg_exp_a) {
  DeltaInputs in;
  in.q = random_vec(T * s.n_k_heads * s.dk, seed);
  in.k = random_vec(T * s.n_k_heads * s.dk, seed + 1);
  in.v = random_vec(T * s.n_v_heads * s.dv, seed + 2);
  kernels::l2norm_rows(in.q.data(), T * s.n_k_heads, s.dk, 1e-6f, 1.0f / std::sqrt(float(s.dk)));
  kernels::l2norm_rows(in.k.data(), T * s.n_k_heads, s.dk, 1e-6f);
  const auto a = random_vec(T * s.n_v_heads, seed + 3);
  const auto b = random_vec(T * s.n_v_heads, seed + 4);
  std::vector<float> neg_exp(s.n_v_heads), dt_bias(s.n_v_heads);
  for (int64_t h = 0; h < s.n_v_heads; ++h) {
    neg_exp[h] = neg_exp_a(h);
    dt_bias[h] = 0.5f - 0.1f * float(h);
  }
  in.g.resize(T * s.n_v_heads);
  in.beta.resize(T * s.n_v_heads);
  kernels::gdn_gates(a.data(), b.data(), T, s.n_v_heads, neg_exp.data(), dt_bias.data(), in.g.data(), in.beta.data());
  in.state = random_vec(s.n_v_heads * s.dk * s.dv, seed + 5, 0.3f);
  return in;
}

// A model loaded for tests that call forward() directly: a small KV pool and the recurrent
// state of each sequence they run (the runtime's sequence memory owns it in the engine; the
// model only reads and writes it).
struct ModelRunner {
  std::unique_ptr<infera::Model> model;
  std::unique_ptr<infera::KvPool> kv;
  std::vector<std::vector<float>> states;
  explicit ModelRunner(const std::string& dir, int64_t num_blocks = 16, int64_t block_size = 16) {
    model = infera::load_model(dir);
    infera::KvPoolShape shape = model->kv_shape(block_size);
    shape.num_blocks = num_blocks;
    kv = std::make_unique<infera::KvPool>(shape);
  }
  int32_t vocab() const { return model->config().vocab_size; }
  // Sequence i's recurrent state; nullptr for attention-only models.
  float* state(size_t i = 0) {
    const int64_t floats = model->state_shape().floats();
    if (floats == 0) return nullptr;
    if (states.size() <= i) states.resize(i + 1);
    states[i].resize(static_cast<size_t>(floats));
    return states[i].data();
  }
};

}  // namespace infera::test
