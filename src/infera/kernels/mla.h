// Kernels of the DeepSeek family (model/deepseek.cpp): multi-head latent attention (MLA)
// over the compressed KV cache, RoPE with interleaved pairs, and the group-limited
// sigmoid router with a selection-only score bias.
//
// The latent cache: per token and layer one row [c_kv (R = kv_lora_rank) | k_pe (P =
// qk_rope_head_dim)], stored in a paged KvPool of one KV head whose K half holds the
// first `head_dim` values of the row and whose V half the rest (zero padded when R + P is
// odd); mla_load_latent() reads rows back as f32 whatever the pool's dtype.
//
// Attention in two forms, equal in exact arithmetic (ARCHITECTURES.md section 5.3):
//   absorbed (decode): per head q̃ = W_UKᵀ q_nope (R wide) is scored against c_kv directly,
//     q_pe against k_pe, and the output stays latent (Σ p c_kv, R wide) until W_UV;
//   naive (prefill): k_nope and v per head are expanded from c_kv by kv_b_proj, and the
//     heads attend as usual with K = [k_nope | k_pe] (k_pe shared by every head).
// Activations f32; scores, softmax and sums in f32 (double in the references). The chunk
// indexer scores and the absorbed, sparse and naive attention have scalar, AVX2 and AVX-512 paths
// (kernels/cpu/mla_impl.h) picked at run time by best_isa() (INFERA_ISA caps it); the
// overloads taking an Isa run that path.
#pragma once

#include <cstdint>

#include "infera/base/cpu.h"
#include "infera/kernels/kernels.h"

namespace infera::kernels {

// RoPE, interleaved pairing (GPT-J style, DeepSeek MLA): pairs (2i, 2i + 1) of the rotated
// part rotate by pos * inv_freq[i]. x: [n_tokens, n_heads, head_stride] in place; the
// rotated part is [offset, offset + rot_dim) of each head; attn_factor multiplies cos and
// sin (YaRN). rot_dim even.
void rope_interleaved(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, int64_t offset, int64_t rot_dim,
                      const int32_t* positions, const float* inv_freq, float attn_factor);

// Rows [p0, p1) of one sequence's latent cache (a KvPool of one KV head, K half then V
// half as above) as f32: out [p1 - p0, 2 * kv.head_dim].
void mla_load_latent(const PagedKv& kv, int64_t p0, int64_t p1, float* out);
// Columns [c0, c1) of those rows only (the V3.2 indexer keys): out [p1 - p0, c1 - c0].
void mla_load_latent_cols(const PagedKv& kv, int64_t p0, int64_t p1, int64_t c0, int64_t c1, float* out);
// The rows of the listed positions (any order): out [n, 2 * kv.head_dim], row j = position
// positions[j].
void mla_load_latent_rows(const PagedKv& kv, const int32_t* positions, int64_t n, float* out);

// Absorbed form. lat: [n_ctx, ld] rows [c (R) | k_pe (P) | ...] (ld >= R + P); q: [n_tokens,
// n_heads, R + P] per head [q̃ | q_pe]. Query token i attends causally to rows
// [0, pos0 + i]. out: [n_tokens, n_heads, R] = Σ_t softmax_t(q · lat_t * scale) c_t.
void mla_attention_absorbed(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* lat,
                            int64_t ld, int64_t R, int64_t P, float scale, float* out);
void mla_attention_absorbed(Isa isa, const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* lat,
                            int64_t ld, int64_t R, int64_t P, float scale, float* out);

// Naive form. q: [n_tokens, n_heads, nope + P] per head [q_nope | q_pe]; kv: [n_ctx,
// n_heads, nope + V] per head [k_nope | v]; k_pe: rows of `k_pe_ld` floats, the first P
// used. out: [n_tokens, n_heads, V]. Causal as above.
void mla_attention_naive(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* kv, int64_t nope,
                         int64_t V, const float* k_pe, int64_t k_pe_ld, int64_t P, float scale, float* out);
void mla_attention_naive(Isa isa, const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* kv,
                         int64_t nope, int64_t V, const float* k_pe, int64_t k_pe_ld, int64_t P, float scale,
                         float* out);

// ---- DeepSeek-V3.2 sparse attention (DSA) ----

// Lightning-indexer scores of one query over keys: out[s] = Σ_h w[h] · max(0, q[h] · k_s)
// for s < n_keys; q [n_heads, d], w [n_heads], key s at keys + s * ld (d values).
void indexer_scores(const float* q, const float* w, int64_t n_heads, int64_t d, const float* keys, int64_t ld,
                    int64_t n_keys, float* out);

// The same for a chunk of n queries at positions pos0 .. pos0 + n - 1, blocked over keys (a
// block of keys is transposed once and used by every query and head): query i scores keys
// [0, pos0 + i] into out[i * out_ld + s], indexer_scores of that query up to the order of
// the f32 sums; the entries of row i past pos0 + i are not written. q [n, n_heads, d],
// w [n, n_heads].
void indexer_scores_chunk(const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                          const float* keys, int64_t ld, float* out, int64_t out_ld);
void indexer_scores_chunk(Isa isa, const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                          const float* keys, int64_t ld, float* out, int64_t out_ld);

// The same with the keys read straight from the paged latent cache (any of its dtypes):
// key s is columns [c0, c0 + d) of cached row s (the V3.2 indexer key), converted to f32
// a block at a time, never copied out as a whole.
void indexer_scores_paged(const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                          const PagedKv& kv, int64_t c0, float* out, int64_t out_ld);
void indexer_scores_paged(Isa isa, const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                          const PagedKv& kv, int64_t c0, float* out, int64_t out_ld);

// The positions of the k largest scores[0, n) (ties: the lower position first), in
// ascending position order; k <= n. A radix select on the scores' order-preserving bit
// patterns (a few histogram passes over shrinking candidate sets), then one scan in
// position order; -0.0 counts as 0.0, and no score may be NaN.
void topk_indices(const float* scores, int64_t n, int64_t k, int32_t* out);

// Absorbed MLA over a per-query list of positions: query token i (q as for
// mla_attention_absorbed) attends to rows idx[i * idx_stride + j], j < n_idx[i], of lat.
// With every position [0, pos0 + i] listed it is mla_attention_absorbed.
void mla_attention_sparse(const float* q, int64_t n_tokens, int64_t n_heads, const float* lat, int64_t ld, int64_t R,
                          int64_t P, const int32_t* idx, const int32_t* n_idx, int64_t idx_stride, float scale,
                          float* out);
void mla_attention_sparse(Isa isa, const float* q, int64_t n_tokens, int64_t n_heads, const float* lat, int64_t ld,
                          int64_t R, int64_t P, const int32_t* idx, const int32_t* n_idx, int64_t idx_stride,
                          float scale, float* out);

// DeepSeek-V3 router (topk_method noaux_tc): s = sigmoid(logits); selection on s + bias
// (bias may be null), limited to the topk_group best of n_group equal groups of experts
// (a group scores the sum of its two best biased scores; one expert per group: that one);
// weights are the unbiased s of the chosen experts, divided by their sum when `normalize`,
// then multiplied by `scaling`. n_group <= 1: no group limit. ids/weights [n_tokens, k],
// best first; ties to the lower id.
void moe_route_sigmoid(const float* logits, const float* bias, int64_t n_tokens, int64_t n_experts, int64_t k,
                       int64_t n_group, int64_t topk_group, bool normalize, float scaling, int32_t* ids,
                       float* weights);

namespace ref {

void indexer_scores(const float* q, const float* w, int64_t n_heads, int64_t d, const float* keys, int64_t ld,
                    int64_t n_keys, float* out);
void topk_indices(const float* scores, int64_t n, int64_t k, int32_t* out);
// Dense absorbed attention with a mask: row t of query i counts iff mask[i * n_ctx + t].
void mla_attention_masked(const float* q, int64_t n_tokens, int64_t n_heads, int64_t n_ctx, const float* lat,
                          int64_t ld, int64_t R, int64_t P, const uint8_t* mask, float scale, float* out);

void mla_attention_absorbed(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* lat,
                            int64_t ld, int64_t R, int64_t P, float scale, float* out);
void mla_attention_naive(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* kv, int64_t nope,
                         int64_t V, const float* k_pe, int64_t k_pe_ld, int64_t P, float scale, float* out);

}  // namespace ref

}  // namespace infera::kernels
