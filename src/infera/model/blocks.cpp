#include "infera/model/blocks.h"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "infera/base/error.h"
#include "infera/base/options.h"
#include "infera/base/threads.h"
#include "infera/kernels/mla.h"
#include "infera/model/arch_registry.h"
#include "infera/model/tensor_table.h"
#include "infera/model/weights.h"

namespace infera {

using kernels::LinearWeight;
using kernels::MatRef;
using kernels::QuantMatRef;

// ---- attention ----

void batch_positions(const ForwardBatch& batch, std::vector<int32_t>& positions) {
  positions.resize(batch.tokens.size());
  for (const SeqChunk& s : batch.seqs) {
    for (int32_t i = 0; i < s.n_tokens; ++i) positions[s.token_begin + i] = s.pos0 + i;
  }
}

void mtp_input_rows(const ForwardBatch& batch, int64_t vocab_size, const kernels::LinearWeight& embed,
                    const float* enorm, const float* hnorm, const float* hidden, int64_t H, float eps, float w_offset,
                    std::vector<float>& out) {
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  out.resize(static_cast<size_t>(T * 2 * H));
  for (int64_t t = 0; t < T; ++t) {
    const int32_t tok = batch.tokens[t];
    INFERA_ASSERT(tok >= 0 && tok < vocab_size, "token id out of range");
    float* row = out.data() + t * 2 * H;
    linear_row(embed, tok, row);
    kernels::rmsnorm(row, enorm, row, 1, H, eps, w_offset);
    kernels::rmsnorm(hidden + t * H, hnorm, row + H, 1, H, eps, w_offset);
  }
}

void gather_logit_rows(const ForwardBatch& batch, const float* x, int64_t H, std::vector<float>& rows) {
  rows.resize(static_cast<size_t>(batch.num_logit_rows() * H));
  int64_t r = 0;
  for (const SeqChunk& s : batch.seqs) {
    if (s.all_logits) {
      std::memcpy(rows.data() + r * H, x + static_cast<int64_t>(s.token_begin) * H, s.n_tokens * H * sizeof(float));
      r += s.n_tokens;
    } else if (s.last_logits) {
      std::memcpy(rows.data() + r * H, x + static_cast<int64_t>(s.token_begin + s.n_tokens - 1) * H, H * sizeof(float));
      r += 1;
    }
  }
}

void paged_attention(const ForwardBatch& batch, KvPool& kv, int64_t kv_layer, const float* q, const float* k,
                     const float* v, int64_t nh, int64_t nkv, int64_t hd, float scale, float* out) {
  const int64_t kv_row = nkv * hd;
  const int64_t bs = kv.shape().block_size;
  static thread_local std::vector<int64_t> slots;  // grows to the largest chunk, then reused
  for (const SeqChunk& s : batch.seqs) {
    slots.resize(static_cast<size_t>(s.n_tokens));
    for (int32_t i = 0; i < s.n_tokens; ++i) {
      const int64_t pos = s.pos0 + i;
      INFERA_ASSERT(pos / bs < s.n_blocks, "block table too short for the chunk");
      slots[i] = static_cast<int64_t>(s.block_table[pos / bs]) * bs + pos % bs;
    }
    // Converted to the cache's dtype here (after RoPE); attention reads them back from
    // the cache like every older key, so a chunk sees exactly what later steps will.
    kv.write(kv_layer, k + s.token_begin * kv_row, v + s.token_begin * kv_row, kv_row, s.n_tokens, slots.data());
    kernels::attention_paged(q + s.token_begin * nh * hd, s.n_tokens, nh, s.pos0, kv.view(kv_layer, s.block_table),
                             scale, out + s.token_begin * nh * hd);
  }
}

// ---- SwiGLU ----

SwigluWeights bind_swiglu(const ModelWeights& weights, int layer, bool shared) {
  SwigluWeights w;
  w.gate = weights.linear(layer, shared ? "ffn_gate_shexp" : "ffn_gate");
  w.up = weights.linear(layer, shared ? "ffn_up_shexp" : "ffn_up");
  w.down = weights.linear(layer, shared ? "ffn_down_shexp" : "ffn_down");
  return w;
}

void swiglu(const SwigluWeights& w, const float* x, int64_t T, float* y, std::vector<float>& scratch) {
  const int64_t F = w.inter();
  scratch.resize(static_cast<size_t>(2 * T * F));
  float* gate = scratch.data();
  float* up = gate + T * F;
  const LinearWeight* ws[] = {&w.gate, &w.up};
  float* ys[] = {gate, up};
  kernels::linear_multi(x, T, ws, ys);
  kernels::silu_mul(gate, up, T * F);
  kernels::linear(gate, T, w.down, y);
}

LinearWeight linear_row_slice(const LinearWeight& w, int64_t r0, int64_t r1) {
  INFERA_ASSERT(0 <= r0 && r0 <= r1 && r1 <= w.rows(), "row slice out of range");
  LinearWeight s = w;
  if (!w.quantized) {
    s.dense = kernels::row_slice(w.dense, r0, r1);
    return s;
  }
  // Shares the repacked copy when r0 and r1 fall on its 16-row panels (the MoE work items
  // are cut there), else a view of the on-disk layout only.
  s.quant = kernels::quant_row_slice(w.quant, r0, r1);
  return s;
}

// ---- MoE ----

namespace {

// Expert weights go straight to the kernels, not through kernels::linear(): the
// calibration observer is not thread-safe and the work-item schedule calls from a parallel
// region (per-expert activation statistics would also rest on few tokens each).
void expert_matmul(const float* x, int64_t m, const LinearWeight& w, float* y) {
  if (w.quantized) {
    kernels::qmatmul(x, m, w.quant, y);
  } else {
    kernels::matmul(x, m, w.dense, y);
  }
}

// y[m, r1 - r0] = x[m, k] · W[r0:r1, :]ᵀ.
void expert_matmul_rows(const float* x, int64_t m, const LinearWeight& w, int64_t r0, int64_t r1, float* y) {
  if (w.quantized) {
    kernels::qmatmul(x, m, linear_row_slice(w, r0, r1).quant, y);
  } else {
    kernels::matmul_rows(x, m, w.dense, r0, r1, y, r1 - r0);
  }
}

}  // namespace

namespace {

// Returns the memory of the panels a packed row slice covers inside its parent's buffer
// (an expert of a fused tensor packed as one matrix), when this LinearWeight is the slice's
// only holder: nothing reads those panels again. Anonymous memory, so the pages read back
// as zeros if touched; the page-aligned interior only, neighbours' panels stay intact.
void release_packed_slice(LinearWeight& w) {
  if (!w.quantized || !w.quant.packed || !w.quant.packed->parent || w.quant.packed.use_count() != 1) return;
  const kernels::PackedQuantMat& p = *w.quant.packed;
  if (p.panels == 0) return;
  const long page = ::sysconf(_SC_PAGESIZE);
  const auto begin = reinterpret_cast<uintptr_t>(p.panel(0));
  const auto end = reinterpret_cast<uintptr_t>(p.panel(p.panels - 1)) + static_cast<uintptr_t>(p.panel_bytes);
  const uintptr_t b = (begin + page - 1) / page * page, e = end / page * page;
  if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

}  // namespace

void MoeWeights::drop_expert(int64_t e) {
  for (LinearWeight* m : {&gate[e], &up[e], &down[e]}) {
    release_packed_slice(*m);
    *m = LinearWeight{};
  }
}

int64_t MoeWeights::weight_bytes_active() const {
  int64_t bytes = matrix_bytes(router);
  for (int64_t e = 0; e < static_cast<int64_t>(gate.size()); ++e) {
    if (!has_expert(e)) continue;
    bytes += top_k * (gate[e].bytes() + up[e].bytes() + down[e].bytes());
    break;
  }
  if (!shared.empty()) bytes += shared.bytes() + matrix_bytes(shared_gate);
  return bytes;
}

void route_experts(const MoeWeights& w, const float* logits, int64_t T, int32_t* ids, float* weights) {
  const int64_t E = w.n_experts(), k = w.top_k;
  if (w.sigmoid_scores) {
    kernels::moe_route_sigmoid(logits, w.score_bias.empty() ? nullptr : w.score_bias.data(), T, E, k, w.n_group,
                               w.topk_group, w.norm_topk_prob, w.routed_scaling, ids, weights);
  } else {
    kernels::moe_route_softmax(logits, T, E, k, w.norm_topk_prob, ids, weights);
  }
}

MoeWeights bind_moe(const ModelWeights& weights, int layer) {
  const ModelConfig& cfg = weights.config();
  const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size;
  MoeWeights w;
  w.top_k = cfg.num_experts_per_tok;
  w.norm_topk_prob = cfg.norm_topk_prob;
  w.router = weights.matrix(layer, "ffn_gate_inp");
  if (weights.find(layer, "ffn_gate_up_exps")) {
    const std::vector<LinearWeight> gate_up = weights.experts(layer, "ffn_gate_up_exps");
    w.gate.resize(E);
    w.up.resize(E);
    for (int64_t e = 0; e < E; ++e) {
      w.gate[e] = linear_row_slice(gate_up[e], 0, I);
      w.up[e] = linear_row_slice(gate_up[e], I, 2 * I);
    }
  } else {
    w.gate = weights.experts(layer, "ffn_gate_exps");
    w.up = weights.experts(layer, "ffn_up_exps");
  }
  w.down = weights.experts(layer, "ffn_down_exps");
  if (weights.find(layer, "ffn_gate_shexp")) {
    w.shared = bind_swiglu(weights, layer, true);
    // DeepSeek's shared experts are ungated (no ffn_gate_inp_shexp row).
    if (weights.find(layer, "ffn_gate_inp_shexp")) w.shared_gate = weights.matrix(layer, "ffn_gate_inp_shexp");
  }
  return w;
}

MoeWeights bind_moe_block(const WeightStore& store, const std::string& block_prefix, const ModelConfig& cfg,
                          const QuantizationConfig& qc) {
  auto source = SafetensorsSource::view(store, qc);
  std::vector<TensorSpec> rows = moe_block_table(cfg, block_prefix, source->has_tensor());
  return bind_moe(ModelWeights(cfg, std::move(source), std::move(rows)), 0);
}

namespace {
ExpertObserver& expert_observer() {
  static ExpertObserver observer;
  return observer;
}
}  // namespace

void set_expert_observer(ExpertObserver observer) { expert_observer() = std::move(observer); }

MoeFfn::MoeFfn() {
  // INFERA_MOE_SCHEDULE=per_expert|work_items|auto: benchmarks compare the schedules.
  static const Schedule from_env = [] {
    const std::string s = option_env("moe_schedule");  // checked against auto, per_expert, work_items
    if (s == "per_expert") return Schedule::kPerExpert;
    if (s == "work_items") return Schedule::kWorkItems;
    return Schedule::kAuto;
  }();
  schedule_ = from_env;
}

void MoeFfn::forward(const MoeWeights& w, const float* x, int64_t T, int64_t H, float* y, uint64_t* counts) {
  const int64_t E = w.n_experts(), k = w.top_k;
  logits_.resize(static_cast<size_t>(T * E));
  route_ids_.resize(static_cast<size_t>(T * k));
  route_w_.resize(static_cast<size_t>(T * k));
  kernels::matmul(x, T, w.router, logits_.data());
  route_experts(w, logits_.data(), T, route_ids_.data(), route_w_.data());
  // Work items pay off with several threads and enough work to share out (a parallel
  // region costs microseconds, far more when a thread is descheduled at its barrier): a
  // decode step with enough expert weights, and every prefill, whose per-expert GEMMs would
  // otherwise be one parallel region each (three per active expert and layer). One thread
  // runs each expert's matmuls whole (fewest kernel calls).
  constexpr int64_t kMinParallelBytes = 256 << 10;
  const int threads = omp_in_parallel() ? 1 : num_threads();
  const bool worth = threads > 1 && (T > kWorkItemMaxTokens || w.weight_bytes_active() >= kMinParallelBytes);
  const bool observed = static_cast<bool>(expert_observer());  // calibration: per expert, observed
  const auto count_routed = [&] {  // counts[e] += the tokens groups_ routes to expert e
    if (!counts) return;
    for (int64_t e = 0; e < E; ++e) counts[e] += static_cast<uint64_t>(groups_.count(e));
  };
  // A decode step with several threads: two shared passes where the experts allow
  // (kernels_bench BM_GgmlMoeDecode, Qwen3-30B-A3B-shaped Q4_K experts over lanes, Zen 4 EPYC,
  // two threads, interleaved: 1.07-1.15x over a call per matrix; one thread 0.9-1.0x, so
  // one thread keeps the per-expert calls).
  if (T == 1 && threads > 1 && !observed && schedule_ == Schedule::kAuto) {
    kernels::group_by_expert(route_ids_.data(), route_w_.data(), T, k, E, groups_);
    if (run_one_token_shared(w, x, H, y)) {
      count_routed();
      return;
    }
  }
  if (!observed && (schedule_ == Schedule::kWorkItems || (schedule_ == Schedule::kAuto && worth))) {
    // The work items keep every active expert's input, hidden and output rows at once
    // (about T·k·(2H + I) floats): long batches go through in chunks of tokens, each
    // token's result being independent of the others in its batch.
    const int64_t chunk = work_item_chunk(w, H);
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t n = std::min(chunk, T - t0);
      kernels::group_by_expert(route_ids_.data() + t0 * k, route_w_.data() + t0 * k, n, k, E, groups_);
      count_routed();
      run_work_items(w, x + t0 * H, n, H, y + t0 * H, worth ? threads : 1);
    }
    return;
  }
  kernels::group_by_expert(route_ids_.data(), route_w_.data(), T, k, E, groups_);
  count_routed();
  run_per_expert(w, x, T, H, y);
}

int64_t MoeFfn::work_item_chunk(const MoeWeights& w, int64_t H) const {
  if (chunk_tokens_ > 0) return chunk_tokens_;
  constexpr int64_t kScratchBytes = int64_t{256} << 20;
  int64_t inter = 0;
  for (int64_t e = 0; e < static_cast<int64_t>(w.gate.size()) && inter == 0; ++e) {
    if (w.has_expert(e)) inter = w.gate[e].rows();
  }
  int64_t per_token = w.top_k * (2 * H + inter);
  if (!w.shared.empty()) per_token += H + w.shared.inter();
  per_token *= static_cast<int64_t>(sizeof(float));
  return std::max(kWorkItemMaxTokens, kScratchBytes / std::max<int64_t>(per_token, 1));
}

void MoeFfn::run_per_expert(const MoeWeights& w, const float* x, int64_t T, int64_t H, float* y) {
  std::fill(y, y + T * H, 0.0f);
  const ExpertObserver& observer = expert_observer();
  if (T == 1 && !observer && run_one_token(w, x, H, y)) {
    add_shared_expert(w, x, T, H, y);
    return;
  }
  for (int64_t e = 0; e < w.n_experts(); ++e) {
    const int64_t n = groups_.count(e);
    if (n == 0 || !w.has_expert(e)) continue;  // expert parallel: another rank computes it
    const int64_t I = w.gate[e].rows();
    const int32_t* rows = groups_.rows.data() + groups_.offsets[e];
    xg_.resize(static_cast<size_t>(n * H));
    gate_.resize(static_cast<size_t>(n * I));
    up_.resize(static_cast<size_t>(n * I));
    out_.resize(static_cast<size_t>(n * H));
    kernels::gather_rows(x, H, rows, n, xg_.data());
    if (observer) {
      observer(w.gate[e].name, e, xg_.data(), n, H);
      if (w.up[e].name != w.gate[e].name) observer(w.up[e].name, e, xg_.data(), n, H);
    }
    if (w.gate[e].quantized && w.up[e].quantized) {
      const kernels::QuantMatRef* ws[] = {&w.gate[e].quant, &w.up[e].quant};
      float* ys[] = {gate_.data(), up_.data()};
      kernels::qmatmul_multi(xg_.data(), n, ws, ys);  // one pass over gate and up
    } else {
      expert_matmul(xg_.data(), n, w.gate[e], gate_.data());
      expert_matmul(xg_.data(), n, w.up[e], up_.data());
    }
    kernels::silu_mul(gate_.data(), up_.data(), n * I);
    if (observer) observer(w.down[e].name, e, gate_.data(), n, I);
    expert_matmul(gate_.data(), n, w.down[e], out_.data());
    kernels::scatter_add_weighted(out_.data(), H, rows, groups_.weights.data() + groups_.offsets[e], n, y);
  }

  add_shared_expert(w, x, T, H, y);
}

bool MoeFfn::run_one_token(const MoeWeights& w, const float* x, int64_t H, float* y) {
  // One token: every active expert reads the same x, so the gate and up matrices of all of
  // them are one joint pass (x quantized once, one stream of panels). Quantized experts
  // only; the outputs are summed in expert order as below.
  std::vector<const kernels::QuantMatRef*>& mats = joint_mats_;
  std::vector<float*>& outs = joint_outs_;
  mats.clear();
  experts_.clear();
  int64_t inter_total = 0;
  for (int64_t e = 0; e < w.n_experts(); ++e) {
    if (groups_.count(e) == 0 || !w.has_expert(e)) continue;
    if (!w.gate[e].quantized || !w.up[e].quantized) return false;
    experts_.push_back(e);
    inter_total += w.gate[e].rows();
  }
  h_.resize(static_cast<size_t>(2 * inter_total));
  outs.clear();
  float* hp = h_.data();
  for (const int64_t e : experts_) {
    const int64_t I = w.gate[e].rows();
    mats.push_back(&w.gate[e].quant);
    mats.push_back(&w.up[e].quant);
    outs.push_back(hp);
    outs.push_back(hp + I);
    hp += 2 * I;
  }
  kernels::qmatmul_multi(x, 1, mats, outs);
  out_.resize(static_cast<size_t>(H));
  hp = h_.data();
  for (const int64_t e : experts_) {
    const int64_t I = w.gate[e].rows();
    kernels::silu_mul(hp, hp + I, I);
    expert_matmul(hp, 1, w.down[e], out_.data());
    const int32_t row = 0;
    kernels::scatter_add_weighted(out_.data(), H, &row, groups_.weights.data() + groups_.offsets[e], 1, y);
    hp += 2 * I;
  }
  return true;
}

bool MoeFfn::run_one_token_shared(const MoeWeights& w, const float* x, int64_t H, float* y) {
  const auto shares = [](const kernels::LinearWeight& m) { return !m.quantized && kernels::matvec_shares(m.dense); };
  const bool shared = !w.shared.empty();
  if (shared && (!shares(w.shared.gate) || !shares(w.shared.up) || !shares(w.shared.down))) return false;
  // The active experts in order, then the shared expert (its weight: the sigmoid gate, or 1).
  active_.clear();
  int64_t inter_total = 0;
  for (int64_t e = 0; e < w.n_experts(); ++e) {
    if (groups_.count(e) == 0 || !w.has_expert(e)) continue;  // expert parallel: another rank computes it
    if (!shares(w.gate[e]) || !shares(w.up[e]) || !shares(w.down[e])) return false;
    active_.push_back({&w.gate[e], &w.up[e], &w.down[e], nullptr, groups_.weights.data() + groups_.offsets[e], 1,
                       w.gate[e].rows(), x, nullptr, nullptr});
    inter_total += w.gate[e].rows();
  }
  if (shared) {
    sgate_.assign(1, 1.0f);  // ungated (DeepSeek)
    if (w.shared_gate.data != nullptr) {
      kernels::matmul(x, 1, w.shared_gate, sgate_.data());
      sgate_[0] = 1.0f / (1.0f + std::exp(-sgate_[0]));
    }
    active_.push_back({&w.shared.gate, &w.shared.up, &w.shared.down, nullptr, sgate_.data(), 1, w.shared.inter(), x,
                       nullptr, nullptr});
    inter_total += w.shared.inter();
  }
  std::fill(y, y + H, 0.0f);
  if (active_.empty()) return true;
  h_.resize(static_cast<size_t>(2 * inter_total));
  out_.resize(active_.size() * static_cast<size_t>(H));
  float* hp = h_.data();
  float* op = out_.data();
  for (Active& A : active_) {  // h: gate x | up x
    A.h = hp;
    A.out = op;
    hp += 2 * A.inter;
    op += H;
  }
  steps_.clear();
  for (const Active& A : active_) {
    steps_.push_back({x, &A.gate->dense, A.h});
    steps_.push_back({x, &A.up->dense, A.h + A.inter});
  }
  kernels::matvec_many(steps_);
  steps_.clear();
  for (const Active& A : active_) {
    kernels::silu_mul(A.h, A.h + A.inter, A.inter);
    steps_.push_back({A.h, &A.down->dense, A.out});
  }
  kernels::matvec_many(steps_);
  for (const Active& A : active_) {
    const float wt = A.weights[0];
    for (int64_t c = 0; c < H; ++c) y[c] += wt * A.out[c];
  }
  return true;
}

void MoeFfn::add_shared_expert(const MoeWeights& w, const float* x, int64_t T, int64_t H, float* y) {
  if (w.shared.empty()) return;
  shared_.resize(static_cast<size_t>(T * H));
  sgate_.resize(static_cast<size_t>(T));
  swiglu(w.shared, x, T, shared_.data(), gate_);
  const bool gated = w.shared_gate.data != nullptr;
  if (gated) kernels::matmul(x, T, w.shared_gate, sgate_.data());
  for (int64_t t = 0; t < T; ++t) {
    const float s = gated ? 1.0f / (1.0f + std::exp(-sgate_[t])) : 1.0f;
    float* yt = y + t * H;
    const float* st = shared_.data() + t * H;
    for (int64_t i = 0; i < H; ++i) yt[i] += s * st[i];
  }
}

void MoeFfn::run_work_items(const MoeWeights& w, const float* x, int64_t T, int64_t H, float* y, int threads) {
  const int64_t E = w.n_experts();
  // Inputs, hidden and output buffers of the active experts (the shared expert last, on
  // every token).
  int64_t x_floats = 0, h_floats = 0, rows = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (groups_.count(e) == 0 || !w.has_expert(e)) continue;
    x_floats += groups_.count(e) * H;
    h_floats += groups_.count(e) * w.gate[e].rows();
    rows += groups_.count(e);
  }
  if (!w.shared.empty()) {
    h_floats += T * w.shared.inter();
    rows += T;
  }
  xg_.resize(static_cast<size_t>(x_floats));
  h_.resize(static_cast<size_t>(h_floats));
  out_.resize(static_cast<size_t>(rows * H));
  active_.clear();
  float* xp = xg_.data();
  float* hp = h_.data();
  float* op = out_.data();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = groups_.count(e);
    if (n == 0 || !w.has_expert(e)) continue;  // expert parallel: another rank computes it
    const int32_t* rows_e = groups_.rows.data() + groups_.offsets[e];
    kernels::gather_rows(x, H, rows_e, n, xp);
    active_.push_back({&w.gate[e], &w.up[e], &w.down[e], rows_e, groups_.weights.data() + groups_.offsets[e], n,
                       w.gate[e].rows(), xp, hp, op});
    xp += n * H;
    hp += n * w.gate[e].rows();
    op += n * H;
  }
  if (!w.shared.empty()) {
    sgate_.resize(static_cast<size_t>(T));
    if (w.shared_gate.data != nullptr) {
      kernels::matmul(x, T, w.shared_gate, sgate_.data());
      for (int64_t t = 0; t < T; ++t) sgate_[t] = 1.0f / (1.0f + std::exp(-sgate_[t]));
    } else {
      std::fill(sgate_.begin(), sgate_.end(), 1.0f);  // ungated (DeepSeek)
    }
    all_rows_.resize(static_cast<size_t>(T));
    std::iota(all_rows_.begin(), all_rows_.end(), 0);
    active_.push_back({&w.shared.gate, &w.shared.up, &w.shared.down, all_rows_.data(), sgate_.data(), T,
                       w.shared.inter(), x, hp, op});
  }
  std::fill(y, y + T * H, 0.0f);
  if (active_.empty()) return;

  // Item sizes: about kItemsPerThread items per thread over all experts, so dynamic
  // scheduling evens out a thread that loses its core, but no smaller than 16 rows: every
  // item is one kernel call (argument checks, activation quantization of its input), and
  // fewer, larger calls keep that overhead to a few percent.
  constexpr int64_t kItemsPerThread = 8;  // measured best of 2, 4, 8, 16 (16-core Xeon, W4A8, 2 and 4 threads)
  const int64_t per_item = kItemsPerThread * std::max(threads, 1);
  auto item_rows = [per_item](int64_t total_rows, int64_t limit) {
    const int64_t r = (total_rows + per_item - 1) / per_item;
    // Multiples of 16 rows: a repacked expert's panels (kernels/quant.h), so every item
    // computes from the packed copy (linear_row_slice keeps it only on panel boundaries).
    constexpr int64_t P = kernels::kPanelRows;
    return std::min(limit, std::max<int64_t>(P, (r + P - 1) / P * P));
  };
  int64_t inter_rows = 0;
  for (const Active& A : active_) inter_rows += A.inter;
  // Phase 1: (expert, block of gate/up rows) -> h = silu(gate x) * up x.
  // Phase 2: (expert, block of down rows) -> the expert's output columns.
  items_.clear();
  for (size_t a = 0; a < active_.size(); ++a) {
    const int64_t step = item_rows(inter_rows, active_[a].inter);
    for (int64_t r0 = 0; r0 < active_[a].inter; r0 += step)
      items_.push_back({static_cast<int32_t>(a), r0, std::min(active_[a].inter, r0 + step)});
  }
  const size_t phase2 = items_.size();
  const int64_t down_step = item_rows(static_cast<int64_t>(active_.size()) * H, H);
  for (size_t a = 0; a < active_.size(); ++a) {
    for (int64_t c0 = 0; c0 < H; c0 += down_step)
      items_.push_back({static_cast<int32_t>(a), c0, std::min(H, c0 + down_step)});
  }
  const int64_t n1 = static_cast<int64_t>(phase2), n2 = static_cast<int64_t>(items_.size() - phase2);
  // Phase 3: y = Σ_a weight * out_a in expert order, by column blocks.
  const int64_t sum_step = std::max<int64_t>(64, (H + 4 * threads - 1) / (4 * threads));
  const int64_t n3 = (H + sum_step - 1) / sum_step;

#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    // Per-thread scratch: grows to the largest item once, then reused.
    static thread_local std::vector<float> tmp;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n1; ++i) {
      const Item& it = items_[i];
      const Active& A = active_[it.active];
      const int64_t nr = it.end - it.begin;
      tmp.resize(static_cast<size_t>(2 * A.n * nr));
      float* g = tmp.data();
      float* u = g + A.n * nr;
      expert_matmul_rows(A.x, A.n, *A.gate, it.begin, it.end, g);
      expert_matmul_rows(A.x, A.n, *A.up, it.begin, it.end, u);
      kernels::silu_mul(g, u, A.n * nr);
      for (int64_t t = 0; t < A.n; ++t) std::memcpy(A.h + t * A.inter + it.begin, g + t * nr, nr * sizeof(float));
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n2; ++i) {
      const Item& it = items_[phase2 + i];
      const Active& A = active_[it.active];
      const int64_t nc = it.end - it.begin;
      if (A.n == 1) {
        expert_matmul_rows(A.h, 1, *A.down, it.begin, it.end, A.out + it.begin);
        continue;
      }
      tmp.resize(static_cast<size_t>(A.n * nc));
      expert_matmul_rows(A.h, A.n, *A.down, it.begin, it.end, tmp.data());
      for (int64_t t = 0; t < A.n; ++t) std::memcpy(A.out + t * H + it.begin, tmp.data() + t * nc, nc * sizeof(float));
    }
#pragma omp for schedule(static)
    for (int64_t b = 0; b < n3; ++b) {
      const int64_t c0 = b * sum_step, c1 = std::min(H, c0 + sum_step);
      for (const Active& A : active_) {
        for (int64_t t = 0; t < A.n; ++t) {
          float* dst = y + static_cast<int64_t>(A.rows[t]) * H;
          const float* src = A.out + t * H;
          const float wt = A.weights[t];
          for (int64_t c = c0; c < c1; ++c) dst[c] += wt * src[c];
        }
      }
    }
  }
}

// ---- Gated DeltaNet ----

GdnDims gdn_dims(const ModelConfig& cfg) {
  GdnDims d;
  d.n_k_heads = cfg.linear_num_key_heads;
  d.n_v_heads = cfg.linear_num_value_heads;
  d.dk = cfg.linear_key_head_dim;
  d.dv = cfg.linear_value_head_dim;
  d.kernel = cfg.linear_conv_kernel_dim;
  return d;
}

int64_t GdnWeights::weight_bytes() const {
  int64_t b = 0;
  for (const LinearWeight* m : {&in_qkv, &in_z, &in_a, &in_b, &in_qkvz, &in_ba, &out}) b += m->bytes();
  return b;
}

namespace {

// A Qwen3-Next fused projection: a missing or mis-shaped one gets an error that also
// spells out the layout the loader expects.
LinearWeight fused_projection(const ModelWeights& weights, int layer, const char* slot, const std::string& layout) {
  try {
    return weights.linear(layer, slot);
  } catch (const Error& e) {
    const TensorSpec& t = weights.spec(layer, slot);
    const size_t at = t.name.rfind("linear_attn.");
    fail("{} (the qwen3_next layout: {} is [{}, {}], {})", e.what(),
         at == std::string::npos ? t.name : t.name.substr(at), t.shape[0], t.shape[1], layout);
  }
}

// Qwen3-Next projected rows -> the Qwen3.5 layout the rest of the layer uses.
// qkvz: [T, Hk (2 dk + 2 r dv)], ba: [T, 2 Hv] (per key-head group, see GdnWeights);
// mixed: [T, conv_dim] = q (all heads) | k | v, z: [T, Hv dv], b, a: [T, Hv].
void deinterleave_fused(const float* qkvz, const float* ba, int64_t T, const GdnDims& d, float* mixed, float* z,
                        float* b, float* a) {
  const int64_t Hk = d.n_k_heads, dk = d.dk, r = d.n_v_heads / d.n_k_heads, rv = r * d.dv;
  const int64_t KD = d.key_dim(), VD = d.value_dim(), C = d.conv_dim(), Hv = d.n_v_heads;
  const int64_t group = 2 * dk + 2 * rv, row = Hk * group;
  for (int64_t t = 0; t < T; ++t) {
    const float* src = qkvz + t * row;
    float* m = mixed + t * C;
    for (int64_t g = 0; g < Hk; ++g) {
      const float* s = src + g * group;
      std::memcpy(m + g * dk, s, dk * sizeof(float));
      std::memcpy(m + KD + g * dk, s + dk, dk * sizeof(float));
      std::memcpy(m + 2 * KD + g * rv, s + 2 * dk, rv * sizeof(float));
      std::memcpy(z + t * VD + g * rv, s + 2 * dk + rv, rv * sizeof(float));
      std::memcpy(b + t * Hv + g * r, ba + t * 2 * Hv + g * 2 * r, r * sizeof(float));
      std::memcpy(a + t * Hv + g * r, ba + t * 2 * Hv + g * 2 * r + r, r * sizeof(float));
    }
  }
}

// Value heads between llama.cpp's tiled order and Hugging Face's grouped one, in place, in each
// of T rows of `stride` floats: Hv heads of `width` floats from `offset` on (grouped head j is
// tiled head tiled_value_head(j)); to_grouped moves tiled rows to grouped ones, else the other
// way. scratch: [Hv width].
void move_value_heads(float* x, int64_t T, int64_t stride, int64_t offset, const GdnDims& d, int64_t width,
                      bool to_grouped, std::vector<float>& scratch) {
  const int64_t hk = d.n_k_heads, hv = d.n_v_heads;
  scratch.resize(static_cast<size_t>(hv * width));
  for (int64_t t = 0; t < T; ++t) {
    float* heads = x + t * stride + offset;
    std::copy(heads, heads + hv * width, scratch.begin());
    for (int64_t j = 0; j < hv; ++j) {
      const int64_t tiled = tiled_value_head(j, hk, hv);
      const float* from = scratch.data() + (to_grouped ? tiled : j) * width;
      std::copy(from, from + width, heads + (to_grouped ? j : tiled) * width);
    }
  }
}

}  // namespace

GdnWeights bind_gdn(const ModelWeights& weights, int layer, const GdnDims& d) {
  GdnWeights w;
  const int64_t C = d.conv_dim(), Hv = d.n_v_heads;
  if (weights.find(layer, "gdn_qkvz")) {
    const int64_t r = d.n_v_heads / d.n_k_heads;
    w.in_qkvz = fused_projection(weights, layer, "gdn_qkvz",
                                 fmt::format("{} key-head groups of rows [q {} | k {} | v {}x{} | z {}x{}]",
                                             d.n_k_heads, d.dk, d.dk, r, d.dv, r, d.dv));
    w.in_ba = fused_projection(weights, layer, "gdn_ba",
                               fmt::format("{} key-head groups of rows [b {} | a {}]", d.n_k_heads, r, r));
  } else {
    w.in_qkv = weights.linear(layer, "gdn_qkv");
    w.in_z = weights.linear(layer, "gdn_z");
    w.in_b = weights.linear(layer, "gdn_b");
    w.in_a = weights.linear(layer, "gdn_a");
  }
  w.out = weights.linear(layer, "gdn_out");
  w.conv_w = weights.vector(layer, "gdn_conv1d");  // [conv_dim, 1, kernel]
  INFERA_ASSERT(static_cast<int64_t>(w.conv_w.size()) == C * d.kernel, "GDN conv1d size");
  const std::vector<float> a_log = weights.vector(layer, "gdn_a_log");
  w.neg_exp_a.resize(Hv);
  for (int64_t h = 0; h < Hv; ++h) w.neg_exp_a[h] = -std::exp(a_log[h]);
  w.dt_bias = weights.vector(layer, "gdn_dt_bias");
  w.norm = weights.vector(layer, "gdn_norm");
  w.value_heads_tiled = weights.config().gdn_value_heads_tiled && !w.fused();
  return w;
}

void GdnLayer::forward(const GdnWeights& w, const GdnDims& d, const ForwardBatch& batch, const float* x, int64_t H,
                       const std::vector<float*>& states, float eps, float* y, const std::vector<float*>& token_states,
                       int64_t token_state_stride) {
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t C = d.conv_dim(), KD = d.key_dim(), VD = d.value_dim(), Hv = d.n_v_heads;
  mixed_.resize(static_cast<size_t>(T * C));
  z_.resize(static_cast<size_t>(T * VD));
  a_.resize(static_cast<size_t>(T * Hv));
  b_.resize(static_cast<size_t>(T * Hv));
  g_.resize(static_cast<size_t>(T * Hv));
  beta_.resize(static_cast<size_t>(T * Hv));
  q_.resize(static_cast<size_t>(T * KD));
  k_.resize(static_cast<size_t>(T * KD));
  v_.resize(static_cast<size_t>(T * VD));
  o_.resize(static_cast<size_t>(T * VD));

  if (w.fused()) {
    // One matmul per fused projection, then the rows are put in the split layout.
    qkvz_.resize(static_cast<size_t>(T * (C + VD)));
    ba_.resize(static_cast<size_t>(T * 2 * Hv));
    const LinearWeight* ws[] = {&w.in_qkvz, &w.in_ba};
    float* ys[] = {qkvz_.data(), ba_.data()};
    kernels::linear_multi(x, T, ws, ys);
    deinterleave_fused(qkvz_.data(), ba_.data(), T, d, mixed_.data(), z_.data(), b_.data(), a_.data());
  } else {
    const LinearWeight* ws[] = {&w.in_qkv, &w.in_z, &w.in_b, &w.in_a};
    float* ys[] = {mixed_.data(), z_.data(), b_.data(), a_.data()};
    kernels::linear_multi(x, T, ws, ys);
    if (w.value_heads_tiled) {  // a Qwen3.5 GGUF's projections as stored: the value heads grouped
      move_value_heads(mixed_.data(), T, C, 2 * KD, d, d.dv, true, heads_);
      move_value_heads(z_.data(), T, VD, 0, d, d.dv, true, heads_);
      move_value_heads(b_.data(), T, Hv, 0, d, 1, true, heads_);
      move_value_heads(a_.data(), T, Hv, 0, d, 1, true, heads_);
    }
  }
  kernels::gdn_gates(a_.data(), b_.data(), T, Hv, w.neg_exp_a.data(), w.dt_bias.data(), g_.data(), beta_.data());

  INFERA_ASSERT(states.size() == batch.seqs.size(), "one recurrent state per sequence chunk");
  INFERA_ASSERT(token_states.empty() || token_states.size() == batch.seqs.size(), "one token-state pointer per chunk");
  const int64_t conv_floats = d.conv_state_floats(), hist = d.kernel - 1;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqChunk& s = batch.seqs[i];
    float* conv_state = states[i];
    float* ssm_state = conv_state + conv_floats;
    if (s.pos0 == 0) {
      std::fill(conv_state, conv_state + conv_floats + d.ssm_state_floats(), 0.0f);
    }
    float* snaps = token_states.empty() ? nullptr : token_states[i];
    INFERA_ASSERT(snaps == nullptr || s.token_states != nullptr, "token states for a chunk that does not keep them");
    float* m = mixed_.data() + static_cast<int64_t>(s.token_begin) * C;
    if (snaps != nullptr) {
      // The conv state after token t is the last kernel-1 rows of [state ; inputs 0..t]:
      // keep that window before the conv overwrites its inputs.
      window_.resize(static_cast<size_t>((hist + s.n_tokens) * C));
      std::memcpy(window_.data(), conv_state, conv_floats * sizeof(float));
      std::memcpy(window_.data() + conv_floats, m, s.n_tokens * C * sizeof(float));
      for (int32_t t = 0; t + 1 < s.n_tokens; ++t) {
        std::memcpy(snaps + t * token_state_stride, window_.data() + (t + 1) * C, conv_floats * sizeof(float));
      }
    }
    kernels::causal_conv1d_silu(m, s.n_tokens, C, w.conv_w.data(), d.kernel, conv_state);
    for (int32_t t = 0; t < s.n_tokens; ++t) {
      const int64_t row = s.token_begin + t;
      const float* mt = mixed_.data() + row * C;
      std::memcpy(q_.data() + row * KD, mt, KD * sizeof(float));
      std::memcpy(k_.data() + row * KD, mt + KD, KD * sizeof(float));
      std::memcpy(v_.data() + row * VD, mt + 2 * KD, VD * sizeof(float));
    }
    const int64_t tb = s.token_begin;
    kernels::l2norm_rows(q_.data() + tb * KD, s.n_tokens * d.n_k_heads, d.dk, 1e-6f,
                         1.0f / std::sqrt(static_cast<float>(d.dk)));
    kernels::l2norm_rows(k_.data() + tb * KD, s.n_tokens * d.n_k_heads, d.dk, 1e-6f);
    const auto shape = d.delta_shape();
    if (snaps != nullptr) {
      // One decode step per token (T is a handful of verified drafts), the state copied
      // out after each but the last (the last is the slot's own state).
      for (int32_t t = 0; t < s.n_tokens; ++t) {
        const int64_t row = tb + t;
        kernels::gated_delta_rule_recurrent(q_.data() + row * KD, k_.data() + row * KD, v_.data() + row * VD,
                                            g_.data() + row * Hv, beta_.data() + row * Hv, 1, shape, ssm_state,
                                            o_.data() + row * VD);
        if (t + 1 < s.n_tokens) {
          std::memcpy(snaps + t * token_state_stride + conv_floats, ssm_state, d.ssm_state_floats() * sizeof(float));
        }
      }
    } else if (s.n_tokens == 1) {
      kernels::gated_delta_rule_recurrent(q_.data() + tb * KD, k_.data() + tb * KD, v_.data() + tb * VD,
                                          g_.data() + tb * Hv, beta_.data() + tb * Hv, s.n_tokens, shape, ssm_state,
                                          o_.data() + tb * VD);
    } else {
      kernels::gated_delta_rule_chunked(q_.data() + tb * KD, k_.data() + tb * KD, v_.data() + tb * VD,
                                        g_.data() + tb * Hv, beta_.data() + tb * Hv, s.n_tokens, shape, ssm_state,
                                        o_.data() + tb * VD);
    }
  }
  kernels::rmsnorm_gated(o_.data(), z_.data(), w.norm.data(), T * Hv, d.dv, eps);
  if (w.value_heads_tiled) move_value_heads(o_.data(), T, VD, 0, d, d.dv, false, heads_);  // out's columns: tiled
  kernels::linear(o_.data(), T, w.out, y);
}

}  // namespace infera
