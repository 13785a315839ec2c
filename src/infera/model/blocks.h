// Building blocks shared by the MoE and hybrid architectures (qwen3_moe.cpp, qwen35.cpp):
// the paged-KV attention step, a SwiGLU MLP, the mixture-of-experts FFN (router, optional
// sigmoid-gated shared expert) and the Gated DeltaNet linear-attention layer.
//
// Activations are f32 row-major [T, ...] over the T tokens of a batch; weights are used in
// place (kernels::MatRef, or kernels::LinearWeight where a layer may be quantized by
// `infera quantize`: MLPs, experts, the shared expert, GDN projections).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "infera/io/safetensors.h"
#include "infera/kernels/delta.h"
#include "infera/kernels/kernels.h"
#include "infera/kernels/moe.h"
#include "infera/kernels/quant.h"
#include "infera/model/config.h"
#include "infera/model/model.h"
#include "infera/model/quantized_weights.h"

namespace infera {

class ModelWeights;

// ---- attention over the paged KV cache ----

// Stores the batch's new K/V rows of KV layer `kv_layer` into the cache, then causal
// attention per chunk. q: [T, nh, hd]; k, v: [T, nkv, hd]; out: [T, nh, hd].
void paged_attention(const ForwardBatch& batch, KvPool& kv, int64_t kv_layer, const float* q, const float* k,
                     const float* v, int64_t nh, int64_t nkv, int64_t hd, float scale, float* out);

// The hidden rows that need logits, in ForwardBatch order (per chunk: all rows when
// all_logits, else the last when last_logits): rows [num_logit_rows, H].
void gather_logit_rows(const ForwardBatch& batch, const float* x, int64_t H, std::vector<float>& rows);

// Positions of the batch's tokens, [T].
void batch_positions(const ForwardBatch& batch, std::vector<int32_t>& positions);

// An MTP head's input rows [T, 2H]: per token [rmsnorm(embed(token), enorm) ;
// rmsnorm(hidden row, hnorm)], the embedding first (ids checked; w_offset as kernels::rmsnorm).
void mtp_input_rows(const ForwardBatch& batch, int64_t vocab_size, const kernels::LinearWeight& embed,
                    const float* enorm, const float* hnorm, const float* hidden, int64_t H, float eps, float w_offset,
                    std::vector<float>& out);

// ---- SwiGLU MLP ----

struct SwigluWeights {
  kernels::LinearWeight gate{}, up{}, down{};  // [F, H], [F, H], [H, F]; float or quantized
  int64_t inter() const { return gate.rows(); }
  bool empty() const { return gate.rows() == 0; }
  int64_t bytes() const { return gate.bytes() + up.bytes() + down.bytes(); }
};

// Binds layer `layer`'s MLP (ffn_gate, ffn_up, ffn_down), or its shared expert
// (ffn_*_shexp) when `shared`.
SwigluWeights bind_swiglu(const ModelWeights& weights, int layer, bool shared = false);

// y[T, H] = down(silu(gate x) * up x). scratch grows as needed.
void swiglu(const SwigluWeights& w, const float* x, int64_t T, float* y, std::vector<float>& scratch);

// Rows [r0, r1) of a float or quantized matrix, as a matrix of their own (a view: rows are
// contiguous in both layouts). A quantized matrix's repacked copy is shared when r0 and r1
// fall on its 16-row panels (kernels::quant_row_slice); elsewhere the slice has none.
kernels::LinearWeight linear_row_slice(const kernels::LinearWeight& w, int64_t r0, int64_t r1);

// ---- mixture of experts ----

struct MoeWeights {
  kernels::MatRef router{};  // [E, H], kept in its stored float dtype
  // Per expert [I, H], [I, H], [H, I], float or quantized. An expert with no weights
  // (has_expert() false) is another rank's under expert parallelism: counted, not computed.
  std::vector<kernels::LinearWeight> gate, up, down;
  SwigluWeights shared;  // Qwen3-Next / Qwen3.5 / DeepSeek shared expert (empty: none)
  kernels::MatRef shared_gate{};  // [1, H]: sigmoid gate of the shared expert (float); none (DeepSeek): ungated
  int64_t top_k = 0;
  bool norm_topk_prob = false;
  // DeepSeek routing (scoring_func sigmoid, kernels::moe_route_sigmoid): sigmoid scores,
  // selection on score + score_bias (e_score_correction_bias) within the topk_group best of
  // n_group groups, weights the unbiased scores (renormalised when norm_topk_prob) times
  // routed_scaling. Off: softmax routing.
  bool sigmoid_scores = false;
  std::vector<float> score_bias;  // [E] or empty
  int64_t n_group = 1, topk_group = 1;
  float routed_scaling = 1.0f;
  int64_t n_experts() const { return router.rows; }
  bool has_expert(int64_t e) const { return gate[e].quantized || gate[e].dense.data || gate[e].dense.panels; }
  // Forgets expert e (another rank's). The part of a fused tensor's repacked copy holding it
  // is given back to the system when nothing else holds this expert's views.
  void drop_expert(int64_t e);
  int64_t weight_bytes_active() const;  // bytes read per token: router, top_k experts, shared
};

// Routes T tokens from router logits [T, E] (softmax, or DeepSeek's sigmoid routing when
// w.sigmoid_scores): ids / weights [T, top_k].
void route_experts(const MoeWeights& w, const float* logits, int64_t T, int32_t* ids, float* weights);

// Binds layer `layer`'s MoE block: the router (ffn_gate_inp), the experts stored per expert
// (ffn_{gate,up,down}_exps of each expert: Qwen3-MoE, Qwen3-Next) or fused 3-D
// (ffn_gate_up_exps [E, 2I, H] with gate rows first, ffn_down_exps [E, H, I]: Qwen3.5), and
// the shared expert with its sigmoid gate when the table has them (DeepSeek's is ungated). From a quantized
// checkpoint (SafetensorsSource) the router and the shared-expert gate are float; quantized
// experts get the repacked copy (a fused tensor packed once, each expert a view of it) and
// their mapped pages are released (release_repacked_source).
MoeWeights bind_moe(const ModelWeights& weights, int layer);
// The lone MoE block whose tensors are under `block_prefix` ("model.layers.3.") of a
// safetensors store, as the architecture's table lays out such a block (tests).
MoeWeights bind_moe_block(const WeightStore& store, const std::string& block_prefix, const ModelConfig& cfg,
                          const QuantizationConfig& qc = {});

// Calibration hook for routed experts (their matmuls bypass kernels::linear() and its
// observer): when set, MoeFfn::forward runs the per-expert schedule on one thread's call
// path and hands each active expert's inputs to the observer: the rows of the tokens routed
// to expert `expert` for its gate and up matrices (once when both are halves of one fused
// tensor, which share a name), and silu(gate) * up for its down matrix. `weight_name` is the
// expert matrix's checkpoint name. Process-wide; set it only while nothing else runs a MoE
// layer. An empty function removes it.
using ExpertObserver =
    std::function<void(std::string_view weight_name, int64_t expert, const float* x, int64_t m, int64_t k)>;
void set_expert_observer(ExpertObserver observer);

// Runs the MoE FFN over a batch: y[T, H] = Σ_j w_j Expert_j(x) (+ sigmoid(g·x) Shared(x)).
// Only active experts' weights are read. Two schedules, same arithmetic per row:
//   per expert (one thread, or a small decode step): tokens grouped by expert, one GEMM per
//     active expert, each GEMM split over threads by the kernel;
//   work items (several threads: prefill, and decode with enough expert weights): tokens
//     grouped by expert as well, and one parallel region runs (expert, row block) items of
//     every active expert's gate/up (the shared expert's too; a block of a prefill is
//     usually the expert's whole matrix, one GEMM over its tokens), then (expert, row
//     block) items of the down projections, then sums the experts' outputs by column
//     blocks: three barriers per layer instead of three per active expert, and eight small
//     GEMVs of a decode step keep every thread busy instead of running one at a time, each
//     split thinly. Outputs are summed in expert order, as the per-expert schedule does,
//     so the result does not depend on the schedule or the thread count.
//   A decode step on several threads whose active experts are all GGUF matrices with panels
//     over lanes runs, under auto, as two shared passes instead (run_one_token_shared):
//     every gate and up matrix, then every down matrix, each pass's panels shared among the
//     threads as one matrix's are; the same values.
class MoeFfn {
 public:
  enum class Schedule { kAuto, kPerExpert, kWorkItems };
  // kAuto: work items with more than one thread, for more than kWorkItemMaxTokens tokens
  // (prefill) or with at least 256 KiB of active expert weights; per expert otherwise.
  static constexpr int64_t kWorkItemMaxTokens = 16;

  // The schedule starts as INFERA_MOE_SCHEDULE says (auto, per_expert, work_items; unset:
  // auto), so benchmarks can compare them; throws infera::Error for another value.
  MoeFfn();

  // counts [E]: incremented by the number of tokens routed to each expert.
  void forward(const MoeWeights& w, const float* x, int64_t T, int64_t H, float* y, uint64_t* counts);
  void set_schedule(Schedule s) { schedule_ = s; }  // tests and benchmarks
  // Tokens per pass of the work-item schedule (0: as many as 256 MiB of scratch holds);
  // tests set a small one to cover the chunking.
  void set_chunk_tokens(int64_t n) { chunk_tokens_ = n; }

 private:
  // One active expert of a forward: its weights and the tokens routed to it.
  struct Active {
    const kernels::LinearWeight *gate, *up, *down;
    const int32_t* rows;  // [n] token rows
    const float* weights;  // [n] router weights (sigmoid gate for the shared expert)
    int64_t n, inter;
    const float* x;  // [n, H] its input rows
    float* h;  // [n, inter] silu(gate x) * up x
    float* out;  // [n, H] down h
  };
  // A block of rows [begin, end) of one active expert's matrices.
  struct Item {
    int32_t active;
    int64_t begin, end;
  };
  void run_per_expert(const MoeWeights& w, const float* x, int64_t T, int64_t H, float* y);
  // run_per_expert for one token with quantized experts: all gate/up in one joint pass.
  // false (nothing done) when an active expert is not quantized.
  bool run_one_token(const MoeWeights& w, const float* x, int64_t H, float* y);
  // One token whose active experts (and shared expert) are all GGUF matrices with panels
  // (kernels::matvec_shares): every gate and up in one kernels::matvec_many pass, then every
  // down in another, the threads sharing all of a pass's panels (no (expert, row block) items,
  // no wait per matrix); outputs summed in expert order as the work items do. false (nothing
  // done) otherwise. groups_ must hold the token's routing.
  bool run_one_token_shared(const MoeWeights& w, const float* x, int64_t H, float* y);
  void add_shared_expert(const MoeWeights& w, const float* x, int64_t T, int64_t H, float* y);
  void run_work_items(const MoeWeights& w, const float* x, int64_t T, int64_t H, float* y, int threads);
  int64_t work_item_chunk(const MoeWeights& w, int64_t H) const;

  Schedule schedule_ = Schedule::kAuto;
  int64_t chunk_tokens_ = 0;
  std::vector<float> logits_, route_w_, xg_, gate_, up_, out_, shared_, sgate_, h_;
  std::vector<int32_t> route_ids_, all_rows_;
  std::vector<Active> active_;
  std::vector<Item> items_;  // phase 1 (gate/up row blocks), then phase 2 (down row blocks)
  std::vector<int64_t> experts_;  // run_one_token: active experts
  std::vector<const kernels::QuantMatRef*> joint_mats_;  // their gate, up, gate, up, ...
  std::vector<float*> joint_outs_;
  std::vector<kernels::MatVec> steps_;  // run_one_token_shared's
  kernels::ExpertGroups groups_;
};

// ---- Gated DeltaNet (linear attention) ----

struct GdnWeights {
  // Float or quantized (`infera quantize`); the gate projections in_b / in_a / in_ba stay
  // as stored by the quantizer (docs/quantization.md) but are bound the same way.
  // Qwen3.5 layout: separate projections.
  kernels::LinearWeight in_qkv{};  // [2 Hk dk + Hv dv, H]: rows q | k | v
  kernels::LinearWeight in_z{};  // [Hv dv, H]
  kernels::LinearWeight in_b{};  // [Hv, H]
  kernels::LinearWeight in_a{};  // [Hv, H]
  // Qwen3-Next layout: the same rows fused and interleaved per key-head group g < Hk
  // (r = Hv / Hk value heads per group), used in place; forward() de-interleaves the
  // projected activations as transformers' fix_query_key_value_ordering does.
  kernels::LinearWeight in_qkvz{};  // [Hk (2 dk + 2 r dv), H]: per group q_g (dk) | k_g (dk) | v_g (r dv) | z_g (r dv)
  kernels::LinearWeight in_ba{};  // [2 Hv, H]: per group b_g (r) | a_g (r)
  kernels::LinearWeight out{};  // [H, Hv dv]
  std::vector<float> conv_w;  // [conv_dim, kernel]
  std::vector<float> neg_exp_a;  // [Hv] = -exp(A_log)
  std::vector<float> dt_bias;  // [Hv]
  std::vector<float> norm;  // [dv] (plain weight)
  // in_qkv's v rows, in_z / in_b / in_a rows and out's columns in llama.cpp's tiled value-head
  // order (ModelConfig::gdn_value_heads_tiled); forward() moves the activations.
  bool value_heads_tiled = false;
  bool fused() const { return in_qkvz.rows() > 0; }
  int64_t weight_bytes() const;  // bytes of the projection matrices read per token
};

struct GdnDims {
  int64_t n_k_heads = 0, n_v_heads = 0, dk = 0, dv = 0, kernel = 0;
  int64_t key_dim() const { return n_k_heads * dk; }
  int64_t value_dim() const { return n_v_heads * dv; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t conv_state_floats() const { return (kernel - 1) * conv_dim(); }
  int64_t ssm_state_floats() const { return n_v_heads * dk * dv; }
  kernels::DeltaShape delta_shape() const { return {n_k_heads, n_v_heads, dk, dv}; }
};

GdnDims gdn_dims(const ModelConfig& cfg);

// Binds layer `layer`'s GDN weights, split or fused as the table has them (gdn_qkvz: the
// fused layout). Throws infera::Error naming the tensor (and, for a fused one, its expected
// layout) when a tensor is missing or mis-shaped.
GdnWeights bind_gdn(const ModelWeights& weights, int layer, const GdnDims& d);

// One GDN layer over the batch. x: [T, H] (normed input) -> y: [T, H]. states[i] is the
// recurrent state of batch.seqs[i]: conv state [kernel-1, conv_dim] followed by S
// [Hv, dk, dv]; zeroed here for a chunk starting at position 0 (a fresh sequence).
// Chunks of more than one token use the chunked delta rule, single tokens the recurrence.
// token_states (optional; empty, or one per chunk, nullptr where not wanted): for a chunk
// with SeqChunk::token_states, where to write the state after each of its first
// n_tokens - 1 tokens, snapshot t at token_states[i] + t * token_state_stride (floats), in
// the layout of states[i]. Such a chunk runs the recurrence token by token, so snapshot t
// is bit for bit the state that decoding its first t + 1 tokens one at a time leaves.
class GdnLayer {
 public:
  void forward(const GdnWeights& w, const GdnDims& d, const ForwardBatch& batch, const float* x, int64_t H,
               const std::vector<float*>& states, float eps, float* y, const std::vector<float*>& token_states = {},
               int64_t token_state_stride = 0);

 private:
  std::vector<float> mixed_, z_, a_, b_, g_, beta_, q_, k_, v_, o_, qkvz_, ba_;
  std::vector<float> heads_;  // [Hv dv]: one row's value heads being moved (GdnWeights::value_heads_tiled)
  std::vector<float> window_;  // [kernel - 1 + n_tokens, conv_dim]: conv inputs of a chunk keeping token states
};

}  // namespace infera
