// `infera imatrix` / `convert --calib`: the importance matrix computed from calibration text
// against tools/imatrix_ref.py (a NumPy forward recording every block matrix's squared
// inputs), on generated llama and qwen3_moe checkpoints; the file round trip through the
// --imatrix reader; convert with the computed matrix equal, byte for byte, to convert with
// the file; and the bad inputs.
#include "infera/tools/imatrix.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/quant/calibration.h"
#include "infera/tools/gguf_export.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

const fs::path& scratch() {
  static const fs::path dir = test::process_scratch_dir("infera_imatrix");
  return dir;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// f32 checkpoints: with bf16 weights the matmul paths may round activations to bf16, and the
// routing of a token near a tie between two experts could then differ from float64's.
std::string llama_model() {
  return test::generate_model(scratch() / "llama",
                              "--arch llama --hidden 256 --layers 2 --heads 4 --kv-heads 2 --head-dim 64 --ffn 512 "
                              "--vocab 512 --seed 41 --dtype f32");
}

std::string moe_model() {
  return test::generate_model(scratch() / "qwen3moe",
                              "--arch qwen3_moe --hidden 256 --layers 2 --heads 4 --kv-heads 2 --head-dim 64 "
                              "--experts 8 --experts-per-tok 2 --moe-ffn 256 --vocab 512 --seed 42 --dtype f32");
}

std::string calib_file() {
  const fs::path p = scratch() / "calib.txt";
  if (!fs::exists(p)) {
    fs::create_directories(scratch());
    std::ofstream f(p);
    for (int i = 0; i < 12; ++i) {
      f << "The quick brown fox " << i << " jumps over the lazy dog, and then it rests under a tree. "
        << "Numbers like " << i * 37 << " and words like river, stone and light follow.\n";
    }
  }
  return p.string();
}

ImatrixOptions options(int64_t tokens) {
  ImatrixOptions o;
  o.calib_file = calib_file();
  o.calib_tokens = tokens;
  o.chunk_size = 48;  // windows of 48, 48 and the rest
  return o;
}

// Compares `m` with the NumPy reference over the same tokens and windows.
void expect_matches_reference(const std::string& dir, const Imatrix& m, const ImatrixOptions& o) {
  const std::vector<int32_t> ids = quant::calibration_tokens(dir, o.calib_file, o.calib_tokens);
  ASSERT_EQ(m.tokens, static_cast<int64_t>(ids.size()));
  std::string list;
  for (int32_t t : ids) list += (list.empty() ? "" : ",") + std::to_string(t);
  const fs::path out = fs::path(dir) / "imatrix_ref.json";
  const std::string cmd = "/usr/bin/python3 " + std::string(INFERA_SOURCE_DIR) + "/tools/imatrix_ref.py " + dir +
                          " --tokens " + list + " --chunk-size " + std::to_string(o.chunk_size) + " --out " +
                          out.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  const nlohmann::json ref = nlohmann::json::parse(f);
  ASSERT_EQ(ref["tokens"].get<int64_t>(), m.tokens);
  ASSERT_EQ(ref["entries"].size(), m.entries.size());
  for (const auto& [name, r] : ref["entries"].items()) {
    SCOPED_TRACE(name);
    auto it = m.entries.find(name);
    ASSERT_NE(it, m.entries.end());
    const ImatrixEntry& e = it->second;
    const auto counts = r["counts"].get<std::vector<int64_t>>();
    const auto sums = r["sums"].get<std::vector<double>>();
    ASSERT_EQ(e.cols, r["cols"].get<int64_t>());
    ASSERT_EQ(e.counts.size(), counts.size());
    ASSERT_EQ(e.sums.size(), sums.size());
    for (size_t j = 0; j < counts.size(); ++j) EXPECT_EQ(e.counts[j], static_cast<float>(counts[j])) << "matrix " << j;
    double worst = 0.0;
    for (size_t i = 0; i < sums.size(); ++i) {
      worst = std::max(worst, std::fabs(e.sums[i] - sums[i]) / (std::fabs(sums[i]) + 1e-6));
    }
    EXPECT_LT(worst, 1e-4);  // measured: 3e-6 at most
  }
}

TEST(Imatrix, LlamaMatchesNumpyReference) {
  const std::string dir = llama_model();
  const ImatrixOptions o = options(100);
  const Imatrix m = compute_imatrix(dir, o);
  // Every block matrix: attn_q/k/v/output, ffn_gate/up/down of 2 layers, all tokens.
  EXPECT_EQ(m.entries.size(), 14u);
  EXPECT_EQ(m.chunk_size, 48u);
  EXPECT_EQ(m.chunk_count, 3u);
  EXPECT_EQ(m.entries.at("blk.1.ffn_down.weight").cols, 512);
  EXPECT_EQ(m.entries.at("blk.0.attn_q.weight").counts, std::vector<float>{100.0f});
  expect_matches_reference(dir, m, o);
}

TEST(Imatrix, Qwen3MoeMatchesNumpyReferencePerExpert) {
  const std::string dir = moe_model();
  const ImatrixOptions o = options(100);
  const Imatrix m = compute_imatrix(dir, o);
  const ImatrixEntry& gate = m.entries.at("blk.0.ffn_gate_exps.weight");
  ASSERT_EQ(gate.counts.size(), 8u);
  float routed = 0.0f;
  for (float c : gate.counts) routed += c;
  EXPECT_EQ(routed, 200.0f);  // 2 experts per token
  EXPECT_EQ(m.entries.at("blk.1.ffn_down_exps.weight").cols, 256);
  EXPECT_EQ(m.entries.count("blk.0.ffn_gate_inp.weight"), 0u);  // the router is not recorded
  expect_matches_reference(dir, m, o);
}

// Fused experts (Qwen3.5-MoE's gate_up_proj [E, 2I, H]): the gate and up halves get the same
// per-expert entry (one shared input), every token counted top-k times per layer; the GDN
// projections whose GGUF form reorders their columns are left out, the attention layers' in.
TEST(Imatrix, FusedExpertsGiveGateAndUpOneEntry) {
  const std::string dir = test::generate_model(
      scratch() / "qwen35moe",
      "--arch qwen3_5_moe --hidden 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 "
      "--lin-v-heads 4 --lin-dk 16 --lin-dv 16 --experts 8 --experts-per-tok 2 --moe-ffn 32 --shared-ffn 48 "
      "--vocab 320 --seed 43 --dtype f32");
  const Imatrix m = compute_imatrix(dir, options(100));
  for (int layer = 0; layer < 4; ++layer) {
    const std::string b = "blk." + std::to_string(layer) + ".";
    SCOPED_TRACE(b);
    const ImatrixEntry& gate = m.entries.at(b + "ffn_gate_exps.weight");
    const ImatrixEntry& up = m.entries.at(b + "ffn_up_exps.weight");
    const ImatrixEntry& down = m.entries.at(b + "ffn_down_exps.weight");
    EXPECT_EQ(gate.sums, up.sums);
    EXPECT_EQ(gate.counts, up.counts);
    EXPECT_EQ(gate.counts, down.counts);
    ASSERT_EQ(gate.counts.size(), 8u);
    EXPECT_EQ(gate.cols, 64);
    EXPECT_EQ(down.cols, 32);
    float routed = 0.0f;
    for (float c : gate.counts) routed += c;
    EXPECT_EQ(routed, 200.0f);
    EXPECT_EQ(m.entries.at(b + "ffn_gate_shexp.weight").counts, std::vector<float>{100.0f});
  }
  EXPECT_EQ(m.entries.count("blk.3.attn_q.weight"), 1u);  // full attention every fourth layer
  EXPECT_EQ(m.entries.count("blk.0.ssm_out.weight"), 0u);  // columns reordered per value head
}

TEST(Imatrix, FileRoundTripAndConvertCalibEqualsConvertImatrixFile) {
  for (const std::string& dir : {llama_model(), moe_model()}) {
    SCOPED_TRACE(dir);
    const Imatrix m = compute_imatrix(dir, options(100));
    const fs::path file = fs::path(dir) / "imatrix.gguf";
    write_imatrix_gguf(m, file.string());
    const Imatrix back = read_imatrix_gguf(file.string());
    EXPECT_EQ(back.datasets, m.datasets);
    EXPECT_EQ(back.chunk_count, m.chunk_count);
    EXPECT_EQ(back.chunk_size, m.chunk_size);
    ASSERT_EQ(back.entries.size(), m.entries.size());
    for (const auto& [name, e] : m.entries) {
      EXPECT_EQ(back.entries.at(name).sums, e.sums) << name;
      EXPECT_EQ(back.entries.at(name).counts, e.counts) << name;
    }
    EXPECT_EQ(load_imatrix_importance(file.string()), imatrix_importance(m));

    GgufExportOptions with_file, in_memory, none;
    with_file.out_type = in_memory.out_type = none.out_type = GgufOutType::kQ4_K_M;
    with_file.imatrix_path = file.string();
    in_memory.imatrix = &m;
    const fs::path a = fs::path(dir) / "file.gguf", b = fs::path(dir) / "memory.gguf", c = fs::path(dir) / "none.gguf";
    export_gguf(dir, a.string(), with_file);
    export_gguf(dir, b.string(), in_memory);
    export_gguf(dir, c.string(), none);
    const std::string bytes_a = read_bytes(a), bytes_b = read_bytes(b), bytes_c = read_bytes(c);
    EXPECT_EQ(bytes_a.size(), bytes_b.size());
    EXPECT_TRUE(bytes_a == bytes_b) << "convert --calib and convert --imatrix FILE differ";
    EXPECT_FALSE(bytes_a == bytes_c) << "the importance matrix changed nothing";
  }
}

TEST(Imatrix, BadInputsAreClearErrors) {
  const std::string dir = llama_model();
  const fs::path empty = scratch() / "empty.txt";
  std::ofstream(empty).close();
  ImatrixOptions o = options(100);
  o.calib_file = empty.string();
  EXPECT_NE(test::error_of([&] { compute_imatrix(dir, o); }).find("the calibration file is empty"), std::string::npos);
  o = options(0);
  EXPECT_NE(test::error_of([&] { compute_imatrix(dir, o); }).find("--calib-tokens 0"), std::string::npos);
  o = options(100);
  o.calib_file = (scratch() / "missing.txt").string();
  EXPECT_NE(test::error_of([&] { compute_imatrix(dir, o); }).find("cannot read"), std::string::npos);
  o = options(100);
  o.chunk_size = 1;
  EXPECT_NE(test::error_of([&] { compute_imatrix(dir, o); }).find("--chunk-size 1"), std::string::npos);
}

}  // namespace
}  // namespace infera
