// Qwen3.5 hybrid (qwen3_5 dense, qwen3_5_moe): a stack of Gated DeltaNet linear-attention
// layers and gated full-attention layers (ModelConfig::layer_types), each followed by a
// SwiGLU MLP (qwen3_5) or an MoE with a sigmoid-gated shared expert (qwen3_5_moe), plus the
// optional MTP head (mtp.*) for speculative drafting. ARCHITECTURES.md section 4.
//
//   layer: x += Mixer(rms0(x)); x += FFN(rms0(x))          rms0(x) = norm(x) * (1 + w)
//   GatedAttn: [q | gate] = Wq a per head; q, k = rope(rms0_head(q), rms0_head(k)) on the
//              first rotary_dim dims (NeoX); o = attn(q, k, v) * sigmoid(gate); Wo o
//   GDN: see blocks.h (conv state + delta-rule state per sequence, in SeqChunk::state)
//   MTP: u = W_fc [rms0_e(embed(x_{p+1})) ; rms0_h(h_p)]; u = Block_full(u); logits = head(rms0(u))
//
// Checkpoint layout of the published Qwen3.5 models: model.language_model.* (text),
// lm_head.weight, mtp.*; model.visual.* is ignored (text only).
// Qwen3-Next (qwen3_next, Qwen3NextForCausalLM) is the same network with a flat layout
// (model.*), per-expert MoE weights, optional dense-MLP layers (mlp_only_layers /
// decoder_sparse_step) and the GDN input projections fused per key-head group
// (in_proj_qkvz, in_proj_ba; see GdnWeights). All its RMSNorms are (1 + w) too, except
// linear_attn.norm.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "infera/base/error.h"
#include "infera/kernels/kernels.h"
#include "infera/model/arch_registry.h"
#include "infera/model/blocks.h"
#include "infera/model/model.h"
#include "infera/model/rope.h"
#include "infera/model/tensor_dump.h"
#include "infera/model/tensor_parallel.h"
#include "infera/model/weights.h"

namespace infera {
namespace {

// Zero-centred RMSNorm weights are applied as (1 + w).
constexpr float kZeroCentred = 1.0f;

struct AttnWeights {
  // [nh*hd*(gate ? 2 : 1), H], [nkv*hd, H] x2, [H, nh*hd]; float or quantized
  kernels::LinearWeight wq{}, wk{}, wv{}, wo{};
  std::vector<float> q_norm, k_norm;  // [hd], zero-centred
};

struct HybridLayer {
  bool linear = false;
  std::vector<float> attn_norm, ffn_norm;  // [H], zero-centred
  AttnWeights attn;  // full-attention layers
  GdnWeights gdn;  // linear-attention layers
  int64_t kv_layer = -1;  // index in the KV pool (full attention)
  int64_t state_index = -1;  // index among the GDN layers
  bool moe = false;
  MoeWeights experts;
  SwigluWeights mlp;
};

struct MtpWeights {
  kernels::LinearWeight fc{};  // [H, 2H], float or quantized
  std::vector<float> enorm, hnorm, norm;  // [H], zero-centred
  HybridLayer layer;  // full attention + FFN
};

class Qwen35Model final : public Model, public MtpHead {
 public:
  Qwen35Model(const ModelConfig& cfg, ModelWeights weights, const LoadOptions& options)
      : weights_(std::move(weights)), shard_(options.parallel, cfg, weights_.where()) {
    config_ = cfg;
    if (cfg.attention_bias) fail("{}: attention_bias is not supported for {}", weights_.where(), cfg.model_type);
    const ModelWeights& w = weights_;
    // Published Qwen3.5 checkpoints nest the language model (model.language_model.*), text-
    // only exports use model.*; `infera quantize` output may quantize attention, GDN, MTP fc,
    // MLPs and experts, and with --embed-head the embeddings and head (rows of a quantized
    // table are dequantized on lookup). The table and the source settle both.
    embed_ = w.linear(-1, "token_embd");
    final_norm_ = w.vector(-1, "output_norm");
    lm_head_ = cfg.tie_word_embeddings ? embed_ : shard_.head(w.linear(-1, "output"));
    dims_ = gdn_dims(cfg);
    layers_.resize(cfg.num_layers);
    for (int i = 0; i < cfg.num_layers; ++i) {
      HybridLayer& L = layers_[i];
      L.linear = cfg.is_linear_attention_layer(i);
      bind_layer(i, i, L);
      if (L.linear)
        L.state_index = n_linear_++;
      else
        L.kv_layer = n_full_++;
    }
    dims_ = shard_.gdn_dims(dims_);  // the layers' GDN weights are this rank's heads from here on
    // MTP head: present in the published checkpoints; optional (speculative decoding only).
    // Qwen3-Next's config.json does not declare it: the mtp.layers.* tensors do.
    config_.mtp_num_hidden_layers = mtp_layers(cfg, w.source().has_tensor());
    const int mtp_layers = config_.mtp_num_hidden_layers;
    const int m = cfg.num_layers;  // the MTP layer's index in the table
    // Drafting is not mirrored across ranks (ParallelModel), so a group leaves the head unloaded.
    if (mtp_layers > 0 && w.has(m, "mtp_eh_proj") && w.has(m, "attn_norm") && !shard_.distributed()) {
      if (mtp_layers > 1) {
        fail("{}: the checkpoint has {} MTP layers; only a single MTP layer is supported", w.where(), mtp_layers);
      }
      mtp_.fc = w.linear(m, "mtp_eh_proj");
      mtp_.enorm = w.vector(m, "mtp_enorm");
      mtp_.hnorm = w.vector(m, "mtp_hnorm");
      mtp_.norm = w.vector(m, "mtp_head_norm");
      mtp_.layer.linear = false;
      bind_layer(m, -1, mtp_.layer);
      mtp_.layer.kv_layer = n_full_;  // one KV layer after the trunk's
      has_mtp_ = true;
    }
    layer_state_floats_ = dims_.conv_state_floats() + dims_.ssm_state_floats();
    counts_.assign(static_cast<size_t>(cfg.num_layers) * std::max(cfg.num_experts, 0), 0);
    rope_ = compute_rope_tables(cfg.rope, cfg.rope.rotary_dim);
    (void)options;
  }

  KvPoolShape kv_shape(int64_t block_size) const override {
    KvPoolShape s = sequence_geometry(config_, has_mtp_ ? 1 : 0, DType::kF32, block_size).kv;
    s.n_kv_heads = shard_.kv_heads.size();  // this rank's KV heads (all in one process)
    return s;
  }

  int64_t weight_bytes_per_token() const override {
    int64_t bytes = lm_head_.bytes() + embed_.bytes() / config_.vocab_size;  // the head, one embedding row
    for (const auto& L : layers_) bytes += layer_bytes(L);
    return bytes;
  }

  int64_t num_parameters() const override { return weights_.num_parameters(); }

  // Per sequence, per GDN layer: conv state then S (GdnLayer's layout); this rank's heads.
  // Per-token states (verification) run the token-by-token recurrence, which a tensor-
  // parallel group could run too, but the runtime cannot copy a group's state (it is split
  // over the ranks), so neither they nor snapshots are offered there.
  StateShape state_shape() const override {
    StateShape s;
    s.num_layers = n_linear_;
    s.floats_per_layer = n_linear_ > 0 ? layer_state_floats_ : 0;
    s.token_states = n_linear_ > 0 && !shard_.distributed();
    s.local = !shard_.distributed();
    return s;
  }

  std::vector<uint64_t> expert_counts() const override { return counts_; }
  void reset_expert_counts() override { std::fill(counts_.begin(), counts_.end(), 0); }

  MtpHead* mtp_head() override { return has_mtp_ ? this : nullptr; }
  const float* last_hidden() const override { return hidden_.data(); }
  void set_hidden_for_all_tokens(bool on) override { hidden_all_tokens_ = on; }

  void forward(const ForwardBatch& batch, KvPool& kv, float* logits) override;
  void draft(const ForwardBatch& batch, const float* hidden, KvPool& kv, float* logits) override;

 private:
  // Binds table layer `layer` (the MTP layer after the trunk's); `index` is the trunk layer
  // whose MLP kind applies (-1: the MTP layer).
  void bind_layer(int layer, int index, HybridLayer& L) {
    const ModelConfig& c = config_;
    const ModelWeights& w = weights_;
    L.attn_norm = w.vector(layer, "attn_norm");
    L.ffn_norm = w.vector(layer, "ffn_norm");
    if (L.linear) {
      L.gdn = bind_gdn(w, layer, dims_);  // split (Qwen3.5) or fused per key-head group (Qwen3-Next)
    } else {
      L.attn.wq = w.linear(layer, "attn_q");
      L.attn.wk = w.linear(layer, "attn_k");
      L.attn.wv = w.linear(layer, "attn_v");
      L.attn.wo = w.linear(layer, "attn_output");
      L.attn.q_norm = w.vector(layer, "attn_q_norm");
      L.attn.k_norm = w.vector(layer, "attn_k_norm");
    }
    // Qwen3.5 layers are all MoE when the model has experts (the MTP layer too).
    L.moe = c.num_experts > 0 && (index < 0 || c.is_moe_layer(index));
    if (L.moe) {
      L.experts = bind_moe(w, layer);
    } else {
      L.mlp = bind_swiglu(w, layer);
    }
    shard_layer(L);
  }

  // Tensor / expert parallel (tensor_parallel.h): this rank's attention heads (q rows with
  // their gate rows, k/v rows, o_proj columns), GDN heads, MLP columns and experts. The
  // layer's two outputs are then partial sums, all-reduced in run_layer. One process: no-op.
  void shard_layer(HybridLayer& L) {
    if (!shard_.distributed()) return;
    const int64_t hd = config_.head_dim, q_rows_per_head = hd * (config_.attn_output_gate ? 2 : 1);
    if (L.linear) {
      shard_.shard_gdn(L.gdn, dims_);
    } else {
      const parallel::Range kv{shard_.kv_heads.begin * hd, shard_.kv_heads.end * hd};
      L.attn.wq = shard_.rows(L.attn.wq, parallel::Range{shard_.heads.begin * q_rows_per_head,
                                                         shard_.heads.end * q_rows_per_head});
      L.attn.wk = shard_.rows(L.attn.wk, kv);
      L.attn.wv = shard_.rows(L.attn.wv, kv);
      L.attn.wo = shard_.columns(L.attn.wo, parallel::Range{shard_.heads.begin * hd, shard_.heads.end * hd});
    }
    if (L.moe) {
      shard_.shard_moe(L.experts);
    } else {
      L.mlp.gate = shard_.rows(L.mlp.gate, shard_.ffn);
      L.mlp.up = shard_.rows(L.mlp.up, shard_.ffn);
      L.mlp.down = shard_.columns(L.mlp.down, shard_.ffn);
    }
  }

  static int64_t layer_bytes(const HybridLayer& L) {
    int64_t b = 0;
    if (L.linear) {
      b += L.gdn.weight_bytes();
    } else {
      for (const kernels::LinearWeight* m : {&L.attn.wq, &L.attn.wk, &L.attn.wv, &L.attn.wo}) b += m->bytes();
    }
    if (L.moe)
      b += L.experts.weight_bytes_active();
    else
      b += L.mlp.bytes();
    return b;
  }

  void reserve(int64_t T) {
    const ModelConfig& c = config_;
    const int64_t H = c.hidden_size, qd = c.num_heads * c.head_dim;
    x_.resize(T * H);
    xn_.resize(T * H);
    out_.resize(T * H);
    qfull_.resize(T * qd * 2);
    q_.resize(T * qd);
    gate_.resize(T * qd);
    k_.resize(T * c.num_kv_heads * c.head_dim);
    v_.resize(T * c.num_kv_heads * c.head_dim);
    attn_.resize(T * qd);
  }

  // x [T, H] <- x + Mixer(rms0(x)); x <- x + FFN(rms0(x)).
  void run_layer(const HybridLayer& L, const ForwardBatch& batch, KvPool& kv, uint64_t* counts);
  void gated_attention(const HybridLayer& L, const ForwardBatch& batch, KvPool& kv, const float* a, float* y);

  ModelWeights weights_;  // keeps the checkpoint the weights below point into
  TensorShard shard_;  // this rank's part (everything in one process)
  kernels::LinearWeight embed_{};  // [V, H], float or quantized
  std::vector<float> final_norm_;  // [H], zero-centred
  kernels::LinearWeight lm_head_{};  // [V, H], float or quantized (embed_ when tied)
  GdnDims dims_;  // this rank's GDN heads (after loading)
  std::vector<HybridLayer> layers_;
  int64_t n_full_ = 0, n_linear_ = 0;
  MtpWeights mtp_;
  bool has_mtp_ = false;
  bool hidden_all_tokens_ = false;  // set_hidden_for_all_tokens()
  RopeTables rope_;
  std::vector<uint64_t> counts_;  // [layers, E]

  // Recurrent state: lives in the runtime's sequence memory (SeqChunk::state).
  int64_t layer_state_floats_ = 0;  // one GDN layer's conv state + S
  std::vector<float*> states_;  // per batch chunk, for the current GDN layer
  std::vector<float*> chunk_token_states_;  // per batch chunk, for the current GDN layer (nullptr: none)

  MoeFfn moe_;
  GdnLayer gdn_;
  std::vector<float> x_, xn_, out_;  // [T, H]
  std::vector<float> qfull_, q_, gate_, k_, v_, attn_;
  std::vector<float> ffn_scratch_, rows_, hidden_, cat_;
  std::vector<int32_t> positions_;
};

void Qwen35Model::gated_attention(const HybridLayer& L, const ForwardBatch& batch, KvPool& kv, const float* a,
                                  float* y) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t nh = shard_.heads.size(), nkv = shard_.kv_heads.size(), hd = c.head_dim, qd = nh * hd;
  const AttnWeights& w = L.attn;
  {
    const kernels::LinearWeight* ws[] = {&w.wq, &w.wk, &w.wv};
    float* ys[] = {c.attn_output_gate ? qfull_.data() : q_.data(), k_.data(), v_.data()};
    kernels::linear_multi(a, T, ws, ys);  // one pass over q, k and v
  }
  if (c.attn_output_gate) {
    // q_proj rows per head: [query (hd) | gate (hd)].
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < nh; ++h) {
        const float* src = qfull_.data() + (t * nh + h) * 2 * hd;
        std::memcpy(q_.data() + (t * nh + h) * hd, src, hd * sizeof(float));
        std::memcpy(gate_.data() + (t * nh + h) * hd, src + hd, hd * sizeof(float));
      }
    }
  }
  kernels::rmsnorm(q_.data(), w.q_norm.data(), q_.data(), T * nh, hd, c.rms_norm_eps, kZeroCentred);
  kernels::rmsnorm(k_.data(), w.k_norm.data(), k_.data(), T * nkv, hd, c.rms_norm_eps, kZeroCentred);
  // Text-only positions make Qwen3.5's interleaved M-RoPE plain NeoX RoPE on rotary_dim dims.
  kernels::rope_neox(q_.data(), T, nh, hd, c.rope.rotary_dim, positions_.data(), rope_.inv_freq.data(),
                     rope_.attn_factor);
  kernels::rope_neox(k_.data(), T, nkv, hd, c.rope.rotary_dim, positions_.data(), rope_.inv_freq.data(),
                     rope_.attn_factor);
  paged_attention(batch, kv, L.kv_layer, q_.data(), k_.data(), v_.data(), nh, nkv, hd,
                  1.0f / std::sqrt(static_cast<float>(hd)), attn_.data());
  if (c.attn_output_gate) {
    for (int64_t i = 0; i < T * qd; ++i) attn_[i] *= 1.0f / (1.0f + std::exp(-gate_[i]));
  }
  kernels::linear(attn_.data(), T, w.wo, y);
}

void Qwen35Model::run_layer(const HybridLayer& L, const ForwardBatch& batch, KvPool& kv, uint64_t* counts) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size()), H = c.hidden_size;
  kernels::rmsnorm(x_.data(), L.attn_norm.data(), xn_.data(), T, H, c.rms_norm_eps, kZeroCentred);
  if (L.linear) {
    states_.clear();
    chunk_token_states_.clear();
    const int64_t offset = L.state_index * layer_state_floats_;
    for (const SeqChunk& s : batch.seqs) {
      states_.push_back(s.state + offset);  // checked in forward()
      chunk_token_states_.push_back(s.token_states != nullptr ? s.token_states + offset : nullptr);
    }
    gdn_.forward(L.gdn, dims_, batch, xn_.data(), H, states_, c.rms_norm_eps, out_.data(), chunk_token_states_,
                 n_linear_ * layer_state_floats_);
  } else {
    gated_attention(L, batch, kv, xn_.data(), out_.data());
  }
  shard_.all_reduce(out_.data(), T * H, shard_.tensor_parallel());  // row-parallel out/o_proj
  kernels::add(x_.data(), out_.data(), T * H);

  kernels::rmsnorm(x_.data(), L.ffn_norm.data(), xn_.data(), T, H, c.rms_norm_eps, kZeroCentred);
  if (L.moe) {
    shard_.moe(moe_, L.experts, xn_.data(), T, H, out_.data(), counts);  // combined across ranks
  } else {
    swiglu(L.mlp, xn_.data(), T, out_.data(), ffn_scratch_);
    shard_.all_reduce(out_.data(), T * H, shard_.tensor_parallel());  // row-parallel down
  }
  kernels::add(x_.data(), out_.data(), T * H);
}

void Qwen35Model::forward(const ForwardBatch& batch, KvPool& kv, float* logits) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  if (T == 0) return;
  const int64_t H = c.hidden_size;
  if (static_cast<int64_t>(x_.size()) < T * H) reserve(T);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t tok = batch.tokens[t];
    INFERA_ASSERT(tok >= 0 && tok < c.vocab_size, "token id out of range");
    linear_row(embed_, tok, x_.data() + t * H);
  }
  batch_positions(batch, positions_);
  if (dump_) {
    dump_->begin_forward();
    dump_->write("embed", -1, x_.data(), T, H);
  }
  if (n_linear_ > 0) {
    for (const SeqChunk& s : batch.seqs) {
      if (s.state == nullptr) {
        fail(
            "a chunk of {} tokens at position {} has no recurrent state: a {} model's sequences need "
            "SeqChunk::state ({} floats, Model::state_shape(); runtime/sequence_memory.h)",
            s.n_tokens, s.pos0, c.model_type, n_linear_ * layer_state_floats_);
      }
      if (s.token_states != nullptr && shard_.distributed()) {
        fail("per-token recurrent states are not kept on a tensor-parallel group (StateShape::token_states)");
      }
    }
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    uint64_t* counts = layers_[l].moe ? counts_.data() + l * c.num_experts : nullptr;
    run_layer(layers_[l], batch, kv, counts);
    if (dump_) dump_->write("layer_out", static_cast<int>(l), x_.data(), T, H);
  }
  const int64_t R = batch.num_logit_rows();
  if (hidden_all_tokens_) {
    // The norm is per row, so normalizing every row and then gathering the logits rows
    // gives the same rows as the other branch.
    hidden_.resize(static_cast<size_t>(T * H));
    kernels::rmsnorm(x_.data(), final_norm_.data(), hidden_.data(), T, H, c.rms_norm_eps, kZeroCentred);
    gather_logit_rows(batch, hidden_.data(), H, rows_);
  } else {
    gather_logit_rows(batch, x_.data(), H, rows_);
    kernels::rmsnorm(rows_.data(), final_norm_.data(), rows_.data(), R, H, c.rms_norm_eps, kZeroCentred);
    hidden_.assign(rows_.begin(), rows_.end());  // post-final-norm hidden: the MTP input
  }
  if (R == 0 || logits == nullptr) return;
  head_logits(shard_, rows_.data(), R, H, lm_head_, c.vocab_size, logits, dump_);
}

void Qwen35Model::draft(const ForwardBatch& batch, const float* hidden, KvPool& kv, float* logits) {
  if (!has_mtp_) fail("{}: this checkpoint has no MTP weights (mtp.*); drafting needs them", weights_.where());
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  if (T == 0) return;
  const int64_t H = c.hidden_size;
  if (static_cast<int64_t>(x_.size()) < T * H) reserve(T);
  // u = W_fc [rms0_e(embed(x_{p+1})) ; rms0_h(h_p)] (embedding first).
  mtp_input_rows(batch, c.vocab_size, embed_, mtp_.enorm.data(), mtp_.hnorm.data(), hidden, H, c.rms_norm_eps,
                 kZeroCentred, cat_);
  kernels::linear(cat_.data(), T, mtp_.fc, x_.data());
  // The MTP entry for (h_p, x_{p+1}) is cached in KV slot p (so slots 0..p are all MTP
  // entries when drafting at p) and rotated as position p + 1, as the HF reference does.
  batch_positions(batch, positions_);
  for (int32_t& p : positions_) p += 1;
  run_layer(mtp_.layer, batch, kv, nullptr);
  const int64_t R = batch.num_logit_rows();
  if (R == 0 || logits == nullptr) return;
  gather_logit_rows(batch, x_.data(), H, rows_);
  kernels::rmsnorm(rows_.data(), mtp_.norm.data(), rows_.data(), R, H, c.rms_norm_eps, kZeroCentred);
  // `hidden` may point into hidden_ (recursive drafting): it has been read by now.
  hidden_.assign(rows_.begin(), rows_.end());
  kernels::linear(rows_.data(), R, lm_head_, logits);
}

}  // namespace

std::unique_ptr<Model> create_qwen35_model(const ModelConfig& cfg, ModelWeights weights, const LoadOptions& options) {
  return std::make_unique<Qwen35Model>(cfg, std::move(weights), options);
}

}  // namespace infera
