// Repacked quantized weights at load (kernels/quant.h "Repacked layout"): MoE experts, fused
// 3-D (Qwen3.5) and per expert (Qwen3-MoE / Qwen3-Next), are bound with the packed copy and
// the MoE FFN computes from it; the mapped pages a repacked matrix was read from are given
// back (release_repacked_source), so the resident set holds one copy of the weights, not two.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "../test_support.h"
#include "infera/io/safetensors.h"
#include "infera/kernels/quant.h"
#include "infera/model/blocks.h"
#include "infera/model/config.h"
#include "infera/model/quantized_weights.h"
#include "infera/quant/quantizer.h"

namespace infera::quant {
namespace {

namespace fs = std::filesystem;
using kernels::LinearWeight;
using kernels::QuantScheme;

const fs::path kWork = test::process_scratch_dir("infera_quant_repack_test");

using test::random_vec;

// Whether bind_linear repacks here (a SIMD kernel path, INFERA_QUANT_REPACK not 0).
bool repacking() {
  if (!quant_repack_enabled()) return false;
  const QuantizedMatrix q = quantize_matrix(random_vec(16 * 32, 1, 1.0f).data(), 16, 32, QuantScheme::kW8A8, 0);
  return kernels::pack_quant_matrix(q.view()) != nullptr;
}

double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s / std::max<size_t>(v.size(), 1));
}

// One tensor of a file being written; owns its bytes.
struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

void add_quant(std::vector<Tensor>& out, const std::string& name, const QuantizedMatrix& q, int64_t r0, int64_t r1,
               std::vector<int64_t> lead) {
  const bool int4 = kernels::scheme_is_int4(q.scheme);
  const int64_t qb = int4 ? q.cols / 2 : q.cols, sn = int4 ? q.cols / q.group_size : 1, sb = int4 ? sn * 2 : 4;
  std::vector<int64_t> qs = lead, ss = lead;
  qs.push_back(qb);
  ss.push_back(sn);
  out.push_back({name + ".qweight", int4 ? DType::kU8 : DType::kI8, qs,
                 std::vector<uint8_t>(q.qweight.begin() + r0 * qb, q.qweight.begin() + r1 * qb)});
  out.push_back({name + ".scales", int4 ? DType::kF16 : DType::kF32, ss,
                 std::vector<uint8_t>(q.scales.begin() + r0 * sb, q.scales.begin() + r1 * sb)});
}

void add_f32(std::vector<Tensor>& out, const std::string& name, const std::vector<float>& v,
             std::vector<int64_t> shape) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  out.push_back({name, DType::kF32, std::move(shape), std::move(b)});
}

void write_dir(const fs::path& dir, const std::vector<Tensor>& tensors) {
  fs::create_directories(dir);
  std::vector<TensorToWrite> w;
  for (const Tensor& t : tensors) w.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  write_safetensors((dir / "model.safetensors").string(), w);
}

// The same MoE block stored both ways under two prefixes: "fused.mlp." (Qwen3.5: experts.gate_up_proj
// [E, 2I, H], experts.down_proj [E, H, I]) and "split.mlp." (experts.{e}.{gate,up,down}_proj.weight),
// with a quantized shared expert.
struct MoeFixture {
  static constexpr int64_t E = 8, H = 128, I = 64, K = 2, S = 64;
  ModelConfig cfg;
  QuantizationConfig qc;
  WeightStore store;

  explicit MoeFixture(QuantScheme scheme) {
    cfg.num_experts = E;
    cfg.hidden_size = H;
    cfg.moe_intermediate_size = I;
    cfg.num_experts_per_tok = K;
    cfg.norm_topk_prob = true;
    cfg.shared_expert_intermediate_size = S;
    qc.present = true;
    qc.scheme = scheme;
    qc.group_size = kernels::scheme_is_int4(scheme) ? 32 : 0;
    const int64_t gs = qc.group_size;
    // Rows are quantized independently, so the stacked matrices are the experts' matrices.
    const QuantizedMatrix gate_up =
        quantize_matrix(random_vec(E * 2 * I * H, 11, 0.2f).data(), E * 2 * I, H, scheme, gs);
    const QuantizedMatrix down = quantize_matrix(random_vec(E * H * I, 12, 0.2f).data(), E * H, I, scheme, gs);
    const std::vector<float> router = random_vec(E * H, 13, 0.5f), sgate = random_vec(H, 14, 0.3f);
    std::vector<Tensor> t;
    for (const std::string p : {"fused.mlp.", "split.mlp."}) {
      add_f32(t, p + "gate.weight", router, {E, H});
      add_f32(t, p + "shared_expert_gate.weight", sgate, {1, H});
      const QuantizedMatrix sg = quantize_matrix(random_vec(S * H, 15, 0.2f).data(), S, H, scheme, gs);
      const QuantizedMatrix su = quantize_matrix(random_vec(S * H, 16, 0.2f).data(), S, H, scheme, gs);
      const QuantizedMatrix sd = quantize_matrix(random_vec(H * S, 17, 0.2f).data(), H, S, scheme, gs);
      add_quant(t, p + "shared_expert.gate_proj.weight", sg, 0, S, {S});
      add_quant(t, p + "shared_expert.up_proj.weight", su, 0, S, {S});
      add_quant(t, p + "shared_expert.down_proj.weight", sd, 0, H, {H});
    }
    add_quant(t, "fused.mlp.experts.gate_up_proj", gate_up, 0, E * 2 * I, {E, 2 * I});
    add_quant(t, "fused.mlp.experts.down_proj", down, 0, E * H, {E, H});
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = "split.mlp.experts." + std::to_string(e) + ".";
      add_quant(t, x + "gate_proj.weight", gate_up, e * 2 * I, e * 2 * I + I, {I});
      add_quant(t, x + "up_proj.weight", gate_up, e * 2 * I + I, (e + 1) * 2 * I, {I});
      add_quant(t, x + "down_proj.weight", down, e * H, (e + 1) * H, {H});
    }
    const fs::path dir = kWork / ("moe_" + std::string(kernels::scheme_name(scheme)));
    write_dir(dir, t);
    store = WeightStore::open(dir.string());
  }

  // prefix: "fused.mlp." or "split.mlp." (the block's tensors are under "fused." / "split.").
  MoeWeights load(const std::string& prefix) {
    return bind_moe_block(store, prefix.substr(0, prefix.rfind("mlp.")), cfg, qc);
  }
};

// Every quantized matrix of w (experts and shared expert), for edits.
std::vector<LinearWeight*> matrices(MoeWeights& w) {
  std::vector<LinearWeight*> out;
  for (int64_t e = 0; e < w.n_experts(); ++e) {
    if (w.has_expert(e)) out.insert(out.end(), {&w.gate[e], &w.up[e], &w.down[e]});
  }
  out.insert(out.end(), {&w.shared.gate, &w.shared.up, &w.shared.down});
  return out;
}

std::vector<float> run(const MoeWeights& w, MoeFfn::Schedule schedule, const std::vector<float>& x, int64_t T) {
  MoeFfn ffn;
  ffn.set_schedule(schedule);
  std::vector<float> y(T * MoeFixture::H);
  ffn.forward(w, x.data(), T, MoeFixture::H, y.data(), nullptr);
  return y;
}

// Packed experts give what the on-disk layout gives (the same integer dot products), on both
// schedules, and really are read from the packed copy: with every on-disk byte replaced by
// zeros the results do not change (a work item that fell back to the on-disk layout would
// compute zeros there).
TEST(QuantRepack, MoeExpertsComputeFromThePackedCopy) {
  if (!repacking()) GTEST_SKIP() << "no repacking here (the scalar kernel path) or INFERA_QUANT_REPACK=0";
  for (QuantScheme scheme : {QuantScheme::kW8A8, QuantScheme::kW4A8, QuantScheme::kW4A16}) {
    MoeFixture f(scheme);
    for (const std::string prefix : {"fused.mlp.", "split.mlp."}) {
      const std::string label = std::string(kernels::scheme_name(scheme)) + " " + prefix;
      MoeWeights packed = f.load(prefix);
      for (LinearWeight* m : matrices(packed)) ASSERT_TRUE(m->quant.packed) << label << " " << m->name;
      if (prefix == "fused.mlp.") {
        // One packed copy per fused tensor, the experts' views into it (gate rows, then up).
        for (int64_t e = 0; e + 1 < MoeFixture::E; ++e) {
          const kernels::PackedQuantMat& g = *packed.gate[e].quant.packed;
          EXPECT_EQ(g.panel(2 * MoeFixture::I / kernels::kPanelRows), packed.gate[e + 1].quant.packed->panel(0))
              << label;
          EXPECT_EQ(g.panel(MoeFixture::I / kernels::kPanelRows), packed.up[e].quant.packed->panel(0)) << label;
        }
      }
      MoeWeights unpacked = packed, stale = packed;
      for (LinearWeight* m : matrices(unpacked)) m->quant.packed.reset();
      std::vector<std::vector<uint8_t>> zeros;
      for (LinearWeight* m : matrices(stale)) {
        zeros.emplace_back(static_cast<size_t>(m->quant.weight_bytes()), 0);
        m->quant.qweight = m->quant.scales = zeros.back().data();
      }
      for (auto schedule : {MoeFfn::Schedule::kPerExpert, MoeFfn::Schedule::kWorkItems}) {
        for (int64_t T : {1, 3, 21}) {
          const auto x = random_vec(T * MoeFixture::H, 40 + T, 1.0f);
          const auto expect = run(unpacked, schedule, x, T);
          const auto y = run(packed, schedule, x, T);
          const auto ys = run(stale, schedule, x, T);
          const double tol = 1e-4 * (1.0 + rms(expect));  // as quant_moe_test: f32 order only
          for (int64_t i = 0; i < T * MoeFixture::H; ++i) {
            ASSERT_NEAR(y[i], expect[i], tol) << label << " T=" << T << " i=" << i;
            ASSERT_EQ(ys[i], y[i]) << label << " T=" << T << " i=" << i << ": an item read the on-disk layout";
          }
        }
      }
    }
  }
}

// Expert parallelism drops other ranks' experts; for a fused tensor that gives back the
// dropped experts' panels of the shared packed copy, and the kept experts (whose panels
// border them) must compute exactly as before.
TEST(QuantRepack, DroppedExpertsLeaveTheOthersIntact) {
  if (!repacking()) GTEST_SKIP() << "no repacking here (the scalar kernel path) or INFERA_QUANT_REPACK=0";
  MoeFixture f(QuantScheme::kW4A8);
  MoeWeights w = f.load("fused.mlp.");
  MoeWeights unpacked = w;
  for (LinearWeight* m : matrices(unpacked)) m->quant.packed.reset();
  for (int64_t e = 0; e < MoeFixture::E; e += 2) {
    unpacked.drop_expert(e);
    w.drop_expert(e);
    EXPECT_FALSE(w.has_expert(e));
  }
  const int64_t T = 21;
  const auto x = random_vec(T * MoeFixture::H, 77, 1.0f);
  for (auto schedule : {MoeFfn::Schedule::kPerExpert, MoeFfn::Schedule::kWorkItems}) {
    const auto expect = run(unpacked, schedule, x, T);
    const auto y = run(w, schedule, x, T);
    ASSERT_GT(rms(expect), 0.0);
    for (int64_t i = 0; i < T * MoeFixture::H; ++i) ASSERT_NEAR(y[i], expect[i], 1e-4 * (1.0 + rms(expect))) << i;
  }
}

// Binding quantized layers from a mapped file adds one copy of their bytes to the resident
// set (the packed copy), not two: the file pages packing read are released. Reading the
// on-disk layout afterwards still sees the file's bytes (file-backed pages fault back in)
// and adds the second copy, which shows the measurement can see it.
TEST(QuantRepack, MappedPagesAreReleasedAfterRepacking) {
  if (!repacking()) GTEST_SKIP() << "no repacking here (the scalar kernel path) or INFERA_QUANT_REPACK=0";
  // Random bytes are valid weights (int8 / nibbles); scales a fixed finite value.
  constexpr int64_t kRows = 2048, kCols = 4096, kLayers = 4;  // 4 x ~8 MiB (w8a8) / ~4.5 MiB (w4a8)
  QuantizationConfig qc;
  qc.present = true;
  qc.scheme = QuantScheme::kW8A8;
  std::vector<Tensor> t;
  int64_t quant_bytes = 0;
  std::mt19937 rng(5);
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string name = "layers." + std::to_string(l) + ".weight";
    const bool int4 = l % 2 == 1;
    if (int4) qc.overrides[name] = LayerQuant{false, QuantScheme::kW4A8, 32, "", ""};
    const int64_t qb = int4 ? kCols / 2 : kCols, sn = int4 ? kCols / 32 : 1;
    Tensor q{name + ".qweight", int4 ? DType::kU8 : DType::kI8, {kRows, qb}, std::vector<uint8_t>(kRows * qb)};
    for (auto& b : q.bytes) b = static_cast<uint8_t>(rng());
    for (auto& b : q.bytes) b = b == 0x80 ? 0 : b;  // int8 weights in [-127, 127]
    Tensor s{name + ".scales", int4 ? DType::kF16 : DType::kF32, {kRows, sn}, {}};
    if (int4) {
      std::vector<uint16_t> v(kRows * sn, f32_to_f16(0.01f));
      s.bytes.resize(v.size() * 2);
      std::memcpy(s.bytes.data(), v.data(), s.bytes.size());
    } else {
      std::vector<float> v(kRows, 0.01f);
      s.bytes.resize(v.size() * 4);
      std::memcpy(s.bytes.data(), v.data(), s.bytes.size());
    }
    quant_bytes += static_cast<int64_t>(q.bytes.size() + s.bytes.size());
    t.push_back(std::move(q));
    t.push_back(std::move(s));
  }
  const fs::path dir = kWork / "rss";
  write_dir(dir, t);
  std::vector<uint64_t> sums;  // of each layer's qweight, to check re-reads
  for (size_t i = 0; i < t.size(); i += 2) {
    uint64_t sum = 0;
    for (uint8_t b : t[i].bytes) sum = sum * 31 + b;
    sums.push_back(sum);
  }
  t.clear();
  t.shrink_to_fit();

  WeightStore store = WeightStore::open(dir.string());
  const int64_t before = test::resident_bytes();
  std::vector<LinearWeight> layers;
  for (int64_t l = 0; l < kLayers; ++l) {
    layers.push_back(bind_linear(store, "layers." + std::to_string(l) + ".weight", kRows, kCols, qc));
    ASSERT_TRUE(layers.back().quant.packed);
  }
  const double bound = static_cast<double>(test::resident_bytes() - before) / static_cast<double>(quant_bytes);
  std::printf("[ rss      ] binding %.1f MiB of quantized weights added %.2f copies to the resident set\n",
              quant_bytes / 1048576.0, bound);
  // One copy: the packed panels (the same bytes give or take panel padding, < 1 %) plus
  // the partial pages at the tensors' ends and allocator noise; two copies would be 2.0.
  EXPECT_GT(bound, 0.9);
  EXPECT_LT(bound, 1.2);

  const int64_t before_reads = test::resident_bytes();
  for (int64_t l = 0; l < kLayers; ++l) {
    const kernels::QuantMatRef& q = layers[l].quant;
    const auto* p = static_cast<const uint8_t*>(q.qweight);
    const int64_t n = q.rows * (kernels::scheme_is_int4(q.scheme) ? q.cols / 2 : q.cols);
    uint64_t sum = 0;
    for (int64_t i = 0; i < n; ++i) sum = sum * 31 + p[i];
    EXPECT_EQ(sum, sums[l]) << "layer " << l << ": the released on-disk bytes read back differently";
  }
  const double reread = static_cast<double>(test::resident_bytes() - before_reads) / static_cast<double>(quant_bytes);
  std::printf("[ rss      ] reading the on-disk layout again added %.2f copies\n", reread);
  EXPECT_GT(reread, 0.8);
}

// The same for fused experts (bind_moe_block), and expert parallelism's drop_expert then gives
// back the dropped experts' share of the packed copy.
TEST(QuantRepack, FusedExpertsKeepOneCopyAndDroppedExpertsFreeTheirs) {
  if (!repacking()) GTEST_SKIP() << "no repacking here (the scalar kernel path) or INFERA_QUANT_REPACK=0";
  constexpr int64_t E = 16, H = 1024, I = 256;  // w8a8: gate_up 8 MiB, down 4 MiB
  std::mt19937 rng(6);
  auto random_int8 = [&](std::vector<int64_t> shape, int64_t n) {
    Tensor q{"", DType::kI8, std::move(shape), std::vector<uint8_t>(n)};
    for (auto& b : q.bytes) b = static_cast<uint8_t>(rng() % 255 + 129);  // int8 in [-127, 127]
    return q;
  };
  std::vector<Tensor> t;
  add_f32(t, "moe.mlp.gate.weight", random_vec(E * H, 3, 1.0f), {E, H});
  t.push_back(random_int8({E, 2 * I, H}, E * 2 * I * H));
  t.back().name = "moe.mlp.experts.gate_up_proj.qweight";
  add_f32(t, "moe.mlp.experts.gate_up_proj.scales", std::vector<float>(E * 2 * I, 0.01f), {E, 2 * I, 1});
  t.push_back(random_int8({E, H, I}, E * H * I));
  t.back().name = "moe.mlp.experts.down_proj.qweight";
  add_f32(t, "moe.mlp.experts.down_proj.scales", std::vector<float>(E * H, 0.01f), {E, H, 1});
  const double expert_bytes = static_cast<double>(E * (3 * I * H + (2 * I + H) * 4));
  const fs::path dir = kWork / "rss_moe";
  write_dir(dir, t);
  t.clear();
  t.shrink_to_fit();
  ModelConfig cfg;
  cfg.num_experts = E;
  cfg.hidden_size = H;
  cfg.moe_intermediate_size = I;
  cfg.num_experts_per_tok = 2;
  QuantizationConfig qc;
  qc.present = true;
  qc.scheme = QuantScheme::kW8A8;

  WeightStore store = WeightStore::open(dir.string());
  const int64_t before = test::resident_bytes();
  MoeWeights w = bind_moe_block(store, "moe.", cfg, qc);
  const double loaded = static_cast<double>(test::resident_bytes() - before) / expert_bytes;
  for (int64_t e = 0; e < E; e += 2) w.drop_expert(e);
  const double kept = static_cast<double>(test::resident_bytes() - before) / expert_bytes;
  std::printf(
      "[ rss      ] %.1f MiB of fused experts: %.2f copies resident after bind_moe_block, %.2f after dropping "
      "half the experts\n",
      expert_bytes / 1048576.0, loaded, kept);
  EXPECT_GT(loaded, 0.9);
  EXPECT_LT(loaded, 1.2);
  // Half the panels go; pages shared by a kept and a dropped expert's panels stay.
  EXPECT_GT(kept, 0.4);
  EXPECT_LT(kept, 0.65);
}

}  // namespace
}  // namespace infera::quant
