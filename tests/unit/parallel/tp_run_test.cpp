// `infera run --tp N / --ep N` end to end: the ranks are real processes under mpirun on
// this host. Tensor/expert parallel runs must give the greedy tokens of one process and
// logits within 1e-4 (only the summation order of the all-reduces differs: observed
// ~3e-6 on logits of magnitude ~10-17), hold ~1/TP of the weights per rank, and end the
// whole group with a message naming the rank when one rank fails or dies.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/parallel/communicator.h"
#include "process_util.h"

extern char** environ;

namespace infera {
namespace {

namespace fs = std::filesystem;

const std::string kSource = INFERA_SOURCE_DIR;
const std::string kInfera = std::string(INFERA_BINARY_DIR) + "/infera";
const std::string kStories = test::stories_dir();
constexpr float kLogitTolerance = 1e-4f;

using test::slurp;

struct Result {
  int exit_code = -1;
  std::string out, err;
  nlohmann::json json;  // last stdout line, when it parses
};

class TpRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("infera_tp_" + std::to_string(::getpid()));
    // A private OpenMPI session directory for the mpiruns this test starts itself (infera
    // --tp makes its own): mpiruns side by side share /tmp/ompi.<host>.<uid> otherwise,
    // and one's clean-up races another's start.
    fs::create_directories(dir_ / "ompi");
    ::setenv("OMPI_MCA_orte_tmpdir_base", (dir_ / "ompi").c_str(), /*overwrite=*/1);
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() {
    fs::remove_all(dir_);
    ::unsetenv("OMPI_MCA_orte_tmpdir_base");
  }
  void SetUp() override {
    if (!parallel::mpi_available()) GTEST_SKIP() << "built without MPI";
    ASSERT_TRUE(fs::exists(kInfera)) << "the infera binary is missing (it is built with the tests)";
  }

  // Generates a model once per suite.
  static std::string model(const std::string& name, const std::string& args) {
    const fs::path d = dir_ / name;
    if (!fs::exists(d / "config.json")) {
      const std::string cmd =
          "/usr/bin/python3 " + kSource + "/tools/gen_model.py " + d.string() + " " + args + " > /dev/null 2>&1";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    return d.string();
  }

  static Result run(const std::string& args) {
    Result r;
    const fs::path out = dir_ / "out.txt", err = dir_ / "err.txt";
    const std::string cmd = args + " > " + out.string() + " 2> " + err.string();
    const int rc = std::system(cmd.c_str());
    r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
    r.out = slurp(out);
    r.err = slurp(err);
    const size_t nl = r.out.find_last_of('\n', r.out.size() >= 2 ? r.out.size() - 2 : 0);
    try {
      r.json = nlohmann::json::parse(nl == std::string::npos ? r.out : r.out.substr(nl + 1));
    } catch (const nlohmann::json::exception&) {
    }
    return r;
  }

  // A GGUF file of a generated model (`infera convert --to gguf --type <type>`), once per suite.
  static std::string gguf(const std::string& name, const std::string& args, const std::string& type) {
    const std::string src = model(name, args);
    const fs::path out = dir_ / (name + "_" + type + ".gguf");
    if (!fs::exists(out)) {
      const std::string cmd =
          kInfera + " convert " + src + " " + out.string() + " --to gguf --type " + type + " > /dev/null 2>&1";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    return out.string();
  }

  // Greedy run with --json; logits of the prompt's last position into `logits`.
  static Result greedy(const std::string& model_dir, const std::string& extra, std::vector<float>& logits, int n = 16,
                       int threads = 1) {
    const fs::path lf = dir_ / "logits.bin";
    fs::remove(lf);
    Result r = run(kInfera + " run -m " + model_dir + " --prompt-ids [1,5,9,13,17] -n " + std::to_string(n) +
                   " --temp 0 --ignore-eos --json -t " + std::to_string(threads) + " --logits-file " + lf.string() +
                   " " + extra);
    const std::string bytes = slurp(lf);
    logits.assign(bytes.size() / sizeof(float), 0.0f);
    // (none when the run failed, as some are meant to: memcpy may not take a null pointer)
    if (!logits.empty()) std::memcpy(logits.data(), bytes.data(), logits.size() * sizeof(float));
    return r;
  }

  // Same tokens and logits as one process, for each parallel configuration.
  static void expect_same_as_one_process(const std::string& model_dir, const std::vector<std::string>& configs) {
    std::vector<float> ref_logits, logits;
    const Result ref = greedy(model_dir, "", ref_logits);
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    ASSERT_FALSE(ref_logits.empty());
    for (const std::string& cfg : configs) {
      const Result r = greedy(model_dir, cfg, logits);
      ASSERT_EQ(r.exit_code, 0) << cfg << "\n" << r.err;
      EXPECT_EQ(r.json["ids"], ref.json["ids"]) << cfg;
      ASSERT_EQ(logits.size(), ref_logits.size()) << cfg;
      float worst = 0;
      for (size_t i = 0; i < logits.size(); ++i) worst = std::max(worst, std::fabs(logits[i] - ref_logits[i]));
      EXPECT_LT(worst, kLogitTolerance) << cfg;
      ASSERT_TRUE(r.json.contains("parallel")) << cfg;
      EXPECT_EQ(r.json["parallel"]["ranks"].size(), std::max(std::stoul(cfg.substr(cfg.rfind(' ') + 1)), 1ul)) << cfg;
    }
  }

  // Peak resident KiB of the largest rank of `m` at `tp` (infera run under the test's own
  // mpirun, so both sizes pay the same launcher).
  static double peak_rank_kib(const std::string& m, int tp) {
    const std::string launch =
        "mpirun --oversubscribe --bind-to none --allow-run-as-root -np " + std::to_string(tp) + " ";
    const Result r = run(launch + kInfera + " run -m " + m +
                         " --prompt-ids [1,2,3] -n 2 --temp 0 --json -t 1 "
                         "--prefill-chunk 16 --ctx 64 --tp " +
                         std::to_string(tp));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    int64_t worst = 0;
    for (const auto& rank : r.json["parallel"]["ranks"]) worst = std::max(worst, rank["vm_hwm_kib"].get<int64_t>());
    return static_cast<double>(worst);
  }

  static fs::path dir_;
};

fs::path TpRun::dir_;

TEST_F(TpRun, Stories260KTp2AndTp4MatchOneProcess) {
  INFERA_REQUIRE_FIXTURE(kStories);
  // 8 heads, 4 KV heads: both TP sizes divide.
  expect_same_as_one_process(kStories, {"--tp 2", "--tp 4"});
}

TEST_F(TpRun, Qwen3Tp2AndTp4MatchOneProcess) {
  // qk-norm, explicit head_dim, tied embeddings, a vocabulary TP 4 does not divide evenly.
  const std::string m = model("qwen3", "--arch qwen3 --heads 8 --kv-heads 4 --layers 2 --vocab 510 --tie");
  expect_same_as_one_process(m, {"--tp 2", "--tp 4"});
}

TEST_F(TpRun, Qwen3MoeExpertAndTensorParallelMatchOneProcess) {
  // Layer 1 dense (mlp_only_layers): EP leaves it whole, TP splits it.
  const std::string m = model("moe", "--arch qwen3_moe --heads 8 --kv-heads 4 --layers 3 --mlp-only-layers 1");
  expect_same_as_one_process(m, {"--ep 2", "--tp 2", "--tp 2 --ep 2", "--no-mmap --tp 2 --ep 2"});
}

TEST_F(TpRun, Qwen35HybridTensorAndExpertParallelMatchOneProcess) {
  // Gated DeltaNet layers split by key-head groups (2 value heads per key head), gated
  // attention by heads, experts and the shared expert by EP / columns.
  const std::string moe = model("qwen35_moe",
                                "--arch qwen3_5_moe --heads 4 --kv-heads 2 --layers 4 --lin-k-heads 2 "
                                "--lin-v-heads 4");
  expect_same_as_one_process(moe, {"--tp 2", "--ep 2", "--tp 2 --ep 2"});
  // Dense hybrid at TP 4: one key head (two value heads) per rank.
  const std::string dense = model("qwen35",
                                  "--arch qwen3_5 --heads 8 --kv-heads 4 --layers 4 --lin-k-heads 4 "
                                  "--lin-v-heads 8");
  expect_same_as_one_process(dense, {"--tp 2", "--tp 4"});
}

TEST_F(TpRun, DeepseekHeadsSplitLatentReplicatedMatchOneProcess) {
  // MLA: q_b / kv_b rows and o_proj columns by head, the latent path and its cache on every
  // rank; a dense first layer, then grouped sigmoid MoE with a shared expert (split by
  // columns under TP, by experts under EP, also by all-to-all dispatch).
  const std::string m = model("deepseek",
                              "--arch deepseek_v3 --heads 4 --layers 3 --experts 8 --n-group 4 --topk-group 2"
                              " --rope-scaling yarn --rope-factor 4 --rope-orig-max-pos 32");
  expect_same_as_one_process(m, {"--tp 2", "--tp 4", "--ep 2", "--tp 2 --ep 2", "--ep-dispatch all-to-all --ep 2"});
}

TEST_F(TpRun, ExpertDispatchByAllToAllMatchesTheAllReduceCombine) {
  // Tokens split across ranks, each (token, expert) pair sent to the expert's rank and its
  // output sent back; the shared expert (hybrid) runs whole on the token's rank.
  const std::string moe = model("moe", "--arch qwen3_moe --heads 8 --kv-heads 4 --layers 3 --mlp-only-layers 1");
  expect_same_as_one_process(moe, {"--ep-dispatch all-to-all --ep 2", "--ep-dispatch all-to-all --ep 4"});
  const std::string hybrid = model("qwen35_moe",
                                   "--arch qwen3_5_moe --heads 4 --kv-heads 2 --layers 4 --lin-k-heads 2 "
                                   "--lin-v-heads 4");
  std::vector<float> logits, ar_logits;
  const Result r = greedy(hybrid, "--ep-dispatch all-to-all --ep 2", logits, 8);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Result all_reduce = greedy(hybrid, "--ep 2", ar_logits, 8);
  EXPECT_EQ(r.json["ids"], all_reduce.json["ids"]);
  ASSERT_EQ(logits.size(), ar_logits.size());
  for (size_t i = 0; i < logits.size(); ++i) ASSERT_NEAR(logits[i], ar_logits[i], kLogitTolerance) << i;
  // Per decode token: the step broadcast, then per MoE layer (4) the count and the two
  // row all-to-alls and the all-gather; the all-reduce combine needs one per layer.
  EXPECT_DOUBLE_EQ(r.json["parallel"]["decode_collectives_per_token"].get<double>(), 1 + 4 * 4);
  EXPECT_DOUBLE_EQ(all_reduce.json["parallel"]["decode_collectives_per_token"].get<double>(), 1 + 4);
  // Refused where tokens are not split (TP attention holds them all).
  const Result bad = run(kInfera + " run -m " + moe + " --prompt-ids [1] -n 1 --ep-dispatch all-to-all --tp 2 --ep 2");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--ep-dispatch all-to-all needs --ep N without --tp"), std::string::npos) << bad.err;
}

TEST_F(TpRun, Qwen3NextFusedProjectionsSplitByKeyHeadGroup) {
  // in_proj_qkvz / in_proj_ba are interleaved per key-head group: a rank takes whole groups.
  const std::string m = model("qwen3_next",
                              "--arch qwen3_next --heads 4 --kv-heads 2 --layers 4 --lin-k-heads 2 "
                              "--lin-v-heads 4 --mlp-only-layers 1");
  expect_same_as_one_process(m, {"--tp 2", "--ep 2"});
}

TEST_F(TpRun, QuantizedCheckpointsSplitByRowsAndWholeGroups) {
  const std::string f32 = model("qwen3", "--arch qwen3 --heads 8 --kv-heads 4 --layers 2 --vocab 510 --tie");
  auto quantized = [&](const std::string& scheme, const std::string& extra) {
    const fs::path out = dir_ / ("q_" + scheme + extra.substr(extra.find_last_of(' ') + 1));
    if (!fs::exists(out / "config.json")) {
      const std::string cmd =
          kInfera + " quantize " + f32 + " " + out.string() + " --scheme " + scheme + " " + extra + " > /dev/null 2>&1";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    return out.string();
  };
  // W4A16: float activations, so the split changes only the summation order.
  expect_same_as_one_process(quantized("w4a16", "--group-size 32"), {"--tp 2", "--tp 4"});
  {  // quantized experts and shared expert of the hybrid: columns (TP) or whole experts (EP)
    const std::string moe = model("qwen35_moe",
                                  "--arch qwen3_5_moe --heads 4 --kv-heads 2 --layers 4 --lin-k-heads 2 "
                                  "--lin-v-heads 4");
    const fs::path out = dir_ / "q_moe_w4a16";
    const std::string cmd = kInfera + " quantize " + moe + " " + out.string() + " --scheme w4a16 > /dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    expect_same_as_one_process(out.string(), {"--tp 2", "--tp 2 --ep 2"});
  }
  {  // quantized GDN projections: qwen3_next's fused in_proj_qkvz by whole key-head groups
    const std::string next = model("qwen3_next_q",
                                   "--arch qwen3_next --heads 4 --kv-heads 2 --layers 4 --lin-k-heads 2 "
                                   "--lin-v-heads 4");
    const fs::path out = dir_ / "q_next_w4a16";
    const std::string cmd = kInfera + " quantize " + next + " " + out.string() + " --scheme w4a16 > /dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    expect_same_as_one_process(out.string(), {"--tp 2"});
  }

  // W8A8: a row-parallel layer (o_proj, down) quantizes each rank's slice of its input
  // with the slice's own scale, finer than TP 1's one scale per row. The logits then move
  // by less than the quantization itself moved them from the float model's.
  std::vector<float> ref, one, two;
  ASSERT_EQ(greedy(f32, "", ref, 1).exit_code, 0);
  const std::string w8 = quantized("w8a8", "");
  ASSERT_EQ(greedy(w8, "", one, 1).exit_code, 0);
  const Result r = greedy(w8, "--tp 2", two, 1);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(ref.size() == one.size() && one.size() == two.size() && !ref.empty());
  float quant_error = 0, split_change = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    quant_error = std::max(quant_error, std::fabs(one[i] - ref[i]));
    split_change = std::max(split_change, std::fabs(two[i] - one[i]));
  }
  EXPECT_GT(quant_error, 0.0f);
  EXPECT_LT(split_change, quant_error) << "TP 2 moved W8A8 logits by " << split_change << ", quantization by "
                                       << quant_error;

  // int4 groups run along the input columns: a split inside a group is refused by name.
  const Result bad = greedy(quantized("w4a16", "--group-size 128"), "--tp 4", two, 1);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("not a multiple of the quantization group size 128"), std::string::npos) << bad.err;

  // What the config alone rules out is refused by `infera run` itself, before mpirun starts.
  const Result heads = greedy(w8, "--tp 3", two, 1);
  EXPECT_NE(heads.exit_code, 0);
  EXPECT_NE(heads.err.find("--tp 3 must divide num_attention_heads"), std::string::npos) << heads.err;
  EXPECT_EQ(heads.err.find("error: rank"), std::string::npos) << heads.err;
}

// A GGUF model's decode on two threads takes the shared passes (kernels::matvec_many: a MoE
// token's experts, a layer's q / k / v and gate / up) where one thread makes a call per
// matrix: the same tokens and the same logits, bit for bit, dense and MoE (with a shared
// expert), K types and Q8_0.
TEST_F(TpRun, GgufDecodeOnTwoThreadsEqualsOneBitForBit) {
  const std::string dense =
      "--arch qwen3 --hidden 512 --heads 8 --kv-heads 4 --head-dim 64 --ffn 1024 --layers 2 --vocab 512";
  const std::string moe = "--arch qwen3_moe --heads 8 --kv-heads 4 --layers 2 --moe-ffn 512";
  const std::string shexp =
      "--arch qwen3_5_moe --heads 4 --kv-heads 2 --layers 2 --lin-k-heads 2 --lin-v-heads 4 --shared-ffn 96";
  const std::pair<std::string, std::string> files[] = {{gguf("gguf_dense", dense, "q4_k_m"), "dense Q4_K_M"},
                                                       {gguf("gguf_moe_k", moe, "q4_k_m"), "MoE Q4_K_M"},
                                                       {gguf("gguf_moe", moe, "q8_0"), "MoE Q8_0"},
                                                       {gguf("gguf_shexp", shexp, "q8_0"), "MoE Q8_0, shared expert"}};
  for (const auto& [file, what] : files) {
    std::vector<float> one, two;
    const Result a = greedy(file, "", one, 8, 1);
    ASSERT_EQ(a.exit_code, 0) << what << "\n" << a.err;
    const Result b = greedy(file, "", two, 8, 2);
    ASSERT_EQ(b.exit_code, 0) << what << "\n" << b.err;
    EXPECT_EQ(b.json["ids"], a.json["ids"]) << what;
    ASSERT_FALSE(one.empty()) << what;
    EXPECT_EQ(two, one) << what << ": the final logits differ between one and two threads";
  }
}

TEST_F(TpRun, GgufFilesSplitByRowsAndWholeBlocks) {
  // llama.cpp's block types: column-parallel layers by rows, row-parallel ones by whole
  // blocks of every row, each rank packing the panels of its slices only. The activations
  // are quantized to int8 per block, as in one process (the slices are whole blocks), so
  // the split changes only the f32 summation order of the all-reduces; where that moves an
  // activation across a rounding step of its int8 quantization, the next layers carry the
  // step on (seen on a 16-layer model: 0.1-0.3 on logits; on these 2-4 layer models 0 to
  // 1e-6). So the bound is the quantization's own: the split must move the logits less than
  // quantizing moved them from the float model's, with the same greedy tokens.
  auto expect_split_within_quantization = [&](const std::string& name, const std::string& args, const std::string& type,
                                              const std::vector<std::string>& configs) {
    const std::string file = gguf(name, args, type);
    std::vector<float> ref, one, split;
    ASSERT_EQ(greedy(model(name, args), "", ref).exit_code, 0);
    const Result base = greedy(file, "", one);
    ASSERT_EQ(base.exit_code, 0) << base.err;
    ASSERT_TRUE(!one.empty() && one.size() == ref.size()) << file;
    float quant_error = 0;
    for (size_t i = 0; i < one.size(); ++i) quant_error = std::max(quant_error, std::fabs(one[i] - ref[i]));
    EXPECT_GT(quant_error, 0.0f) << file;
    for (const std::string& cfg : configs) {
      const Result r = greedy(file, cfg, split);
      ASSERT_EQ(r.exit_code, 0) << file << " " << cfg << "\n" << r.err;
      EXPECT_EQ(r.json["ids"], base.json["ids"]) << file << " " << cfg;
      ASSERT_EQ(split.size(), one.size()) << file << " " << cfg;
      float change = 0;
      for (size_t i = 0; i < one.size(); ++i) change = std::max(change, std::fabs(split[i] - one[i]));
      EXPECT_LT(change, quant_error) << file << " " << cfg << ": the split moved the logits by " << change
                                     << ", quantizing by " << quant_error;
      ASSERT_TRUE(r.json.contains("parallel")) << cfg;
    }
  };
  // 256-column blocks (Q4_K, Q6_K): TP 2 gives o_proj and down_proj whole blocks.
  const std::string dense =
      "--arch qwen3 --hidden 512 --heads 8 --kv-heads 4 --head-dim 64 --ffn 1024 --layers 2 "
      "--vocab 512";
  // (--no-mmap: slices copied from the file read into memory, whose pages are then mapped back)
  expect_split_within_quantization("gguf_dense", dense, "q4_k_m", {"--tp 2", "--no-mmap --tp 2"});
  expect_split_within_quantization("gguf_dense", dense, "q8_0", {"--tp 2", "--tp 4"});
  // llama: q / k rows in llama.cpp's order (pairs adjacent within each head), split by head.
  expect_split_within_quantization("gguf_llama",
                                   "--arch llama --hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --ffn 512 "
                                   "--layers 2 --vocab 512",
                                   "q8_0", {"--tp 2"});
  // Experts whole (EP, also by all-to-all dispatch) or by columns (TP).
  expect_split_within_quantization("gguf_moe", "--arch qwen3_moe --heads 8 --kv-heads 4 --layers 3", "q8_0",
                                   {"--ep 2", "--tp 2", "--tp 2 --ep 2", "--ep-dispatch all-to-all --ep 2",
                                    "--no-mmap --ep 2"});
  // Gated DeltaNet projections from several row ranges, the shared expert by columns.
  expect_split_within_quantization("gguf_hybrid",
                                   "--arch qwen3_5_moe --heads 4 --kv-heads 2 --layers 4 --lin-k-heads 2 "
                                   "--lin-v-heads 4",
                                   "q8_0", {"--tp 2", "--ep 2"});
  // MLA: q_b rows and o_proj columns by head, the latent projections whole on every rank.
  expect_split_within_quantization("gguf_deepseek",
                                   "--arch deepseek_v3 --heads 4 --layers 3 --experts 8 --n-group 4 --topk-group 2",
                                   "q8_0", {"--tp 2", "--ep 2", "--tp 2 --ep 2"});

  // A split inside a block is refused by name (TP 4: o_proj's 512 columns at multiples of 128),
  // by the launcher from the file's headers, before any rank starts (a rank's error says
  // "error: rank R of N"); the MoE file's experts split by columns the same way, where --ep would not.
  std::vector<float> logits;
  const Result bad = greedy(gguf("gguf_dense", dense, "q4_k_m"), "--tp 4", logits, 1);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find(
                "blk.0.attn_output.weight: tensor parallelism splits its 512 input columns at [0, 128), inside "
                "the 256-column blocks of its GGUF type Q4_K; pick a --tp that gives each rank whole blocks"),
            std::string::npos)
      << bad.err;
  EXPECT_EQ(bad.err.find("error: rank"), std::string::npos) << bad.err;
  const std::string moe_args = "--arch qwen3_moe --heads 8 --kv-heads 4 --layers 2 --moe-ffn 512";
  const Result bad_moe = greedy(gguf("gguf_moe_k", moe_args, "q4_k_m"), "--tp 4", logits, 1);
  EXPECT_NE(bad_moe.exit_code, 0);
  EXPECT_NE(bad_moe.err.find("(or split the experts with --ep)"), std::string::npos) << bad_moe.err;
  EXPECT_EQ(bad_moe.err.find("error: rank"), std::string::npos) << bad_moe.err;
  // A shared expert splits over every rank under --ep too (Q8_0: 32-column blocks, its 96
  // columns at 48); all-to-all dispatch keeps it whole, which the error says.
  const std::string shexp = gguf("gguf_shexp",
                                 "--arch qwen3_5_moe --heads 4 --kv-heads 2 --layers 2 --lin-k-heads 2 --lin-v-heads 4 "
                                 "--shared-ffn 96",
                                 "q8_0");
  const Result bad_shexp = greedy(shexp, "--ep 2", logits, 1);
  EXPECT_NE(bad_shexp.exit_code, 0);
  EXPECT_NE(bad_shexp.err.find("ffn_down_shexp.weight: tensor parallelism splits its 96 input columns at [0, 48)"),
            std::string::npos)
      << bad_shexp.err;
  EXPECT_NE(bad_shexp.err.find("--ep-dispatch all-to-all keeps it whole"), std::string::npos) << bad_shexp.err;
  EXPECT_EQ(greedy(shexp, "--ep 2 --ep-dispatch all-to-all", logits, 1).exit_code, 0);
}

TEST_F(TpRun, GgufPerRankWeightMemoryIsAboutOneOverTp) {
  // ~74 MB of Q8_0 (16 layers): each rank keeps the panels of its slices, none of the
  // whole matrices' (bound without them) and none of the file's pages it read. Baseline:
  // a tiny model under the same launcher.
  const std::string big = gguf("gguf_big",
                               "--arch llama --hidden 512 --layers 16 --heads 8 --kv-heads 8 --head-dim 64 "
                               "--ffn 2048 --vocab 2048 --dtype bf16",
                               "q8_0");
  const std::string tiny = model("qwen3", "--arch qwen3 --heads 8 --kv-heads 4 --layers 2 --vocab 510 --tie");
  const double w1 = peak_rank_kib(big, 1) - peak_rank_kib(tiny, 1);
  const double w2 = peak_rank_kib(big, 2) - peak_rank_kib(tiny, 2);
  ASSERT_GT(w1, 60.0 * 1024) << "the big file's weights should be resident with TP 1";
  std::printf("GGUF weights resident: TP 1 %.1f MiB, TP 2 %.1f MiB per rank (ratio %.3f)\n", w1 / 1024, w2 / 1024,
              w2 / w1);
  EXPECT_NEAR(w2 / w1, 0.5, 0.5 * 0.15) << "TP 1: " << w1 / 1024 << " MiB, TP 2 per rank: " << w2 / 1024 << " MiB";
}

TEST_F(TpRun, CollectivesPerDecodeTokenAreTwoPerLayerPlusTwo) {
  INFERA_REQUIRE_FIXTURE(kStories);
  // Merged: one broadcast of the step, one all-reduce per attention and per MLP, one
  // gather of the logits. Textbook: 3 broadcasts, an embedding all-reduce, an all-gather.
  std::vector<float> logits;
  const Result merged = greedy(kStories, "--tp 2", logits, 8);
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  const int layers = 5;
  EXPECT_DOUBLE_EQ(merged.json["parallel"]["decode_collectives_per_token"].get<double>(), 2 * layers + 2);
  const Result textbook = greedy(kStories, "--tp 2 --tp-textbook-sync", logits, 8);
  ASSERT_EQ(textbook.exit_code, 0) << textbook.err;
  EXPECT_EQ(textbook.json["ids"], merged.json["ids"]);
  EXPECT_DOUBLE_EQ(textbook.json["parallel"]["decode_collectives_per_token"].get<double>(), 2 * layers + 5);
}

TEST_F(TpRun, PerRankWeightMemoryIsAboutOneOverTp) {
  INFERA_REQUIRE_FIXTURE(kStories);
  // ~140 MB of f32 weights so they dominate the process; a tiny model under the same
  // launcher gives the baseline (binary, MPI libraries, buffers) to subtract. The 4 MB
  // embedding table is not split (each rank reads its tokens' rows).
  const std::string big = model("big",
                                "--arch llama --hidden 512 --layers 8 --heads 8 --kv-heads 8 --head-dim 64 "
                                "--ffn 2048 --vocab 2048");
  const double w1 = peak_rank_kib(big, 1) - peak_rank_kib(kStories, 1);
  const double w2 = peak_rank_kib(big, 2) - peak_rank_kib(kStories, 2);
  // 128 MiB of layers, 4 MiB output head, up to 4 MiB of embedding rows.
  ASSERT_GT(w1, 120.0 * 1024) << "the big model's weights should be resident with TP 1";
  std::printf("weights resident: TP 1 %.1f MiB, TP 2 %.1f MiB per rank (ratio %.3f)\n", w1 / 1024, w2 / 1024, w2 / w1);
  EXPECT_NEAR(w2 / w1, 0.5, 0.5 * 0.15) << "TP 1: " << w1 / 1024 << " MiB, TP 2 per rank: " << w2 / 1024 << " MiB";
}

TEST_F(TpRun, HybridPerRankWeightMemoryIsAboutOneOverTp) {
  INFERA_REQUIRE_FIXTURE(kStories);
  // Dense Qwen3.5 (~125 MB f32): GDN projections, conv and gated attention are copied per
  // rank from several row ranges; they must not keep the neighbours' rows resident.
  const std::string big = model("big_hybrid",
                                "--arch qwen3_5 --hidden 512 --layers 8 --heads 8 --kv-heads 4 "
                                "--head-dim 64 --lin-k-heads 4 --lin-v-heads 8 --ffn 2048 --vocab 2048 "
                                "--no-mtp");
  const double base1 = peak_rank_kib(kStories, 1), base2 = peak_rank_kib(kStories, 2);
  const double w1 = peak_rank_kib(big, 1) - base1, w2 = peak_rank_kib(big, 2) - base2;
  ASSERT_GT(w1, 100.0 * 1024) << "the hybrid's weights should be resident with TP 1";
  std::printf("hybrid weights resident: TP 1 %.1f MiB, TP 2 %.1f MiB per rank (ratio %.3f)\n", w1 / 1024, w2 / 1024,
              w2 / w1);
  EXPECT_NEAR(w2 / w1, 0.5, 0.5 * 0.15) << "TP 1: " << w1 / 1024 << " MiB, TP 2 per rank: " << w2 / 1024 << " MiB";
}

TEST_F(TpRun, RanksSeeingDifferentModelFilesStopWithAMessage) {
  const std::string other = model("qwen3_other", "--arch qwen3 --heads 8 --kv-heads 4 --layers 3");
  const std::string same = model("qwen3", "--arch qwen3 --heads 8 --kv-heads 4 --layers 2 --vocab 510 --tie");
  const std::string common = " run --prompt-ids [1,2] -n 2 --temp 0 -t 1 --tp 2 -m ";
  const Result r = run("mpirun --oversubscribe --bind-to none --allow-run-as-root -np 1 " + kInfera + common + same +
                       " : -np 1 " + kInfera + common + other);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("rank(s) 1 see different model files"), std::string::npos) << r.err;
}

TEST_F(TpRun, AnErrorOnRankZeroEndsTheGroup) {
  INFERA_REQUIRE_FIXTURE(kStories);
  // The prompt check runs on rank 0 only, after every rank loaded its shard.
  const auto start = std::chrono::steady_clock::now();
  const Result r = run(kInfera + " run -m " + kStories + " --prompt-ids [1,2,3] -n 100 --ctx 50 -t 1 --tp 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("error: rank 0 of 2: prompt (3 tokens) + -n 100 exceeds the context"), std::string::npos)
      << r.err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
}

TEST_F(TpRun, GroupsStartedSideBySideEachGetAPrivateSessionFolder) {
  INFERA_REQUIRE_FIXTURE(kStories);
  // Two `--tp 2` launches at once, under one session base: each makes and removes its own
  // folder inside it, so neither's clean-up can pull the other's files away.
  const fs::path base = dir_ / "session_base";
  fs::create_directories(base);
  std::string cmd;
  for (int i = 0; i < 2; ++i) {
    cmd += "OMPI_MCA_orte_tmpdir_base=" + base.string() + " " + kInfera + " run -m " + kStories +
           " --prompt-ids [1,2,3] -n 8 --temp 0 --ignore-eos --json -t 1 --tp 2 > " +
           (dir_ / ("side" + std::to_string(i))).string() + " 2>&1 & ";
  }
  ASSERT_EQ(std::system((cmd + "wait").c_str()), 0);
  std::vector<nlohmann::json> ids;
  for (int i = 0; i < 2; ++i) {
    const std::string out = slurp(dir_ / ("side" + std::to_string(i)));
    // The JSON line: the other rank's log lines (stderr, the same file) may come before or
    // after it.
    std::string json_line;
    std::stringstream lines(out);
    for (std::string l; std::getline(lines, l);) {
      if (l.starts_with("{")) json_line = l;
    }
    ASSERT_FALSE(json_line.empty()) << out;
    ids.push_back(nlohmann::json::parse(json_line)["ids"]);
  }
  EXPECT_EQ(ids[0], ids[1]);
  EXPECT_TRUE(fs::is_empty(base)) << "a launch left its session folder behind";
}

TEST_F(TpRun, AKilledRankEndsTheGroupWithinSeconds) {
  const std::string m = model("qwen3", "--arch qwen3 --heads 8 --kv-heads 4 --layers 2 --vocab 510 --tie");
  const fs::path err = dir_ / "kill_err.txt";
  std::vector<std::string> args = {kInfera, "run",      "-m",     m,   "--prompt-ids", "[1,2,3]", "-n", "10000000",
                                   "--ctx", "10000010", "--temp", "0", "--ignore-eos", "-t",      "1",  "--tp",
                                   "2"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t launcher = 0;  // infera, which runs mpirun, which runs the ranks
  ASSERT_EQ(posix_spawn(&launcher, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);

  pid_t victim = 0;
  for (int i = 0; i < 200 && victim == 0; ++i) {  // up to 20 s for the ranks to start
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    victim = test::find_rank(launcher, 1);
  }
  ASSERT_NE(victim, 0) << slurp(err);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // mid-generation
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, WNOHANG), 0) << "the group ended before the kill: " << slurp(err);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  pid_t done = 0;
  while ((done = ::waitpid(launcher, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - killed < std::chrono::seconds(15)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (done == 0) {
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, &status, 0);
    FAIL() << "the group was still running 15 s after rank 1 died";
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(seconds, 10.0);
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string text = slurp(err);
  EXPECT_NE(text.find("process rank 1"), std::string::npos) << text;
  EXPECT_NE(text.find("signal 9"), std::string::npos) << text;
}

}  // namespace
}  // namespace infera
