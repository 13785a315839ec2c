// The planner's estimate against the measured peak memory (max RSS = VmHWM) of real
// `infera run` processes on generated models: weights (mmapped pages touched count in
// RSS), KV cache filled by a prompt that spans the context, f32 scratch buffers.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "infera/model/config.h"
#include "infera/tools/planner.h"

extern char** environ;

namespace infera {
namespace {

namespace fs = std::filesystem;

const std::string kSource = INFERA_SOURCE_DIR;
const std::string kInfera = std::string(INFERA_BINARY_DIR) + "/infera";

// Runs argv to completion; returns the child's peak resident set (bytes), or -1.
int64_t peak_rss_of(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  struct rusage ru {};
  if (::wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // ru_maxrss is the child's VmHWM in KiB
}

std::string prompt_ids(int n, int vocab) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    if (i) s += ',';
    s += std::to_string((i * 7) % (vocab - 10) + 3);
  }
  return s + "]";
}

struct Case {
  const char* name;
  std::string gen_args;
  WeightScheme scheme;
  int prompt;
  int ctx;
};

class PlannerMeasured : public ::testing::TestWithParam<Case> {};

TEST_P(PlannerMeasured, WithinTenPercentOfPeakRss) {
  ASSERT_TRUE(fs::exists(kInfera)) << "the infera binary is missing (it is built with the tests)";
  const Case& c = GetParam();
  const fs::path dir =
      fs::temp_directory_path() / ("infera_plan_" + std::string(c.name) + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string gen =
      "/usr/bin/python3 " + kSource + "/tools/gen_model.py " + dir.string() + " " + c.gen_args + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(gen.c_str()), 0) << gen;
  const ModelConfig cfg = load_model_config(dir.string());

  const int n_predict = 4;
  const int64_t measured = peak_rss_of({kInfera, "run", "-m", dir.string(), "--prompt-ids",
                                        prompt_ids(c.prompt, cfg.vocab_size), "-n", std::to_string(n_predict), "--temp",
                                        "0", "--ignore-eos", "--ctx", std::to_string(c.ctx), "--json", "-t", "2"});
  fs::remove_all(dir);
  ASSERT_GT(measured, 0) << "infera run failed";

  PlanOptions o;
  o.scheme = c.scheme;
  o.ctx = c.prompt + n_predict;  // the KV pages the run touches (the pool is reserved, not committed)
  o.concurrency = 1;
  o.prefill_chunk = 512;  // infera run's default
  o.include_mtp = false;  // infera run does not draft: MTP weights stay unpaged, its KV untouched
  const DevicePlan d = plan_memory(cfg, o).devices.at(0);
  const double ratio = static_cast<double>(d.total_bytes) / static_cast<double>(measured);
  std::printf("[ %s ] planned %s (weights %s, KV %s, activations %s, reserve %s), measured %s, ratio %.3f\n", c.name,
              format_bytes(d.total_bytes).c_str(), format_bytes(d.weights_bytes).c_str(),
              format_bytes(d.kv_bytes).c_str(), format_bytes(d.activation_bytes).c_str(),
              format_bytes(d.reserve_bytes).c_str(), format_bytes(measured).c_str(), ratio);
  EXPECT_GT(ratio, 0.9);
  EXPECT_LT(ratio, 1.1);
}

INSTANTIATE_TEST_SUITE_P(GeneratedModels, PlannerMeasured,
                         ::testing::Values(
                             // f32 llama, a prompt spanning most of the context: KV and prefill scratch matter.
                             Case{"llama_f32",
                                  "--arch llama --hidden 512 --layers 4 --heads 8 --kv-heads 2 --head-dim 64 --ffn "
                                  "2048 --vocab 1024 --max-pos 2048",
                                  WeightScheme::kF32, 480, 512},
                             // bf16 qwen3 (q/k norms, head_dim != hidden/heads), weights used in place as bf16.
                             Case{"qwen3_bf16",
                                  "--arch qwen3 --hidden 768 --layers 6 --heads 8 --kv-heads 4 --head-dim 128 --ffn "
                                  "3072 --vocab 2048 --max-pos 2048 --dtype bf16",
                                  WeightScheme::kBF16, 200, 256},
                             // hybrid qwen3_5_moe: Gated DeltaNet state, gated attention, fused experts, MTP.
                             Case{"qwen3_5_moe_f32",
                                  "--arch qwen3_5_moe --hidden 512 --layers 4 --heads 8 --kv-heads 2 --head-dim 64 "
                                  "--vocab 1024 --max-pos 2048 "
                                  "--experts 8 --experts-per-tok 2 --moe-ffn 512 --shared-ffn 512 --lin-k-heads 4 "
                                  "--lin-v-heads 8 --lin-dk 64 --lin-dv 64",
                                  WeightScheme::kF32, 200, 256}),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace infera
