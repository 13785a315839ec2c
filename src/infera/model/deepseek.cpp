// DeepSeek-V3 (deepseek_v3; Kimi-K2-style checkpoints declare the same architecture) and
// DeepSeek-V3.2 (deepseek_v32: V3 plus the lightning indexer, sparse attention):
// multi-head latent attention (MLA) with a compressed KV cache, a group-limited sigmoid
// mixture of experts with shared experts, dense first layers, and the multi-token
// prediction layer (model.layers.{num_hidden_layers}) as an MTP head. ARCHITECTURES.md
// section 5.
//
//   x = embed(t)
//   per layer: a = rms(x)
//     c_q = rms(W_qa a) (q_lora_rank > 0), q = W_qb c_q  |  q = W_q a;  q_h = [q_nope | q_pe]
//     [c_kv | k_pe] = W_kva a;  c_kv = rms(c_kv);  q_pe, k_pe = rope_interleaved(YaRN)
//     cache [c_kv | k_pe] (kv_lora_rank + qk_rope_head_dim values per token and layer)
//     naive:    [k_nope | v]_h = W_kvb,h c_kv;  o_h = Σ softmax((q_nope·k_nope + q_pe·k_pe) s) v
//     absorbed: q̃_h = W_UK,hᵀ q_nope;  o_h = W_UV,h Σ softmax((q̃·c_kv + q_pe·k_pe) s) c_kv
//     x += W_o concat(o_h)
//     m = rms(x);  x += dense SwiGLU (layers < first_k_dense_replace) or
//                  Σ_j w_j Expert_j(m) + Shared(m), sigmoid scores, group-limited top-k
//   logits = lm_head(rms(x))
// s = mscale² / sqrt(qk_nope + qk_rope), mscale = 0.1 mscale_all_dim ln(factor) + 1 under
// YaRN with mscale_all_dim (else 1).
//
// V3.2: per layer the lightning indexer scores every earlier position for each query,
//   q_I = W_Iq c_q [heads, dim], k_I = LayerNorm(W_Ik a), both rotated NeoX-style on their
//   first qk_rope_head_dim dims; I(t, s) = Σ_h w_h ReLU(q_I,h · k_I,s), w = W_Iw a / sqrt(heads dim)
// and the query attends (absorbed form) only to its index_topk best positions; with at most
// index_topk positions of context, all of them: dense MLA. The indexer key is cached in
// the latent row, after k_pe.
//
// The latent cache lives in the paged KvPool as one KV head of (R + P + 1) / 2 values, K
// half then V half (sequence_geometry; kernels/mla.h), in f32, bf16 or int8. Per chunk,
// the form is chosen by cost (INFERA_MLA_FORM forces one): absorbed for decode and short
// chunks, naive when expanding kv_b_proj over the context costs less than absorbing it
// into every query.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "infera/base/error.h"
#include "infera/base/options.h"
#include "infera/io/safetensors.h"
#include "infera/kernels/kernels.h"
#include "infera/kernels/mla.h"
#include "infera/kernels/quant.h"
#include "infera/model/arch_registry.h"
#include "infera/model/blocks.h"
#include "infera/model/model.h"
#include "infera/model/quantized_weights.h"
#include "infera/model/rope.h"
#include "infera/model/tensor_dump.h"
#include "infera/model/tensor_parallel.h"
#include "infera/model/weights.h"

namespace infera {
namespace {

using kernels::LinearWeight;

// LayerNorm in place (the indexer's key norm, eps 1e-6 as torch.nn.LayerNorm's DeepSeek use).
void layer_norm(float* x, const float* w, const float* b, int64_t n) {
  double mean = 0.0, var = 0.0;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<double>(n);
  const double inv = 1.0 / std::sqrt(var + 1e-6);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((x[i] - mean) * inv) * w[i] + b[i];
}

enum class MlaForm { kAuto, kAbsorbed, kNaive };

MlaForm mla_form_from_env() {
  const std::string s = option_env("mla_form");
  if (s == "absorbed") return MlaForm::kAbsorbed;
  if (s == "naive") return MlaForm::kNaive;
  return MlaForm::kAuto;
}

struct MlaWeights {
  LinearWeight q_a, q_b;  // q_lora_rank > 0: [qr, H], [nh * qk, qr]
  std::vector<float> q_a_norm;  // [qr]
  LinearWeight q;  // q_lora_rank == 0: [nh * qk, H]
  LinearWeight kv_a;  // [R + P, H]
  std::vector<float> kv_a_norm;  // [R]
  std::vector<float> kv_b;  // [nh * (nope + V), R] f32 (this rank's heads): per head k_nope rows, then v rows
  LinearWeight o;  // [H, nh * V]
  // DeepSeek-V3.2 lightning indexer (index_n_heads > 0).
  LinearWeight idx_wq;  // [nI * dI, qr]
  LinearWeight idx_wk;  // [dI, H]
  std::vector<float> idx_k_norm, idx_k_bias;  // [dI] LayerNorm
  kernels::MatRef idx_weights{};  // [nI, H] weights_proj (float)
};

struct DsLayer {
  std::vector<float> attn_norm, ffn_norm;  // [H]
  MlaWeights attn;
  bool moe = false;
  SwigluWeights mlp;  // dense layers
  MoeWeights experts;  // MoE layers
  int64_t kv_layer = 0;
};

struct DsMtp {
  LinearWeight embed;  // [V, H] the layer's own embed_tokens (the trunk's when absent)
  std::vector<float> enorm, hnorm, norm;  // [H]
  LinearWeight eh_proj;  // [H, 2H]
  LinearWeight head;  // [V, H] shared_head.head (the trunk's lm_head when absent)
  DsLayer layer;
};

class DeepseekModel final : public Model, public MtpHead {
 public:
  DeepseekModel(const ModelConfig& cfg, ModelWeights weights, const LoadOptions& options)
      : weights_(std::move(weights)), shard_(options.parallel, cfg, weights_.where()) {
    config_ = cfg;
    if (cfg.scoring_func != "sigmoid" && cfg.num_experts > 0) {
      fail("{}: scoring_func '{}' is not supported (DeepSeek-V3 routes with sigmoid scores)", weights_.where(),
           cfg.scoring_func);
    }
    if (cfg.num_experts > 0 && cfg.n_group > 1 && cfg.num_experts % cfg.n_group != 0) {
      fail("{}: n_routed_experts ({}) is not a multiple of n_group ({})", weights_.where(), cfg.num_experts,
           cfg.n_group);
    }
    if (cfg.num_experts > 0 && cfg.n_group > 1 &&
        cfg.num_experts_per_tok > cfg.topk_group * (cfg.num_experts / cfg.n_group)) {
      fail("{}: num_experts_per_tok ({}) exceeds the experts of topk_group ({}) groups", weights_.where(),
           cfg.num_experts_per_tok, cfg.topk_group);
    }
    if (cfg.index_n_heads > 0 &&
        (cfg.q_lora_rank == 0 || cfg.index_head_dim < cfg.qk_rope_head_dim || cfg.index_topk <= 0)) {
      fail("{}: the lightning indexer needs q_lora_rank > 0, index_head_dim >= qk_rope_head_dim and index_topk > 0",
           weights_.where());
    }
    const ModelWeights& w = weights_;
    embed_ = w.linear(-1, "token_embd");
    final_norm_ = w.vector(-1, "output_norm");
    lm_head_ = cfg.tie_word_embeddings ? embed_ : shard_.head(w.linear(-1, "output"));
    layers_.resize(cfg.num_layers);
    for (int i = 0; i < cfg.num_layers; ++i) {
      bind_layer(i, layers_[i]);
      layers_[i].kv_layer = i;
    }
    // The MTP layer (speculative drafting only); a tensor-parallel group leaves it unloaded
    // (drafting is not mirrored across ranks).
    const int m = cfg.num_layers;  // the MTP layer follows the trunk
    if (cfg.num_nextn_predict_layers > 0 && w.has(m, "mtp_eh_proj") && !shard_.distributed()) {
      if (cfg.num_nextn_predict_layers > 1) {
        fail("{}: the checkpoint has {} MTP layers; only a single MTP layer is supported", weights_.where(),
             cfg.num_nextn_predict_layers);
      }
      mtp_.embed = w.has(m, "mtp_embed") ? w.linear(m, "mtp_embed") : embed_;
      mtp_.enorm = w.vector(m, "mtp_enorm");
      mtp_.hnorm = w.vector(m, "mtp_hnorm");
      mtp_.eh_proj = w.linear(m, "mtp_eh_proj");
      mtp_.norm = w.vector(m, "mtp_head_norm");
      mtp_.head = w.has(m, "mtp_head") ? w.linear(m, "mtp_head") : lm_head_;
      bind_layer(m, mtp_.layer);
      mtp_.layer.kv_layer = cfg.num_layers;
      has_mtp_ = true;
    }
    counts_.assign(static_cast<size_t>(cfg.num_layers) * std::max(cfg.num_experts, 0), 0);
    rope_ = compute_rope_tables(cfg.rope, cfg.qk_rope_head_dim);
    // Softmax scale: 1/sqrt(q/k head width), times mscale² under YaRN with mscale_all_dim
    // (HF DeepseekV3Attention); cos/sin carry rope_.attn_factor (mscale / mscale_all_dim).
    scale_ = 1.0f / std::sqrt(static_cast<float>(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim));
    if (cfg.rope.scaling == RopeScaling::kYarn && cfg.rope.mscale_all_dim != 0.0f && cfg.rope.factor > 1.0f) {
      const float m = 0.1f * cfg.rope.mscale_all_dim * std::log(cfg.rope.factor) + 1.0f;
      scale_ *= m * m;
    }
    form_ = mla_form_from_env();
  }

  KvPoolShape kv_shape(int64_t block_size) const override {
    // The latent is replicated on every rank of a tensor-parallel group.
    return sequence_geometry(config_, has_mtp_ ? 1 : 0, DType::kF32, block_size).kv;
  }

  int64_t weight_bytes_per_token() const override {
    int64_t bytes = lm_head_.bytes() + embed_.bytes() / std::max<int64_t>(embed_.rows(), 1);
    for (const DsLayer& L : layers_) {
      const MlaWeights& a = L.attn;
      for (const LinearWeight* m : {&a.q_a, &a.q_b, &a.q, &a.kv_a, &a.o}) bytes += m->bytes();
      bytes += static_cast<int64_t>(a.kv_b.size() * sizeof(float));
      bytes += a.idx_wq.bytes() + a.idx_wk.bytes() + matrix_bytes(a.idx_weights);  // V3.2 indexer
      bytes += L.moe ? L.experts.weight_bytes_active() : L.mlp.bytes();
    }
    return bytes;
  }

  int64_t num_parameters() const override { return weights_.num_parameters(); }

  std::vector<uint64_t> expert_counts() const override { return counts_; }
  void reset_expert_counts() override { std::fill(counts_.begin(), counts_.end(), 0); }
  MtpHead* mtp_head() override { return has_mtp_ ? this : nullptr; }

  void forward(const ForwardBatch& batch, KvPool& kv, float* logits) override;

  // ---- MtpHead ----
  void set_hidden_for_all_tokens(bool on) override { hidden_all_ = on; }
  const float* last_hidden() const override { return hidden_.data(); }
  void draft(const ForwardBatch& batch, const float* hidden, KvPool& kv, float* logits) override;

 private:
  // Binds decoder layer `layer` (the trunk's, or num_layers: the MTP layer's block).
  void bind_layer(int layer, DsLayer& L) {
    const ModelConfig& c = config_;
    const ModelWeights& wt = weights_;
    const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    const int64_t R = c.kv_lora_rank, kvw = c.qk_nope_head_dim + c.v_head_dim;
    L.attn_norm = wt.vector(layer, "attn_norm");
    L.ffn_norm = wt.vector(layer, "ffn_norm");
    MlaWeights& w = L.attn;
    // This rank's heads: q rows, kv_b rows and o_proj columns; the latent path is replicated.
    const parallel::Range heads = shard_.heads;
    const parallel::Range q_rows{heads.begin * qk, heads.end * qk};
    const parallel::Range o_cols{heads.begin * c.v_head_dim, heads.end * c.v_head_dim};
    if (c.q_lora_rank > 0) {
      w.q_a = shard_.replicated(wt.linear(layer, "attn_q_a"));
      w.q_a_norm = wt.vector(layer, "attn_q_a_norm");
      w.q_b = shard_.rows(wt.linear(layer, "attn_q_b"), q_rows);
    } else {
      w.q = shard_.rows(wt.linear(layer, "attn_q"), q_rows);
    }
    w.kv_a = shard_.replicated(wt.linear(layer, "attn_kv_a_mqa"));
    w.kv_a_norm = wt.vector(layer, "attn_kv_a_norm");
    {
      // kv_b_proj stays float (the quantizer keeps it so): both forms read this rank's
      // heads' rows [nh * (nope + V), R] as f32.
      std::vector<float> kv_b = wt.vector(layer, "attn_kv_b");
      const int64_t r0 = heads.begin * kvw, r1 = heads.end * kvw;
      w.kv_b.assign(kv_b.begin() + r0 * R, kv_b.begin() + r1 * R);
    }
    w.o = shard_.columns(wt.linear(layer, "attn_output"), o_cols);
    if (c.index_n_heads > 0) {
      w.idx_wq = shard_.replicated(wt.linear(layer, "indexer_q_b"));
      w.idx_wk = shard_.replicated(wt.linear(layer, "indexer_k"));
      w.idx_k_norm = wt.vector(layer, "indexer_k_norm");
      w.idx_k_bias = wt.vector(layer, "indexer_k_norm_bias");
      w.idx_weights = wt.matrix(layer, "indexer_proj");
    }
    L.moe = c.is_moe_layer(layer);
    if (L.moe) {
      // The routed experts and the (ungated) shared experts, as the table lists them.
      L.experts = bind_moe(wt, layer);
      L.experts.sigmoid_scores = true;
      L.experts.score_bias = wt.has(layer, "exp_probs_b") ? wt.vector(layer, "exp_probs_b") : std::vector<float>{};
      L.experts.n_group = std::max(c.n_group, 1);
      L.experts.topk_group = std::max(c.topk_group, 1);
      L.experts.routed_scaling = c.routed_scaling_factor;
      shard_.shard_moe(L.experts);
    } else {
      L.mlp = bind_swiglu(wt, layer);
      L.mlp.gate = shard_.rows(L.mlp.gate, shard_.ffn);
      L.mlp.up = shard_.rows(L.mlp.up, shard_.ffn);
      L.mlp.down = shard_.columns(L.mlp.down, shard_.ffn);
    }
  }

  // One decoder layer on x_ [T, H] (positions_ set), its latent in KV layer L.kv_layer.
  // counts: the layer's expert counts (null: not counted). Returns false when it stopped
  // after the attention (the last layer with no logits wanted).
  void run_layer(const DsLayer& L, const ForwardBatch& batch, KvPool& kv, uint64_t* counts, int dump_layer);
  void attention(const DsLayer& L, const ForwardBatch& batch, KvPool& kv, float* out);

  ModelWeights weights_;  // keeps the checkpoint the weights below point into
  TensorShard shard_;
  LinearWeight embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<DsLayer> layers_;
  DsMtp mtp_;
  bool has_mtp_ = false;
  bool hidden_all_ = false;
  RopeTables rope_;
  float scale_ = 1.0f;
  MlaForm form_ = MlaForm::kAuto;
  std::vector<uint64_t> counts_;
  MoeFfn moe_;

  std::vector<float> x_, xn_, cq_, q_, kva_, lat_, attn_, out_, ffn_, rows_, hidden_, cat_;
  std::vector<float> ctx_, qabs_, olat_, kvx_, cbuf_, swiglu_scratch_;
  std::vector<float> iq_, ik_, iw_, scores_;  // V3.2 indexer: queries, keys, head weights, scores
  std::vector<int32_t> sel_, n_sel_;  // V3.2: selected positions per query
  std::vector<int32_t> mark_, picked_;  // V3.2: the union of a chunk's selections
  std::vector<int32_t> positions_;
  std::vector<int64_t> slots_;
};

void DeepseekModel::attention(const DsLayer& L, const ForwardBatch& batch, KvPool& kv, float* out) {
  const ModelConfig& c = config_;
  const MlaWeights& w = L.attn;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t nh = shard_.heads.size();
  const int64_t R = c.kv_lora_rank, P = c.qk_rope_head_dim, nope = c.qk_nope_head_dim, V = c.v_head_dim;
  const int64_t qk = nope + P, kvw = nope + V;
  const int64_t half = kv.shape().head_dim, lw = 2 * half;  // latent row as cached (K half, V half)
  INFERA_ASSERT(kv.shape().n_kv_heads == 1 && lw >= R + P, "KV pool shape does not fit the MLA latent");

  // Projections: q (low-rank or direct) and the latent [c_kv | k_pe].
  q_.resize(static_cast<size_t>(T * nh * qk));
  kva_.resize(static_cast<size_t>(T * (R + P)));
  if (c.q_lora_rank > 0) {
    cq_.resize(static_cast<size_t>(T * c.q_lora_rank));
    const LinearWeight* ws[] = {&w.q_a, &w.kv_a};
    float* ys[] = {cq_.data(), kva_.data()};
    kernels::linear_multi(xn_.data(), T, ws, ys);
    kernels::rmsnorm(cq_.data(), w.q_a_norm.data(), cq_.data(), T, c.q_lora_rank, c.rms_norm_eps);
    kernels::linear(cq_.data(), T, w.q_b, q_.data());
  } else {
    const LinearWeight* ws[] = {&w.q, &w.kv_a};
    float* ys[] = {q_.data(), kva_.data()};
    kernels::linear_multi(xn_.data(), T, ws, ys);
  }
  // The cached rows: [rms(c_kv) | rope(k_pe) | indexer key (V3.2) | 0 pad].
  lat_.assign(static_cast<size_t>(T * lw), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    const float* src = kva_.data() + t * (R + P);
    float* dst = lat_.data() + t * lw;
    kernels::rmsnorm(src, w.kv_a_norm.data(), dst, 1, R, c.rms_norm_eps);
    std::memcpy(dst + R, src + R, P * sizeof(float));
  }
  const bool indexer = c.index_n_heads > 0;
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
  if (indexer) {
    // q_I = W_Iq c_q [nI, dI], k_I = LayerNorm(W_Ik a) [dI], both RoPE'd NeoX-style on
    // their first qk_rope_head_dim dims ([rope | nope]); head weights W_Iw a / sqrt(nI dI).
    iq_.resize(static_cast<size_t>(T * nI * dI));
    ik_.resize(static_cast<size_t>(T * dI));
    iw_.resize(static_cast<size_t>(T * nI));
    kernels::linear(cq_.data(), T, w.idx_wq, iq_.data());
    kernels::linear(xn_.data(), T, w.idx_wk, ik_.data());
    kernels::matmul(xn_.data(), T, w.idx_weights, iw_.data());
    const float wscale = 1.0f / std::sqrt(static_cast<float>(nI * dI));
    for (float& v : iw_) v *= wscale;
    for (int64_t t = 0; t < T; ++t) layer_norm(ik_.data() + t * dI, w.idx_k_norm.data(), w.idx_k_bias.data(), dI);
    kernels::rope_neox(iq_.data(), T, nI, dI, P, positions_.data(), rope_.inv_freq.data(), rope_.attn_factor);
    kernels::rope_neox(ik_.data(), T, 1, dI, P, positions_.data(), rope_.inv_freq.data(), rope_.attn_factor);
    for (int64_t t = 0; t < T; ++t) std::memcpy(lat_.data() + t * lw + R + P, ik_.data() + t * dI, dI * sizeof(float));
  }
  kernels::rope_interleaved(lat_.data(), T, 1, lw, R, P, positions_.data(), rope_.inv_freq.data(), rope_.attn_factor);
  kernels::rope_interleaved(q_.data(), T, nh, qk, nope, P, positions_.data(), rope_.inv_freq.data(), rope_.attn_factor);

  const int64_t bs = kv.shape().block_size;
  for (const SeqChunk& s : batch.seqs) {
    const int64_t n = s.n_tokens, ctx = s.pos0 + n;
    if (n == 0) continue;
    slots_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = s.pos0 + i;
      INFERA_ASSERT(pos / bs < s.n_blocks, "block table too short for the chunk");
      slots_[i] = static_cast<int64_t>(s.block_table[pos / bs]) * bs + pos % bs;
    }
    // Stored in the cache's dtype, then read back like every older row, so a chunk sees
    // exactly what later steps will.
    const float* rows = lat_.data() + static_cast<int64_t>(s.token_begin) * lw;
    kv.write(L.kv_layer, rows, rows + half, lw, n, slots_.data());
    const kernels::PagedKv view = kv.view(L.kv_layer, s.block_table);

    const float* qs = q_.data() + static_cast<int64_t>(s.token_begin) * nh * qk;
    float* os = out + static_cast<int64_t>(s.token_begin) * nh * V;
    // V3.2 with more context than index_topk: each query attends to the index_topk positions
    // its indexer scores highest (absorbed form over the selected rows). Up to index_topk
    // every position is selected: dense MLA, below. Sparse chunks read back only the
    // indexer keys of the context and the latent rows some query selected.
    const bool sparse = indexer && ctx > c.index_topk;
    if (!sparse) {
      ctx_.resize(static_cast<size_t>(ctx * lw));
      kernels::mla_load_latent(view, 0, ctx, ctx_.data());
    }
    bool naive = form_ == MlaForm::kNaive && !sparse;
    // Absorbing costs n·nh·(2R + P) per context row, expanding nh·R·(nope + V) once per
    // row plus n·nh·(qk + V).
    // (A sparse chunk always runs absorbed, over its selected rows.)
    // The naive form holds the expanded context, ctx·nh·(nope + V) floats: past
    // kNaiveMaxFloats (2 GiB) the absorbed form runs instead, whatever the cost.
    constexpr int64_t kNaiveMaxFloats = int64_t{1} << 29;
    if (form_ == MlaForm::kAuto && !sparse)
      naive = n * (2 * R + P) > R * kvw + n * (qk + V) && ctx * nh * kvw <= kNaiveMaxFloats;
    if (naive) {
      // [k_nope | v] per head for every context row from c_kv.
      cbuf_.resize(static_cast<size_t>(ctx * R));
      for (int64_t t = 0; t < ctx; ++t) std::memcpy(cbuf_.data() + t * R, ctx_.data() + t * lw, R * sizeof(float));
      kvx_.resize(static_cast<size_t>(ctx * nh * kvw));
      const kernels::MatRef kvb{reinterpret_cast<const uint8_t*>(w.kv_b.data()), DType::kF32, nh * kvw, R};
      kernels::matmul(cbuf_.data(), ctx, kvb, kvx_.data());
      kernels::mla_attention_naive(qs, n, nh, s.pos0, kvx_.data(), nope, V, ctx_.data() + R, lw, P, scale_, os);
      continue;
    }
    // Absorbed: q̃_h = W_UK,hᵀ q_nope_h (R wide), then attention over the latent rows.
    qabs_.assign(static_cast<size_t>(n * nh * (R + P)), 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < nh; ++h) {
        const float* qn = qs + (i * nh + h) * qk;
        float* qa = qabs_.data() + (i * nh + h) * (R + P);
        const float* wuk = w.kv_b.data() + h * kvw * R;  // rows [h kvw, h kvw + nope)
        for (int64_t j = 0; j < nope; ++j) {
          const float a = qn[j];
          const float* row = wuk + j * R;
          for (int64_t r = 0; r < R; ++r) qa[r] += a * row[r];
        }
        std::memcpy(qa + R, qn + nope, P * sizeof(float));
      }
    }
    olat_.resize(static_cast<size_t>(n * nh * R));
    if (sparse) {
      const int64_t k = c.index_topk;
      sel_.resize(static_cast<size_t>(n * k));
      n_sel_.resize(static_cast<size_t>(n));
      // The chunk's scores as one [queries, ctx] matrix, a block of queries at a time so
      // that the matrix stays within kScoreFloats.
      constexpr int64_t kScoreFloats = int64_t{1} << 22;
      const int64_t qb = std::clamp<int64_t>(kScoreFloats / ctx, 1, n);
      scores_.resize(static_cast<size_t>(qb * ctx));
      for (int64_t i0 = 0; i0 < n; i0 += qb) {
        const int64_t nb = std::min(qb, n - i0);
        const int64_t t0 = s.token_begin + i0;
        kernels::indexer_scores_paged(iq_.data() + t0 * nI * dI, iw_.data() + t0 * nI, nb, nI, dI, s.pos0 + i0, view,
                                      R + P, scores_.data(), ctx);
        for (int64_t i = i0; i < i0 + nb; ++i) {
          const int64_t n_keys = s.pos0 + i + 1;  // causal
          int32_t* out_i = sel_.data() + i * k;
          if (n_keys <= k) {
            for (int64_t j = 0; j < n_keys; ++j) out_i[j] = static_cast<int32_t>(j);
            n_sel_[i] = static_cast<int32_t>(n_keys);
            continue;
          }
          kernels::topk_indices(scores_.data() + (i - i0) * ctx, n_keys, k, out_i);
          n_sel_[i] = static_cast<int32_t>(k);
        }
      }
      // Only the rows some query selected are read back, in position order; the lists
      // then index that compact copy.
      mark_.assign(static_cast<size_t>(ctx), -1);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n_sel_[i]; ++j) mark_[sel_[i * k + j]] = 0;
      picked_.clear();
      for (int64_t p = 0; p < ctx; ++p) {
        if (mark_[p] < 0) continue;
        mark_[p] = static_cast<int32_t>(picked_.size());
        picked_.push_back(static_cast<int32_t>(p));
      }
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n_sel_[i]; ++j) sel_[i * k + j] = mark_[sel_[i * k + j]];
      ctx_.resize(picked_.size() * static_cast<size_t>(lw));
      kernels::mla_load_latent_rows(view, picked_.data(), static_cast<int64_t>(picked_.size()), ctx_.data());
      kernels::mla_attention_sparse(qabs_.data(), n, nh, ctx_.data(), lw, R, P, sel_.data(), n_sel_.data(), k, scale_,
                                    olat_.data());
    } else {
      kernels::mla_attention_absorbed(qabs_.data(), n, nh, s.pos0, ctx_.data(), lw, R, P, scale_, olat_.data());
    }
    // o_h = W_UV,h · olat_h: rows [h kvw + nope, (h + 1) kvw) of kv_b.
    cbuf_.resize(static_cast<size_t>(n * R));
    const kernels::MatRef kvb{reinterpret_cast<const uint8_t*>(w.kv_b.data()), DType::kF32, nh * kvw, R};
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(cbuf_.data() + i * R, olat_.data() + (i * nh + h) * R, R * sizeof(float));
      kernels::matmul_rows(cbuf_.data(), n, kvb, h * kvw + nope, (h + 1) * kvw, os + h * V, nh * V);
    }
  }
}

void DeepseekModel::run_layer(const DsLayer& L, const ForwardBatch& batch, KvPool& kv, uint64_t* counts,
                              int dump_layer) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t H = c.hidden_size, nh = shard_.heads.size();
  xn_.resize(static_cast<size_t>(T * H));
  kernels::rmsnorm(x_.data(), L.attn_norm.data(), xn_.data(), T, H, c.rms_norm_eps);
  if (dump_ && dump_layer >= 0) dump_->write("attn_norm", dump_layer, xn_.data(), T, H);
  attn_.resize(static_cast<size_t>(T * nh * c.v_head_dim));
  attention(L, batch, kv, attn_.data());
  out_.resize(static_cast<size_t>(T * H));
  kernels::linear(attn_.data(), T, L.attn.o, out_.data());
  shard_.all_reduce(out_.data(), T * H, shard_.tensor_parallel());  // row-parallel o_proj
  if (dump_ && dump_layer >= 0) dump_->write("attn_out", dump_layer, out_.data(), T, H);
  kernels::add(x_.data(), out_.data(), T * H);

  kernels::rmsnorm(x_.data(), L.ffn_norm.data(), xn_.data(), T, H, c.rms_norm_eps);
  if (dump_ && dump_layer >= 0) dump_->write("ffn_norm", dump_layer, xn_.data(), T, H);
  ffn_.resize(static_cast<size_t>(T * H));
  if (L.moe) {
    shard_.moe(moe_, L.experts, xn_.data(), T, H, ffn_.data(), counts);
  } else {
    swiglu(L.mlp, xn_.data(), T, ffn_.data(), swiglu_scratch_);
    shard_.all_reduce(ffn_.data(), T * H, shard_.tensor_parallel());  // row-parallel down
  }
  kernels::add(x_.data(), ffn_.data(), T * H);
  if (dump_ && dump_layer >= 0) {
    dump_->write("ffn_out", dump_layer, ffn_.data(), T, H);
    dump_->write("layer_out", dump_layer, x_.data(), T, H);
  }
}

void DeepseekModel::forward(const ForwardBatch& batch, KvPool& kv, float* logits) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  if (T == 0) return;
  const int64_t H = c.hidden_size;
  x_.resize(static_cast<size_t>(T * H));
  embed_batch(shard_, batch, c.vocab_size, embed_, H, x_.data(), positions_, dump_);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    uint64_t* counts = c.num_experts > 0 ? counts_.data() + l * c.num_experts : nullptr;
    run_layer(layers_[l], batch, kv, counts, static_cast<int>(l));
  }
  const int64_t R = batch.num_logit_rows();
  if (has_mtp_ && hidden_all_) {
    hidden_.resize(static_cast<size_t>(T * H));
    kernels::rmsnorm(x_.data(), final_norm_.data(), hidden_.data(), T, H, c.rms_norm_eps);
    gather_logit_rows(batch, hidden_.data(), H, rows_);
  } else {
    gather_logit_rows(batch, x_.data(), H, rows_);
    kernels::rmsnorm(rows_.data(), final_norm_.data(), rows_.data(), R, H, c.rms_norm_eps);
    if (has_mtp_) hidden_.assign(rows_.begin(), rows_.end());  // post-final-norm hidden: the MTP input
  }
  if (R == 0 || logits == nullptr) return;
  head_logits(shard_, rows_.data(), R, H, lm_head_, c.vocab_size, logits, dump_);
}

void DeepseekModel::draft(const ForwardBatch& batch, const float* hidden, KvPool& kv, float* logits) {
  if (!has_mtp_) fail("{}: this checkpoint has no MTP layer; drafting needs it", weights_.where());
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  if (T == 0) return;
  const int64_t H = c.hidden_size;
  // h' = W_eh [rms_e(embed(x_{p+1})) ; rms_h(h_p)] (embedding first).
  mtp_input_rows(batch, c.vocab_size, mtp_.embed, mtp_.enorm.data(), mtp_.hnorm.data(), hidden, H, c.rms_norm_eps, 0.0f,
                 cat_);
  x_.resize(static_cast<size_t>(T * H));
  kernels::linear(cat_.data(), T, mtp_.eh_proj, x_.data());
  // The entry for (h_p, x_{p+1}) is cached in slot p and rotated as position p + 1.
  batch_positions(batch, positions_);
  for (int32_t& p : positions_) p += 1;
  run_layer(mtp_.layer, batch, kv, nullptr, -1);
  const int64_t R = batch.num_logit_rows();
  if (R == 0 || logits == nullptr) return;
  gather_logit_rows(batch, x_.data(), H, rows_);
  kernels::rmsnorm(rows_.data(), mtp_.norm.data(), rows_.data(), R, H, c.rms_norm_eps);
  // `hidden` may point into hidden_ (recursive drafting): it has been read by now.
  hidden_.assign(rows_.begin(), rows_.end());
  kernels::linear(rows_.data(), R, mtp_.head, logits);
}

}  // namespace

std::unique_ptr<Model> create_deepseek_model(const ModelConfig& cfg, ModelWeights weights, const LoadOptions& options) {
  return std::make_unique<DeepseekModel>(cfg, std::move(weights), options);
}

}  // namespace infera
