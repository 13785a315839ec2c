// Qwen3-MoE (Qwen3MoeForCausalLM): the Qwen3 decoder (GQA, per-head q/k RMSNorm, NeoX
// RoPE) with a mixture-of-experts FFN on the layers ModelConfig::is_moe_layer picks
// (decoder_sparse_step, mlp_only_layers); the other layers keep the dense SwiGLU MLP.
//
//   per layer: a = rms(x); q,k,v = Wq a, Wk a, Wv a; q,k = rope(rms_head(q), rms_head(k));
//              x += Wo attn(q, k, v); m = rms(x)
//              x += MoE(m) = Σ_{j in topk(softmax(Wr m))} w_j Expert_j(m)   (or Wd(silu(Wg m) * Wu m))
#include <algorithm>
#include <cmath>
#include <cstring>

#include "infera/base/error.h"
#include "infera/kernels/kernels.h"
#include "infera/model/blocks.h"
#include "infera/model/model.h"
#include "infera/model/rope.h"
#include "infera/model/tensor_parallel.h"
#include "infera/model/weights.h"

namespace infera {
namespace {

using kernels::MatRef;

struct MoeLayer {
  std::vector<float> attn_norm, ffn_norm;  // [H]
  std::vector<float> q_norm, k_norm;       // [head_dim]
  MatRef wq, wk, wv, wo;                   // [nh*hd, H], [nkv*hd, H], [nkv*hd, H], [H, nh*hd]
  bool moe = false;
  MoeWeights experts;                      // moe layers
  SwigluWeights mlp;                       // dense layers
};

class Qwen3MoeModel final : public Model {
 public:
  Qwen3MoeModel(const ModelConfig& cfg, WeightStore store, const LoadOptions& options)
      : store_(std::move(store)), shard_(options.parallel, cfg, store_.dir(), !options.load_into_memory) {
    config_ = cfg;
    if (cfg.attention_bias) fail("{}: attention_bias is not supported for qwen3_moe", store_.dir());
    const int64_t H = cfg.hidden_size, V = cfg.vocab_size;
    const int64_t nh = cfg.num_heads, nkv = cfg.num_kv_heads, hd = cfg.head_dim;
    embed_ = &store_.get("model.embed_tokens.weight", {V, H});
    final_norm_ = load_vector(store_, "model.norm.weight", H);
    lm_head_ = as_matrix(cfg.tie_word_embeddings ? *embed_ : store_.get("lm_head.weight", {V, H}));
    layers_.resize(cfg.num_layers);
    for (int i = 0; i < cfg.num_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      MoeLayer& L = layers_[i];
      L.attn_norm = load_vector(store_, p + "input_layernorm.weight", H);
      L.ffn_norm = load_vector(store_, p + "post_attention_layernorm.weight", H);
      L.wq = as_matrix(store_.get(p + "self_attn.q_proj.weight", {nh * hd, H}));
      L.wk = as_matrix(store_.get(p + "self_attn.k_proj.weight", {nkv * hd, H}));
      L.wv = as_matrix(store_.get(p + "self_attn.v_proj.weight", {nkv * hd, H}));
      L.wo = as_matrix(store_.get(p + "self_attn.o_proj.weight", {H, nh * hd}));
      L.q_norm = load_vector(store_, p + "self_attn.q_norm.weight", hd);
      L.k_norm = load_vector(store_, p + "self_attn.k_norm.weight", hd);
      L.moe = cfg.is_moe_layer(i);
      if (L.moe) {
        L.experts = load_moe(store_, p + "mlp.", cfg, 0);
      } else {
        L.mlp = load_swiglu(store_, p + "mlp.", H, cfg.intermediate_size);
      }
      shard_layer(L);
    }
    counts_.assign(static_cast<size_t>(cfg.num_layers) * cfg.num_experts, 0);
    rope_ = compute_rope_tables(cfg.rope, cfg.rope.rotary_dim);
    reserve(std::max(options.max_batch_tokens, 1));
  }

  KvPoolShape kv_shape(int64_t block_size) const override {
    KvPoolShape s;
    s.num_layers = config_.num_layers;
    s.block_size = block_size;
    s.n_kv_heads = shard_.kv_heads.size();  // this rank's KV heads (all of them without TP)
    s.head_dim = config_.head_dim;
    return s;
  }

  int64_t weight_bytes_per_token() const override {
    int64_t bytes = matrix_bytes(lm_head_) + config_.hidden_size * static_cast<int64_t>(dtype_size(embed_->dtype));
    for (const auto& L : layers_) {
      for (const MatRef* m : {&L.wq, &L.wk, &L.wv, &L.wo}) bytes += matrix_bytes(*m);
      if (L.moe) bytes += L.experts.weight_bytes_active();
      else bytes += matrix_bytes(L.mlp.gate) + matrix_bytes(L.mlp.up) + matrix_bytes(L.mlp.down);
    }
    return bytes;
  }

  int64_t num_parameters() const override {
    int64_t n = 0;
    for (const auto& name : store_.names()) n += store_.get(name).numel();
    return n;
  }

  std::vector<uint64_t> expert_counts() const override { return counts_; }
  void reset_expert_counts() override { std::fill(counts_.begin(), counts_.end(), 0); }

  void forward(const ForwardBatch& batch, KvPool& kv, float* logits) override;

 private:
  // This rank's part: attention heads and dense-MLP columns under TP; under EP the experts
  // of its range (the others' weights are never touched); under TP without EP a column
  // slice of every expert. No-op in one process.
  void shard_layer(MoeLayer& L) {
    const int64_t hd = config_.head_dim;
    const parallel::Range q{shard_.heads.begin * hd, shard_.heads.end * hd};
    const parallel::Range kv{shard_.kv_heads.begin * hd, shard_.kv_heads.end * hd};
    L.wq = shard_.rows(L.wq, q);
    L.wk = shard_.rows(L.wk, kv);
    L.wv = shard_.rows(L.wv, kv);
    L.wo = shard_.columns(L.wo, q);
    if (!L.moe) {
      L.mlp.gate = shard_.rows(L.mlp.gate, shard_.ffn);
      L.mlp.up = shard_.rows(L.mlp.up, shard_.ffn);
      L.mlp.down = shard_.columns(L.mlp.down, shard_.ffn);
      return;
    }
    MoeWeights& w = L.experts;
    for (int64_t e = 0; e < w.n_experts(); ++e) {
      if (!shard_.experts.contains(e)) {  // another rank's expert: MoeFfn skips a null matrix
        w.gate[e].data = w.up[e].data = w.down[e].data = nullptr;
        continue;
      }
      w.gate[e] = shard_.rows(w.gate[e], shard_.expert_ffn, shard_.expert_parallel());
      w.up[e] = shard_.rows(w.up[e], shard_.expert_ffn, shard_.expert_parallel());
      w.down[e] = shard_.expert_parallel() ? shard_.rows(w.down[e], {0, w.down[e].rows}, /*own=*/true)
                                           : shard_.columns(w.down[e], shard_.expert_ffn);
    }
  }

  void reserve(int64_t T) {
    const ModelConfig& c = config_;
    x_.resize(T * c.hidden_size);
    xn_.resize(T * c.hidden_size);
    q_.resize(T * c.num_heads * c.head_dim);
    k_.resize(T * c.num_kv_heads * c.head_dim);
    v_.resize(T * c.num_kv_heads * c.head_dim);
    attn_.resize(T * c.num_heads * c.head_dim);
  }

  WeightStore store_;
  TensorShard shard_;                  // this rank's part (everything in one process)
  const TensorInfo* embed_ = nullptr;  // [V, H]
  std::vector<float> final_norm_;      // [H]
  MatRef lm_head_{};                   // [V, H]
  std::vector<MoeLayer> layers_;
  RopeTables rope_;
  std::vector<uint64_t> counts_;       // [layers, E]
  MoeFfn moe_;

  std::vector<float> x_, xn_;          // [T, H] residual stream, normed input / block output
  std::vector<float> q_, k_, v_, attn_;
  std::vector<float> ffn_out_, ffn_scratch_, rows_;  // [T, H], FFN scratch, [R, H]
  std::vector<int32_t> positions_;
};

void Qwen3MoeModel::forward(const ForwardBatch& batch, KvPool& kv, float* logits) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  if (T == 0) return;
  if (static_cast<int64_t>(x_.size()) < T * c.hidden_size) reserve(T);
  const int64_t H = c.hidden_size, nh = shard_.heads.size(), nkv = shard_.kv_heads.size(), hd = c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  for (const int32_t tok : batch.tokens) INFERA_ASSERT(tok >= 0 && tok < c.vocab_size, "token id out of range");
  shard_.embed(batch.tokens.data(), T, H, x_.data(), [&](int32_t tok, float* row) { embedding_row(*embed_, tok, row); });
  batch_positions(batch, positions_);

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const MoeLayer& L = layers_[l];
    kernels::rmsnorm(x_.data(), L.attn_norm.data(), xn_.data(), T, H, c.rms_norm_eps);
    kernels::matmul(xn_.data(), T, L.wq, q_.data());
    kernels::matmul(xn_.data(), T, L.wk, k_.data());
    kernels::matmul(xn_.data(), T, L.wv, v_.data());
    kernels::rmsnorm(q_.data(), L.q_norm.data(), q_.data(), T * nh, hd, c.rms_norm_eps);
    kernels::rmsnorm(k_.data(), L.k_norm.data(), k_.data(), T * nkv, hd, c.rms_norm_eps);
    kernels::rope_neox(q_.data(), T, nh, hd, c.rope.rotary_dim, positions_.data(), rope_.inv_freq.data(), rope_.attn_factor);
    kernels::rope_neox(k_.data(), T, nkv, hd, c.rope.rotary_dim, positions_.data(), rope_.inv_freq.data(), rope_.attn_factor);
    paged_attention(batch, kv, l, q_.data(), k_.data(), v_.data(), nh, nkv, hd, scale, attn_.data());
    kernels::matmul(attn_.data(), T, L.wo, xn_.data());
    shard_.all_reduce(xn_.data(), T * H, shard_.tensor_parallel());  // row-parallel o_proj
    kernels::add(x_.data(), xn_.data(), T * H);
    // The last layer's FFN feeds only the logits: without them, skip it (and its all-reduce).
    if (l + 1 == c.num_layers && (batch.num_logit_rows() == 0 || logits == nullptr) && shard_.merged_sync()) break;

    kernels::rmsnorm(x_.data(), L.ffn_norm.data(), xn_.data(), T, H, c.rms_norm_eps);
    ffn_out_.resize(static_cast<size_t>(T * H));
    if (L.moe) {
      moe_.forward(L.experts, xn_.data(), T, H, ffn_out_.data(), counts_.data() + l * c.num_experts);
    } else {
      swiglu(L.mlp, xn_.data(), T, ffn_out_.data(), ffn_scratch_);
    }
    // Partial sums: experts split by rank (EP) or by columns (TP); dense MLP split by TP.
    shard_.all_reduce(ffn_out_.data(), T * H, shard_.tensor_parallel() || (L.moe && shard_.expert_parallel()));
    kernels::add(x_.data(), ffn_out_.data(), T * H);
  }

  const int64_t R = batch.num_logit_rows();
  if (R == 0 || logits == nullptr) return;
  gather_logit_rows(batch, x_.data(), H, rows_);
  kernels::rmsnorm(rows_.data(), final_norm_.data(), rows_.data(), R, H, c.rms_norm_eps);
  shard_.logits(rows_.data(), R, lm_head_, logits);  // TP: vocabulary split, gathered to rank 0
}

}  // namespace

std::unique_ptr<Model> create_qwen3_moe_model(const ModelConfig& cfg, WeightStore store, const LoadOptions& options) {
  return std::make_unique<Qwen3MoeModel>(cfg, std::move(store), options);
}

}  // namespace infera
