#include "infera/model/blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "infera/base/error.h"
#include "infera/model/weights.h"

namespace infera {

using kernels::MatRef;

// ---- attention ----

void batch_positions(const ForwardBatch& batch, std::vector<int32_t>& positions) {
  positions.resize(batch.tokens.size());
  for (const SeqChunk& s : batch.seqs) {
    for (int32_t i = 0; i < s.n_tokens; ++i) positions[s.token_begin + i] = s.pos0 + i;
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

SwigluWeights load_swiglu(const WeightStore& store, const std::string& prefix, int64_t hidden, int64_t inter) {
  SwigluWeights w;
  w.gate = as_matrix(store.get(prefix + "gate_proj.weight", {inter, hidden}));
  w.up = as_matrix(store.get(prefix + "up_proj.weight", {inter, hidden}));
  w.down = as_matrix(store.get(prefix + "down_proj.weight", {hidden, inter}));
  return w;
}

void swiglu(const SwigluWeights& w, const float* x, int64_t T, float* y, std::vector<float>& scratch) {
  const int64_t F = w.inter();
  scratch.resize(static_cast<size_t>(2 * T * F));
  float* gate = scratch.data();
  float* up = gate + T * F;
  kernels::matmul(x, T, w.gate, gate);
  kernels::matmul(x, T, w.up, up);
  kernels::silu_mul(gate, up, T * F);
  kernels::matmul(gate, T, w.down, y);
}

// ---- MoE ----

namespace {

// Expert e of a fused [E, rows, cols] tensor, rows [r0, r1), as a matrix.
MatRef expert_slice(const TensorInfo& t, int64_t e, int64_t r0, int64_t r1) {
  const int64_t rows = t.shape[1], cols = t.shape[2];
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    fail("{}: tensor '{}' has dtype {}; expert weights must be f32, bf16 or f16", t.file, t.name, dtype_name(t.dtype));
  }
  const size_t esize = dtype_size(t.dtype);
  const uint8_t* base = t.data + static_cast<size_t>((e * rows + r0) * cols) * esize;
  return MatRef{base, t.dtype, r1 - r0, cols};
}

}  // namespace

int64_t MoeWeights::weight_bytes_active() const {
  int64_t bytes = matrix_bytes(router);
  if (!gate.empty()) bytes += top_k * (matrix_bytes(gate[0]) + matrix_bytes(up[0]) + matrix_bytes(down[0]));
  if (!shared.empty()) {
    bytes += matrix_bytes(shared.gate) + matrix_bytes(shared.up) + matrix_bytes(shared.down) + matrix_bytes(shared_gate);
  }
  return bytes;
}

MoeWeights load_moe(const WeightStore& store, const std::string& prefix, const ModelConfig& cfg, int64_t shared_inter) {
  const int64_t E = cfg.num_experts, H = cfg.hidden_size, I = cfg.moe_intermediate_size;
  MoeWeights w;
  w.top_k = cfg.num_experts_per_tok;
  w.norm_topk_prob = cfg.norm_topk_prob;
  w.router = as_matrix(store.get(prefix + "gate.weight", {E, H}));
  w.gate.resize(E);
  w.up.resize(E);
  w.down.resize(E);
  if (const TensorInfo* gate_up = store.find(prefix + "experts.gate_up_proj")) {
    check_shape(*gate_up, {E, 2 * I, H}, store.dir() + "/" + gate_up->file);
    const TensorInfo& down = store.get(prefix + "experts.down_proj", {E, H, I});
    for (int64_t e = 0; e < E; ++e) {
      w.gate[e] = expert_slice(*gate_up, e, 0, I);
      w.up[e] = expert_slice(*gate_up, e, I, 2 * I);
      w.down[e] = expert_slice(down, e, 0, H);
    }
  } else {
    for (int64_t e = 0; e < E; ++e) {
      const SwigluWeights x = load_swiglu(store, prefix + "experts." + std::to_string(e) + ".", H, I);
      w.gate[e] = x.gate;
      w.up[e] = x.up;
      w.down[e] = x.down;
    }
  }
  if (shared_inter > 0) {
    w.shared = load_swiglu(store, prefix + "shared_expert.", H, shared_inter);
    w.shared_gate = as_matrix(store.get(prefix + "shared_expert_gate.weight", {1, H}));
  }
  return w;
}

void MoeFfn::forward(const MoeWeights& w, const float* x, int64_t T, int64_t H, float* y, uint64_t* counts) {
  const int64_t E = w.n_experts(), k = w.top_k;
  logits_.resize(static_cast<size_t>(T * E));
  route_ids_.resize(static_cast<size_t>(T * k));
  route_w_.resize(static_cast<size_t>(T * k));
  kernels::matmul(x, T, w.router, logits_.data());
  kernels::moe_route_softmax(logits_.data(), T, E, k, w.norm_topk_prob, route_ids_.data(), route_w_.data());
  kernels::group_by_expert(route_ids_.data(), route_w_.data(), T, k, E, groups_);

  std::fill(y, y + T * H, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = groups_.count(e);
    if (n == 0) continue;
    if (counts) counts[e] += static_cast<uint64_t>(n);
    if (w.gate[e].data == nullptr) continue;  // expert parallel: another rank computes this expert
    const int64_t I = w.gate[e].rows;
    const int32_t* rows = groups_.rows.data() + groups_.offsets[e];
    xg_.resize(static_cast<size_t>(n * H));
    gate_.resize(static_cast<size_t>(n * I));
    up_.resize(static_cast<size_t>(n * I));
    out_.resize(static_cast<size_t>(n * H));
    kernels::gather_rows(x, H, rows, n, xg_.data());
    kernels::matmul(xg_.data(), n, w.gate[e], gate_.data());
    kernels::matmul(xg_.data(), n, w.up[e], up_.data());
    kernels::silu_mul(gate_.data(), up_.data(), n * I);
    kernels::matmul(gate_.data(), n, w.down[e], out_.data());
    kernels::scatter_add_weighted(out_.data(), H, rows, groups_.weights.data() + groups_.offsets[e], n, y);
  }

  if (!w.shared.empty()) {
    shared_.resize(static_cast<size_t>(T * H));
    sgate_.resize(static_cast<size_t>(T));
    swiglu(w.shared, x, T, shared_.data(), gate_);
    kernels::matmul(x, T, w.shared_gate, sgate_.data());
    for (int64_t t = 0; t < T; ++t) {
      const float s = 1.0f / (1.0f + std::exp(-sgate_[t]));
      float* yt = y + t * H;
      const float* st = shared_.data() + t * H;
      for (int64_t i = 0; i < H; ++i) yt[i] += s * st[i];
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
  int64_t b = matrix_bytes(out);
  for (const MatRef* m : {&in_qkv, &in_z, &in_a, &in_b, &in_qkvz, &in_ba}) {
    if (m->data) b += matrix_bytes(*m);
  }
  return b;
}

namespace {

// A Qwen3-Next fused projection: a missing or mis-shaped one gets an error that also
// spells out the layout the loader expects.
MatRef fused_projection(const WeightStore& store, const std::string& prefix, const std::string& name, int64_t rows,
                        int64_t hidden, const std::string& layout) {
  try {
    return as_matrix(store.get(prefix + name, {rows, hidden}));
  } catch (const Error& e) {
    fail("{} (the qwen3_next layout: linear_attn.{} is [{}, {}], {})", e.what(), name, rows, hidden, layout);
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

}  // namespace

GdnWeights load_gdn(const WeightStore& store, const std::string& prefix, const GdnDims& d, int64_t hidden,
                    GdnLayout layout) {
  GdnWeights w;
  const int64_t C = d.conv_dim(), Hv = d.n_v_heads;
  if (layout == GdnLayout::kFused) {
    const int64_t r = d.n_v_heads / d.n_k_heads;
    w.in_qkvz = fused_projection(store, prefix, "in_proj_qkvz.weight", C + d.value_dim(), hidden,
                                 fmt::format("{} key-head groups of rows [q {} | k {} | v {}x{} | z {}x{}]",
                                             d.n_k_heads, d.dk, d.dk, r, d.dv, r, d.dv));
    w.in_ba = fused_projection(store, prefix, "in_proj_ba.weight", 2 * Hv, hidden,
                               fmt::format("{} key-head groups of rows [b {} | a {}]", d.n_k_heads, r, r));
  } else {
    w.in_qkv = as_matrix(store.get(prefix + "in_proj_qkv.weight", {C, hidden}));
    w.in_z = as_matrix(store.get(prefix + "in_proj_z.weight", {d.value_dim(), hidden}));
    w.in_b = as_matrix(store.get(prefix + "in_proj_b.weight", {Hv, hidden}));
    w.in_a = as_matrix(store.get(prefix + "in_proj_a.weight", {Hv, hidden}));
  }
  w.out = as_matrix(store.get(prefix + "out_proj.weight", {hidden, d.value_dim()}));
  const TensorInfo& conv = store.get(prefix + "conv1d.weight", {C, 1, d.kernel});
  w.conv_w.resize(static_cast<size_t>(C * d.kernel));
  to_f32(conv.data, conv.dtype, C * d.kernel, w.conv_w.data());
  const std::vector<float> a_log = load_vector(store, prefix + "A_log", Hv);
  w.neg_exp_a.resize(Hv);
  for (int64_t h = 0; h < Hv; ++h) w.neg_exp_a[h] = -std::exp(a_log[h]);
  w.dt_bias = load_vector(store, prefix + "dt_bias", Hv);
  w.norm = load_vector(store, prefix + "norm.weight", d.dv);
  return w;
}

void GdnLayer::forward(const GdnWeights& w, const GdnDims& d, const ForwardBatch& batch, const float* x, int64_t H,
                       const std::vector<float*>& states, float eps, float* y) {
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
    kernels::matmul(x, T, w.in_qkvz, qkvz_.data());
    kernels::matmul(x, T, w.in_ba, ba_.data());
    deinterleave_fused(qkvz_.data(), ba_.data(), T, d, mixed_.data(), z_.data(), b_.data(), a_.data());
  } else {
    kernels::matmul(x, T, w.in_qkv, mixed_.data());
    kernels::matmul(x, T, w.in_z, z_.data());
    kernels::matmul(x, T, w.in_b, b_.data());
    kernels::matmul(x, T, w.in_a, a_.data());
  }
  kernels::gdn_gates(a_.data(), b_.data(), T, Hv, w.neg_exp_a.data(), w.dt_bias.data(), g_.data(), beta_.data());

  INFERA_ASSERT(states.size() == batch.seqs.size(), "one recurrent state per sequence chunk");
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqChunk& s = batch.seqs[i];
    float* conv_state = states[i];
    float* ssm_state = conv_state + d.conv_state_floats();
    if (s.pos0 == 0) {
      std::fill(conv_state, conv_state + d.conv_state_floats() + d.ssm_state_floats(), 0.0f);
    }
    float* m = mixed_.data() + static_cast<int64_t>(s.token_begin) * C;
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
    if (s.n_tokens == 1) {
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
  kernels::matmul(o_.data(), T, w.out, y);
}

}  // namespace infera
