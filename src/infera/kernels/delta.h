// Gated DeltaNet kernels (Qwen3-Next / Qwen3.5 linear-attention layers).
//
// Per value head the layer keeps a state S [dk, dv] (f32) and, for token t,
//   S <- exp(g_t) S;   S <- S + k_t (beta_t (v_t - S^T k_t))^T;   o_t = S^T q_t
// (q, k L2-normalised, q scaled by 1/sqrt(dk); g_t <= 0 the log decay, beta_t in (0, 1)).
//
// gated_delta_rule_recurrent is that loop, token by token (decode).
// gated_delta_rule_chunked computes the same outputs and final state for a whole prefill
// chunk with the WY/UT form of HF's torch_chunk_gated_delta_rule (fla): per chunk of C
// tokens a C x C triangular solve turns the sequential rank-1 updates into matrix
// products, and the state is touched once per chunk instead of once per token.
//
// Like kernels.h, the recurrence, the chunked rule, the causal conv and the gated norm
// exist as scalar references (namespace ref, the plain loops tests compare against) and as
// optimized paths compiled for scalar / AVX2 / AVX-512 (cpu/delta_impl.h), picked at run
// time by best_isa() (INFERA_ISA caps it); the overloads taking an Isa run that path.
// Threads split the value heads. The scalar path's recurrence and chunked rule are the
// reference loops themselves (faster than register tiling on one lane).
// INFERA_GDN_KERNELS=ref routes every call to the references (A/B benchmarks).
#pragma once

#include <cstdint>

#include "infera/base/cpu.h"

namespace infera::kernels {

struct DeltaShape {
  int64_t n_k_heads = 0;  // query/key heads
  int64_t n_v_heads = 0;  // value heads (a multiple of n_k_heads)
  int64_t dk = 0;  // key head dim
  int64_t dv = 0;  // value head dim
};

// One sequence. q, k: [n_tokens, n_k_heads, dk]; v: [n_tokens, n_v_heads, dv];
// g, beta: [n_tokens, n_v_heads]; state: [n_v_heads, dk, dv] in/out; out: [n_tokens,
// n_v_heads, dv]. Value head h reads query/key head h / (n_v_heads / n_k_heads) (HF
// repeat_interleave).
void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                int64_t n_tokens, const DeltaShape& shape, float* state, float* out);
void gated_delta_rule_recurrent(Isa isa, const float* q, const float* k, const float* v, const float* g,
                                const float* beta, int64_t n_tokens, const DeltaShape& shape, float* state, float* out);
// Same contract; chunk >= 1 tokens per block (64 in HF and llama.cpp).
void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                              int64_t n_tokens, const DeltaShape& shape, float* state, float* out, int64_t chunk = 64);
void gated_delta_rule_chunked(Isa isa, const float* q, const float* k, const float* v, const float* g,
                              const float* beta, int64_t n_tokens, const DeltaShape& shape, float* state, float* out,
                              int64_t chunk = 64);

// Causal depthwise conv1d over time with a carried state, then SiLU, in place.
// x: [n_tokens, channels]; w: [channels, kernel] (HF conv1d.weight [C, 1, K] without the
// middle dim); state: [kernel - 1, channels], the sequence's previous kernel - 1 inputs,
// oldest first (zeros for a fresh sequence); on return the last kernel - 1 inputs.
//   y[t, c] = silu(sum_j w[c, j] * x[t - (kernel - 1) + j, c])
void causal_conv1d_silu(float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t kernel, float* state);
void causal_conv1d_silu(Isa isa, float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t kernel,
                        float* state);

// x[r, :] *= scale / sqrt(sum(x[r, :]^2) + eps) (HF l2norm; fla uses eps 1e-6), in place.
void l2norm_rows(float* x, int64_t rows, int64_t n, float eps, float scale = 1.0f);

// Gates of one token batch: a, b: [rows, heads] (in_proj_a / in_proj_b outputs);
// g = -exp(A_log) * softplus(a + dt_bias) (neg_exp_a = -exp(A_log) precomputed);
// beta = sigmoid(b). g, beta: [rows, heads].
void gdn_gates(const float* a, const float* b, int64_t rows, int64_t heads, const float* neg_exp_a,
               const float* dt_bias, float* g, float* beta);

// Qwen3-Next RMSNormGated: x[r, :] = w * x / rms(x) * silu(z[r, :]), per row of n (one
// head), in place. Plain w (not zero-centred).
void rmsnorm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps);
void rmsnorm_gated(Isa isa, float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps);

// Scalar references (plain loops, the token-by-token recurrence and the HF chunked form as
// written): the truth the optimized paths are tested against. Same contracts as above.
namespace ref {
void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                int64_t n_tokens, const DeltaShape& shape, float* state, float* out);
void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                              int64_t n_tokens, const DeltaShape& shape, float* state, float* out, int64_t chunk = 64);
void causal_conv1d_silu(float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t kernel, float* state);
void rmsnorm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps);
}  // namespace ref

}  // namespace infera::kernels
