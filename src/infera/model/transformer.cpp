// The Llama decoder family: Llama, Qwen3 and Qwen3-MoE. A pre-norm decoder with GQA
// attention and a SwiGLU MLP. Qwen3 adds a per-head RMSNorm on q and k before RoPE and an
// explicit head_dim; Qwen3-MoE replaces the MLP by a mixture of experts on the layers
// ModelConfig::is_moe_layer picks (decoder_sparse_step, mlp_only_layers). All of it comes
// from config fields (qk_norm, head_dim, num_experts), not from the architecture name.
//
//   x = embed(t)
//   per layer: a = rms(x); q,k,v = Wq a, Wk a, Wv a; [q,k = rms_head(q), rms_head(k)];
//              q,k = rope(q,k); x += Wo attn(q, k, v); m = rms(x);
//              x += Wd(silu(Wg m) * Wu m)   or   x += Σ_{j in topk(softmax(Wr m))} w_j Expert_j(m)
//   logits = lm_head(rms(x))
#include <algorithm>
#include <cmath>
#include <cstring>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/io/safetensors.h"
#include "infera/kernels/kernels.h"
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

struct LlamaLayer {
  std::vector<float> attn_norm;  // [H]
  std::vector<float> ffn_norm;  // [H]
  std::vector<float> q_norm;  // [head_dim] (qk_norm only)
  std::vector<float> k_norm;  // [head_dim] (qk_norm only)
  LinearWeight wq, wk, wv, wo;  // [nh*hd, H], [nkv*hd, H], [nkv*hd, H], [H, nh*hd]
  std::vector<float> bq, bk, bv, bo;  // attention_bias only
  LinearWeight w_gate, w_up, w_down;  // [F, H], [F, H], [H, F] (float or quantized); dense layers
  bool moe = false;
  MoeWeights experts;  // MoE layers (Qwen3-MoE)
};

class LlamaModel final : public Model {
 public:
  LlamaModel(const ModelConfig& cfg, ModelWeights weights, const LoadOptions& options)
      : weights_(std::move(weights)), shard_(options.parallel, cfg, weights_.where()) {
    config_ = cfg;
    const ModelWeights& w = weights_;
    embed_ = w.linear(-1, "token_embd");
    final_norm_ = w.vector(-1, "output_norm");
    lm_head_ = cfg.tie_word_embeddings ? embed_ : shard_.head(w.linear(-1, "output"));
    layers_.resize(cfg.num_layers);
    for (int i = 0; i < cfg.num_layers; ++i) {
      LlamaLayer& L = layers_[i];
      L.attn_norm = w.vector(i, "attn_norm");
      L.ffn_norm = w.vector(i, "ffn_norm");
      L.wq = w.linear(i, "attn_q");
      L.wk = w.linear(i, "attn_k");
      L.wv = w.linear(i, "attn_v");
      L.wo = w.linear(i, "attn_output");
      if (cfg.attention_bias) {
        L.bq = w.vector(i, "attn_q_bias");
        L.bk = w.vector(i, "attn_k_bias");
        L.bv = w.vector(i, "attn_v_bias");
        if (w.has(i, "attn_output_bias")) L.bo = w.vector(i, "attn_output_bias");
      }
      if (cfg.qk_norm) {
        L.q_norm = w.vector(i, "attn_q_norm");
        L.k_norm = w.vector(i, "attn_k_norm");
      }
      L.moe = cfg.is_moe_layer(i);
      if (L.moe) {
        L.experts = bind_moe(w, i);
      } else {
        L.w_gate = w.linear(i, "ffn_gate");
        L.w_up = w.linear(i, "ffn_up");
        L.w_down = w.linear(i, "ffn_down");
      }
      shard_layer(L);
    }
    counts_.assign(static_cast<size_t>(cfg.num_layers) * cfg.num_experts, 0);
    rope_ = compute_rope_tables(cfg.rope, cfg.rope.rotary_dim);
    reserve_scratch(std::max(options.max_batch_tokens, 1));
  }

  KvPoolShape kv_shape(int64_t block_size) const override {
    KvPoolShape s = sequence_geometry(config_, 0, DType::kF32, block_size).kv;
    s.n_kv_heads = shard_.kv_heads.size();  // this rank's KV heads (all of them without TP)
    return s;
  }

  int64_t weight_bytes_per_token() const override {
    int64_t bytes = lm_head_.bytes() + embed_.bytes() / std::max<int64_t>(embed_.rows(), 1);
    for (const auto& L : layers_) {
      for (const LinearWeight* m : {&L.wq, &L.wk, &L.wv, &L.wo}) bytes += m->bytes();
      if (L.moe)
        bytes += L.experts.weight_bytes_active();
      else
        bytes += L.w_gate.bytes() + L.w_up.bytes() + L.w_down.bytes();
    }
    return bytes;
  }

  int64_t num_parameters() const override { return weights_.num_parameters(); }

  std::vector<uint64_t> expert_counts() const override { return counts_; }
  void reset_expert_counts() override { std::fill(counts_.begin(), counts_.end(), 0); }

  void forward(const ForwardBatch& batch, KvPool& kv, float* logits) override;

 private:
  // Dump points at the end of layer l: the FFN output [T, H] and the residual stream.
  void dump_layer_end(int l, const float* ffn_out, int64_t T) {
    dump_->write("ffn_out", l, ffn_out, T, config_.hidden_size);
    dump_->write("layer_out", l, x_.data(), T, config_.hidden_size);
  }

  // Tensor parallel: keep this rank's heads (q/k/v rows, o_proj columns) and MLP columns
  // (gate/up rows, down columns); under expert parallelism the experts of this rank's
  // range (the others' weights are never touched), under TP without EP a column slice of
  // every expert. No-op in one process (every range is whole).
  void shard_layer(LlamaLayer& L) {
    const int64_t hd = config_.head_dim;
    const parallel::Range q{shard_.heads.begin * hd, shard_.heads.end * hd};
    const parallel::Range kv{shard_.kv_heads.begin * hd, shard_.kv_heads.end * hd};
    L.wq = shard_.rows(L.wq, q);
    L.wk = shard_.rows(L.wk, kv);
    L.wv = shard_.rows(L.wv, kv);
    L.wo = shard_.columns(L.wo, q);
    L.bq = TensorShard::slice(L.bq, q);
    L.bk = TensorShard::slice(L.bk, kv);
    L.bv = TensorShard::slice(L.bv, kv);  // bo is added once, after the all-reduce
    if (!L.moe) {
      L.w_gate = shard_.rows(L.w_gate, shard_.ffn);
      L.w_up = shard_.rows(L.w_up, shard_.ffn);
      L.w_down = shard_.columns(L.w_down, shard_.ffn);
      return;
    }
    shard_.shard_moe(L.experts);
  }

  void reserve_scratch(int64_t n_tokens) {
    const ModelConfig& c = config_;
    if (n_tokens <= scratch_tokens_) return;
    scratch_tokens_ = n_tokens;
    x_.resize(n_tokens * c.hidden_size);
    xn_.resize(n_tokens * c.hidden_size);
    q_.resize(n_tokens * c.num_heads * c.head_dim);
    k_.resize(n_tokens * c.num_kv_heads * c.head_dim);
    v_.resize(n_tokens * c.num_kv_heads * c.head_dim);
    attn_.resize(n_tokens * c.num_heads * c.head_dim);
    gate_.resize(n_tokens * c.intermediate_size);
    up_.resize(n_tokens * c.intermediate_size);
    positions_.resize(n_tokens);
  }

  ModelWeights weights_;  // keeps the checkpoint the weights below point into
  TensorShard shard_;  // this rank's part (everything without TP)
  LinearWeight embed_;  // [V, H]
  std::vector<float> final_norm_;  // [H]
  LinearWeight lm_head_;  // [V, H]
  std::vector<LlamaLayer> layers_;
  RopeTables rope_;
  std::vector<uint64_t> counts_;  // [layers, E] tokens routed to each expert
  MoeFfn moe_;

  int64_t scratch_tokens_ = 0;
  std::vector<float> x_;  // [T, H] residual stream
  std::vector<float> xn_;  // [T, H] normed input / projection output
  std::vector<float> q_;  // [T, nh, hd]
  std::vector<float> k_, v_;  // [T, nkv, hd]
  std::vector<float> attn_;  // [T, nh, hd]
  std::vector<float> gate_, up_;  // [T, F]
  std::vector<float> ffn_out_;  // [T, H] MoE output
  std::vector<float> rows_;  // [R, H] hidden rows that need logits
  std::vector<int32_t> positions_;  // [T]
};

void add_bias(float* y, const std::vector<float>& b, int64_t rows) {
  if (b.empty()) return;
  const int64_t n = static_cast<int64_t>(b.size());
  for (int64_t r = 0; r < rows; ++r) kernels::add(y + r * n, b.data(), n);
}

void LlamaModel::forward(const ForwardBatch& batch, KvPool& kv, float* logits) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  if (T == 0) return;
  reserve_scratch(T);
  // This rank's heads and MLP columns (all of them without TP).
  const int64_t H = c.hidden_size, F = shard_.ffn.size();
  const int64_t nh = shard_.heads.size(), nkv = shard_.kv_heads.size(), hd = c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  embed_batch(shard_, batch, c.vocab_size, embed_, H, x_.data(), positions_, dump_);

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LlamaLayer& L = layers_[l];
    kernels::rmsnorm(x_.data(), L.attn_norm.data(), xn_.data(), T, H, c.rms_norm_eps);
    if (dump_) dump_->write("attn_norm", static_cast<int>(l), xn_.data(), T, H);
    {
      const LinearWeight* ws[] = {&L.wq, &L.wk, &L.wv};
      float* ys[] = {q_.data(), k_.data(), v_.data()};
      kernels::linear_multi(xn_.data(), T, ws, ys);  // one pass over q, k and v
    }
    add_bias(q_.data(), L.bq, T);
    add_bias(k_.data(), L.bk, T);
    add_bias(v_.data(), L.bv, T);
    if (c.qk_rows_pairs_adjacent) {  // a llama GGUF's q / k rows as stored: Hugging Face's order back
      pairs_to_halves(q_.data(), T * nh, hd);
      pairs_to_halves(k_.data(), T * nkv, hd);
    }
    if (c.qk_norm) {
      kernels::rmsnorm(q_.data(), L.q_norm.data(), q_.data(), T * nh, hd, c.rms_norm_eps);
      kernels::rmsnorm(k_.data(), L.k_norm.data(), k_.data(), T * nkv, hd, c.rms_norm_eps);
    }
    kernels::rope_neox(q_.data(), T, nh, hd, c.rope.rotary_dim, positions_.data(), rope_.inv_freq.data(),
                       rope_.attn_factor);
    kernels::rope_neox(k_.data(), T, nkv, hd, c.rope.rotary_dim, positions_.data(), rope_.inv_freq.data(),
                       rope_.attn_factor);

    paged_attention(batch, kv, l, q_.data(), k_.data(), v_.data(), nh, nkv, hd, scale, attn_.data());
    kernels::linear(attn_.data(), T, L.wo, xn_.data());
    shard_.all_reduce(xn_.data(), T * H, shard_.tensor_parallel());  // row-parallel o_proj: sum the heads' parts
    add_bias(xn_.data(), L.bo, T);
    if (dump_) dump_->write("attn_out", static_cast<int>(l), xn_.data(), T, H);
    kernels::add(x_.data(), xn_.data(), T * H);
    // The last layer's MLP feeds only the logits: without them, skip it (and its all-reduce).
    if (l + 1 == c.num_layers && (batch.num_logit_rows() == 0 || logits == nullptr) && shard_.merged_sync()) break;

    kernels::rmsnorm(x_.data(), L.ffn_norm.data(), xn_.data(), T, H, c.rms_norm_eps);
    if (dump_) dump_->write("ffn_norm", static_cast<int>(l), xn_.data(), T, H);
    if (L.moe) {
      ffn_out_.resize(static_cast<size_t>(T * H));
      // Combined across ranks (experts split by rank under EP, their columns under TP).
      shard_.moe(moe_, L.experts, xn_.data(), T, H, ffn_out_.data(), counts_.data() + l * c.num_experts);
      kernels::add(x_.data(), ffn_out_.data(), T * H);
      if (dump_) dump_layer_end(static_cast<int>(l), ffn_out_.data(), T);
      continue;
    }
    {
      const LinearWeight* ws[] = {&L.w_gate, &L.w_up};
      float* ys[] = {gate_.data(), up_.data()};
      kernels::linear_multi(xn_.data(), T, ws, ys);
    }
    kernels::silu_mul(gate_.data(), up_.data(), T * F);
    kernels::linear(gate_.data(), T, L.w_down, xn_.data());
    shard_.all_reduce(xn_.data(), T * H, shard_.tensor_parallel());  // row-parallel down
    kernels::add(x_.data(), xn_.data(), T * H);
    if (dump_) dump_layer_end(static_cast<int>(l), xn_.data(), T);
  }

  // Only the rows that need logits go through the final norm and the head.
  const int64_t R = batch.num_logit_rows();
  if (R == 0 || logits == nullptr) return;
  gather_logit_rows(batch, x_.data(), H, rows_);
  kernels::rmsnorm(rows_.data(), final_norm_.data(), rows_.data(), R, H, c.rms_norm_eps);
  head_logits(shard_, rows_.data(), R, H, lm_head_, c.vocab_size, logits, dump_);
}

}  // namespace

std::unique_ptr<Model> create_llama_model(const ModelConfig& cfg, ModelWeights weights, const LoadOptions& options) {
  return std::make_unique<LlamaModel>(cfg, std::move(weights), options);
}

}  // namespace infera
