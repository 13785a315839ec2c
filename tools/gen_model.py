#!/usr/bin/env python3
"""Write a random-weight Hugging Face model directory for tests and benchmarks.

    python3 tools/gen_model.py OUT_DIR --arch llama|qwen3|qwen3_moe|qwen3_5|qwen3_5_moe|qwen3_next|deepseek_v3|deepseek_v32
                               [shape options]
                               [--preset tinyllama]

The directory holds config.json, generation_config.json, model.safetensors (or shards
model-0000X-of-0000Y.safetensors + model.safetensors.index.json above --max-shard-size),
tokenizer.json, tokenizer_config.json and special_tokens_map.json, laid out like the
files Hugging Face `transformers` writes, so Infera, `infera convert` and llama.cpp (via
the converted GGUF) all load it.

Weights: random, deterministic given --seed (each tensor has its own stream seeded from
(seed, tensor index), so sharding does not change values). Scales keep activations sane
through many layers and make greedy decoding non-degenerate: projections use
std = 1/sqrt(fan_in) so every block adds O(1) to the residual stream, the output head
uses std = 3/sqrt(hidden) so logits have a clear but non-trivial top-1 margin, and norm
weights are 1 + 0.1 * noise (zero-centred Qwen3.5 norms: 0.1 * noise, applied as 1 + w). Tied embeddings use the head's scale and the blocks' output
projections are 4x larger, so the residual stream is dominated by the context rather than
by the input token (logits E . E[token] would make greedy decoding repeat it).

qwen3_next (Qwen3NextForCausalLM, flat model.* layout, flat config.json without
layer_types) is written from the same underlying weights as qwen3_5_moe with the same
options and seed: the GDN projections are fused per key-head group (in_proj_qkvz,
in_proj_ba, the layout transformers' fix_query_key_value_ordering undoes) and the experts
stored per expert, so both directories describe the same network and must give the same
logits. --mlp-only-layers / --decoder-sparse-step make some qwen3_next layers dense.

deepseek_v3 (DeepseekV3ForCausalLM): multi-head latent attention (--q-lora-rank, 0 for a
direct q_proj; --kv-lora-rank, --qk-nope-dim, --qk-rope-dim, --v-head-dim), the first
--first-dense layers dense, the rest MoE with sigmoid routing, e_score_correction_bias,
--n-group / --topk-group group-limited selection, --n-shared shared experts and
--routed-scale; the MTP layer model.layers.{layers}.* unless --no-mtp. --rope-scaling yarn
adds DeepSeek's mscale / mscale_all_dim (--yarn-mscale). deepseek_v32 adds the lightning indexer
(--index-heads, --index-head-dim, --index-topk) to every attention layer.

Samples are drawn from a 65536-entry table of normal quantiles indexed by random 16-bit
numbers: as good as normal samples for a test model, and ~20x faster than
numpy's normal generator plus a bf16 conversion, so the tinyllama preset (1.1B
parameters, 2.2 GB) writes in well under a minute.

Tokenizers:
  llama: SentencePiece-style BPE with byte fallback, like llama2.c's tok512:
         <unk> <s> </s>, 256 byte tokens <0x00>..<0xFF>, merged pieces (scored by id),
         then single characters; the tokenizer.json merges list every split of every
         merged piece, ordered by piece id, so HF's merge ranks and llama.cpp's
         score-driven merging agree.
  qwen3: byte-level BPE (GPT-2 byte alphabet, Qwen2 pre-tokenizer regex, NFC), merges,
         then the added special tokens <|endoftext|> <|im_start|> <|im_end|> at the end,
         and a ChatML chat_template.
Requires only python3 and numpy.
"""

import argparse
import json
import math
import os
import re
import sys

import numpy as np

import safetensors_file as st

PRESETS = {
    # TinyLlama-1.1B's shape (hidden 2048, 22 layers, GQA 32/4, SwiGLU 5632, 32000 vocab).
    "tinyllama": dict(arch="llama", hidden=2048, layers=22, heads=32, kv_heads=4, head_dim=64, ffn=5632,
                      vocab=32000, dtype="bf16", rope_theta=10000.0, max_pos=2048, tie=False),
}

HYBRID_ARCHS = ["qwen3_5", "qwen3_5_moe", "qwen3_next"]
DEEPSEEK_ARCHS = ["deepseek_v3", "deepseek_v32"]

DTYPES = {"f32": ("F32", 4, "float32"), "bf16": ("BF16", 2, "bfloat16"), "f16": ("F16", 2, "float16")}

# Text the BPE merges are learned from (the rest of the vocabulary is synthetic).
CORPUS = """Once upon a time, there was a little girl named Lily. She loved to play outside in
the sun with her dog and her friends. One day, she saw a big red ball in the park. She said:
"Can I play with the ball?" The boy smiled and said yes. They played together all day and
were very happy. The quick brown fox jumps over the lazy dog. In 1969 the first people walked
on the moon; it was 384400 km away! Hello world, hello again. What is the answer to this
question? Models read tokens, then they write tokens: one, two, three, four, five, six.
The weather today is warm and bright, and the children are running to the river to swim.
Mom made a cake for the party, and everyone sang a song and laughed together."""

QWEN2_PRETOKENIZER_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def parse_size(text):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size '{text}' (use e.g. 2GB, 500MB, 1000000)")
    scale = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9}[m.group(2)]
    return int(float(m.group(1)) * scale)


# ----------------------------------------------------------------------------- weights

def quantile_table(seed):
    """65536 sorted standard-normal samples (float32): an empirical quantile table."""
    rng = np.random.default_rng([seed, 0x7AB1E])
    return np.sort(rng.standard_normal(65536)).astype(np.float32)


def encode(values_f32, dtype):
    """float32 array -> bytes-compatible array in the requested storage dtype."""
    if dtype == "f32":
        return values_f32.astype(np.float32, copy=False)
    if dtype == "f16":
        return values_f32.astype(np.float16)
    return st.bf16_bits(values_f32)


class TensorSpec:
    """A tensor to write. kind "derived": its values are fn(*values of `parts`) (base
    specs, each generated from its own stream), e.g. a fused projection. seed_index picks
    the random stream (the spec's position in the file unless set)."""

    def __init__(self, name, shape, kind, std, parts=None, fn=None):
        self.name, self.shape, self.kind, self.std = name, tuple(shape), kind, std
        self.parts, self.fn, self.seed_index = parts, fn, None

    def numel(self):
        return int(np.prod(self.shape))


def moe_specs(p, a, out_gain, fused):
    """A MoE block under prefix p ("...mlp."): router, routed experts (per-expert 2-D or
    Qwen3.5's fused 3-D), and for the hybrid archs a sigmoid-gated shared expert."""
    h, e, i = a.hidden, a.experts, a.moe_ffn
    specs = [TensorSpec(p + "gate.weight", (e, h), "normal", 1.0 / math.sqrt(h))]
    if fused:
        specs += [TensorSpec(p + "experts.gate_up_proj", (e, 2 * i, h), "normal", 1.0 / math.sqrt(h)),
                  TensorSpec(p + "experts.down_proj", (e, h, i), "normal", 2.0 * out_gain / math.sqrt(i))]
    else:
        for x in range(e):
            q = f"{p}experts.{x}."
            specs += [TensorSpec(q + "gate_proj.weight", (i, h), "normal", 1.0 / math.sqrt(h)),
                      TensorSpec(q + "up_proj.weight", (i, h), "normal", 1.0 / math.sqrt(h)),
                      TensorSpec(q + "down_proj.weight", (h, i), "normal", 2.0 * out_gain / math.sqrt(i))]
    if a.arch in HYBRID_ARCHS:
        s = a.shared_ffn
        specs += [TensorSpec(p + "shared_expert.gate_proj.weight", (s, h), "normal", 1.0 / math.sqrt(h)),
                  TensorSpec(p + "shared_expert.up_proj.weight", (s, h), "normal", 1.0 / math.sqrt(h)),
                  TensorSpec(p + "shared_expert.down_proj.weight", (h, s), "normal", 2.0 * out_gain / math.sqrt(s)),
                  TensorSpec(p + "shared_expert_gate.weight", (1, h), "normal", 1.0 / math.sqrt(h))]
    return specs


def hybrid_layer_specs(p, a, layer_type, out_gain, moe=True):
    """One Qwen3.5 decoder layer (Gated DeltaNet or gated full attention, then the FFN).
    Norms are zero-centred (stored w, applied as 1 + w) except linear_attn.norm."""
    h, hd = a.hidden, a.head_dim
    specs = [TensorSpec(p + "input_layernorm.weight", (h,), "zc_norm", 0.1)]
    if layer_type == "linear_attention":
        q = p + "linear_attn."
        kd, vd = a.lin_k_heads * a.lin_dk, a.lin_v_heads * a.lin_dv
        conv = 2 * kd + vd
        specs += [
            TensorSpec(q + "in_proj_qkv.weight", (conv, h), "normal", 1.0 / math.sqrt(h)),
            TensorSpec(q + "in_proj_z.weight", (vd, h), "normal", 1.0 / math.sqrt(h)),
            TensorSpec(q + "in_proj_b.weight", (a.lin_v_heads, h), "normal", 1.0 / math.sqrt(h)),
            TensorSpec(q + "in_proj_a.weight", (a.lin_v_heads, h), "normal", 1.0 / math.sqrt(h)),
            TensorSpec(q + "conv1d.weight", (conv, 1, a.conv_kernel), "normal", 1.0 / math.sqrt(a.conv_kernel)),
            TensorSpec(q + "dt_bias", (a.lin_v_heads,), "norm", 0.1),
            TensorSpec(q + "A_log", (a.lin_v_heads,), "a_log", 1.0),
            TensorSpec(q + "norm.weight", (a.lin_dv,), "norm", 0.1),
            TensorSpec(q + "out_proj.weight", (h, vd), "normal", out_gain / math.sqrt(vd)),
        ]
    else:
        q = p + "self_attn."
        specs += [
            TensorSpec(q + "q_proj.weight", (a.heads * hd * 2, h), "normal", 1.0 / math.sqrt(h)),
            TensorSpec(q + "k_proj.weight", (a.kv_heads * hd, h), "normal", 1.0 / math.sqrt(h)),
            TensorSpec(q + "v_proj.weight", (a.kv_heads * hd, h), "normal", 1.0 / math.sqrt(h)),
            TensorSpec(q + "o_proj.weight", (h, a.heads * hd), "normal", 2.0 * out_gain / math.sqrt(a.heads * hd)),
            TensorSpec(q + "q_norm.weight", (hd,), "zc_norm", 0.1),
            TensorSpec(q + "k_norm.weight", (hd,), "zc_norm", 0.1),
        ]
    specs.append(TensorSpec(p + "post_attention_layernorm.weight", (h,), "zc_norm", 0.1))
    if a.arch == "qwen3_5" or not moe:
        specs += [TensorSpec(p + "mlp.gate_proj.weight", (a.ffn, h), "normal", 1.0 / math.sqrt(h)),
                  TensorSpec(p + "mlp.up_proj.weight", (a.ffn, h), "normal", 1.0 / math.sqrt(h)),
                  TensorSpec(p + "mlp.down_proj.weight", (h, a.ffn), "normal", 2.0 * out_gain / math.sqrt(a.ffn))]
    else:
        specs += moe_specs(p + "mlp.", a, out_gain, fused=True)
    return specs


def hybrid_specs(a):
    """Qwen3.5 (VLM layout, text only): model.language_model.*, lm_head, mtp.*."""
    h = a.hidden
    head_std = 3.0 / math.sqrt(h)
    out_gain = 4.0 if a.tie else 1.0
    lm = "model.language_model."
    specs = [TensorSpec(lm + "embed_tokens.weight", (a.vocab, h), "normal", head_std if a.tie else 1.0)]
    for i, kind in enumerate(layer_types(a)):
        # Only Qwen3-Next configs carry mlp_only_layers / decoder_sparse_step.
        moe = a.arch != "qwen3_next" or is_moe_layer(a, i)
        specs += hybrid_layer_specs(f"{lm}layers.{i}.", a, kind, out_gain, moe=moe)
    specs.append(TensorSpec(lm + "norm.weight", (h,), "zc_norm", 0.1))
    if not a.tie:
        specs.append(TensorSpec("lm_head.weight", (a.vocab, h), "normal", head_std))
    if a.mtp:
        specs += [TensorSpec("mtp.fc.weight", (h, 2 * h), "normal", 1.0 / math.sqrt(2 * h)),
                  TensorSpec("mtp.pre_fc_norm_embedding.weight", (h,), "zc_norm", 0.1),
                  TensorSpec("mtp.pre_fc_norm_hidden.weight", (h,), "zc_norm", 0.1)]
        specs += hybrid_layer_specs("mtp.layers.0.", a, "full_attention", out_gain)
        specs.append(TensorSpec("mtp.norm.weight", (h,), "zc_norm", 0.1))
    return specs


def qwen3_next_specs(a):
    """Qwen3-Next: the qwen3_5_moe tensors (same streams, so the same values) renamed to the
    flat layout, the GDN projections fused per key-head group and the experts per expert."""
    base = hybrid_specs(a)
    for i, s in enumerate(base):
        s.seed_index = i
    hk, hv, dk, dv = a.lin_k_heads, a.lin_v_heads, a.lin_dk, a.lin_dv
    r = hv // hk
    kd, vd = hk * dk, hv * dv
    by_name = {s.name: s for s in base}
    out = []

    def fuse_qkvz(qkv, z):  # [2 kd + vd, h], [vd, h] -> per group [q | k | v (r dv) | z (r dv)]
        q, k, v = qkv[:kd], qkv[kd:2 * kd], qkv[2 * kd:]
        rows = []
        for g in range(hk):
            rows += [q[g * dk:(g + 1) * dk], k[g * dk:(g + 1) * dk], v[g * r * dv:(g + 1) * r * dv],
                     z[g * r * dv:(g + 1) * r * dv]]
        return np.concatenate(rows)

    def fuse_ba(b, a_):  # [hv, h] x2 -> per group [b (r) | a (r)]
        return np.concatenate([x[g * r:(g + 1) * r] for g in range(hk) for x in (b, a_)])

    for s in base:
        name = s.name.replace("model.language_model.", "model.", 1)
        if name.endswith("linear_attn.in_proj_qkv.weight"):
            p = s.name[:-len("in_proj_qkv.weight")]
            out.append(TensorSpec(name.replace("in_proj_qkv", "in_proj_qkvz"), (2 * kd + 2 * vd, s.shape[1]),
                                  "derived", 0, parts=[s, by_name[p + "in_proj_z.weight"]], fn=fuse_qkvz))
        elif name.endswith("linear_attn.in_proj_b.weight"):
            p = s.name[:-len("in_proj_b.weight")]
            out.append(TensorSpec(name.replace("in_proj_b", "in_proj_ba"), (2 * hv, s.shape[1]), "derived", 0,
                                  parts=[s, by_name[p + "in_proj_a.weight"]], fn=fuse_ba))
        elif name.endswith(("linear_attn.in_proj_z.weight", "linear_attn.in_proj_a.weight")):
            continue  # fused above
        elif name.endswith("mlp.experts.gate_up_proj"):
            e_count, two_i, _ = s.shape
            i_ = two_i // 2
            p = name[:-len("gate_up_proj")]
            for e in range(e_count):
                for proj, lo in (("gate_proj", 0), ("up_proj", i_)):
                    out.append(TensorSpec(f"{p}{e}.{proj}.weight", (i_, s.shape[2]), "derived", 0, parts=[s],
                                          fn=lambda x, e=e, lo=lo, i_=i_: x[e, lo:lo + i_]))
        elif name.endswith("mlp.experts.down_proj"):
            p = name[:-len("down_proj")]
            for e in range(s.shape[0]):
                out.append(TensorSpec(f"{p}{e}.down_proj.weight", s.shape[1:], "derived", 0, parts=[s],
                                      fn=lambda x, e=e: x[e]))
        else:
            t = TensorSpec(name, s.shape, s.kind, s.std)
            t.seed_index = s.seed_index
            out.append(t)
    return out


def deepseek_block_specs(p, a, layer, out_gain):
    """One DeepSeek-V3 decoder block: MLA attention, then a dense SwiGLU (layer <
    first_k_dense_replace) or the sigmoid-routed MoE with shared experts."""
    h, nh = a.hidden, a.heads
    qk = a.qk_nope_dim + a.qk_rope_dim
    r, pr = a.kv_lora_rank, a.qk_rope_dim
    q = p + "self_attn."
    specs = [TensorSpec(p + "input_layernorm.weight", (h,), "norm", 0.1)]
    if a.q_lora_rank > 0:
        specs += [TensorSpec(q + "q_a_proj.weight", (a.q_lora_rank, h), "normal", 1.0 / math.sqrt(h)),
                  TensorSpec(q + "q_a_layernorm.weight", (a.q_lora_rank,), "norm", 0.1),
                  TensorSpec(q + "q_b_proj.weight", (nh * qk, a.q_lora_rank), "normal", 1.0 / math.sqrt(a.q_lora_rank))]
    else:
        specs.append(TensorSpec(q + "q_proj.weight", (nh * qk, h), "normal", 1.0 / math.sqrt(h)))
    specs += [
        TensorSpec(q + "kv_a_proj_with_mqa.weight", (r + pr, h), "normal", 1.0 / math.sqrt(h)),
        TensorSpec(q + "kv_a_layernorm.weight", (r,), "norm", 0.1),
        TensorSpec(q + "kv_b_proj.weight", (nh * (a.qk_nope_dim + a.v_head_dim), r), "normal", 1.0 / math.sqrt(r)),
        TensorSpec(q + "o_proj.weight", (h, nh * a.v_head_dim), "normal", out_gain / math.sqrt(nh * a.v_head_dim)),
    ]
    if a.arch == "deepseek_v32":  # the lightning indexer
        x = q + "indexer."
        specs += [TensorSpec(x + "wq_b.weight", (a.index_heads * a.index_head_dim, a.q_lora_rank), "normal",
                             1.0 / math.sqrt(a.q_lora_rank)),
                  TensorSpec(x + "wk.weight", (a.index_head_dim, h), "normal", 1.0 / math.sqrt(h)),
                  TensorSpec(x + "k_norm.weight", (a.index_head_dim,), "norm", 0.1),
                  TensorSpec(x + "k_norm.bias", (a.index_head_dim,), "normal", 0.1),
                  TensorSpec(x + "weights_proj.weight", (a.index_heads, h), "normal", 1.0 / math.sqrt(h))]
    specs.append(TensorSpec(p + "post_attention_layernorm.weight", (h,), "norm", 0.1))
    if layer < a.first_dense:
        f = a.ffn
        return specs + [TensorSpec(p + "mlp.gate_proj.weight", (f, h), "normal", 1.0 / math.sqrt(h)),
                        TensorSpec(p + "mlp.up_proj.weight", (f, h), "normal", 1.0 / math.sqrt(h)),
                        TensorSpec(p + "mlp.down_proj.weight", (h, f), "normal", 2.0 * out_gain / math.sqrt(f))]
    e, i = a.experts, a.moe_ffn
    m = p + "mlp."
    # The selection bias is large enough to change which experts win.
    specs += [TensorSpec(m + "gate.weight", (e, h), "normal", 1.0 / math.sqrt(h)),
              TensorSpec(m + "gate.e_score_correction_bias", (e,), "normal", 0.3)]
    for x in range(e):
        t = f"{m}experts.{x}."
        specs += [TensorSpec(t + "gate_proj.weight", (i, h), "normal", 1.0 / math.sqrt(h)),
                  TensorSpec(t + "up_proj.weight", (i, h), "normal", 1.0 / math.sqrt(h)),
                  TensorSpec(t + "down_proj.weight", (h, i), "normal", out_gain / math.sqrt(i))]
    if a.n_shared > 0:
        s = i * a.n_shared
        specs += [TensorSpec(m + "shared_experts.gate_proj.weight", (s, h), "normal", 1.0 / math.sqrt(h)),
                  TensorSpec(m + "shared_experts.up_proj.weight", (s, h), "normal", 1.0 / math.sqrt(h)),
                  TensorSpec(m + "shared_experts.down_proj.weight", (h, s), "normal", out_gain / math.sqrt(s))]
    return specs


def deepseek_specs(a):
    """DeepSeek-V3: model.*, lm_head, and the MTP layer as model.layers.{layers}.*."""
    h = a.hidden
    head_std = 3.0 / math.sqrt(h)
    out_gain = 4.0 if a.tie else 1.0
    specs = [TensorSpec("model.embed_tokens.weight", (a.vocab, h), "normal", head_std if a.tie else 1.0)]
    for i in range(a.layers):
        specs += deepseek_block_specs(f"model.layers.{i}.", a, i, out_gain)
    specs.append(TensorSpec("model.norm.weight", (h,), "norm", 0.1))
    if not a.tie:
        specs.append(TensorSpec("lm_head.weight", (a.vocab, h), "normal", head_std))
    if a.mtp:
        p = f"model.layers.{a.layers}."
        specs += [TensorSpec(p + "embed_tokens.weight", (a.vocab, h), "normal", head_std if a.tie else 1.0),
                  TensorSpec(p + "enorm.weight", (h,), "norm", 0.1),
                  TensorSpec(p + "hnorm.weight", (h,), "norm", 0.1),
                  TensorSpec(p + "eh_proj.weight", (h, 2 * h), "normal", 1.0 / math.sqrt(2 * h))]
        specs += deepseek_block_specs(p, a, a.layers, out_gain)
        specs += [TensorSpec(p + "shared_head.norm.weight", (h,), "norm", 0.1),
                  TensorSpec(p + "shared_head.head.weight", (a.vocab, h), "normal", head_std)]
    return specs


def layer_types(a):
    """Every full_attention_interval-th layer is full attention, the rest Gated DeltaNet."""
    return ["full_attention" if (i + 1) % a.full_attn_interval == 0 else "linear_attention" for i in range(a.layers)]


def tensor_specs(a):
    """HF tensor names, shapes [out, in] and initializations, in file order."""
    if a.arch == "qwen3_next":
        return qwen3_next_specs(a)
    if a.arch in DEEPSEEK_ARCHS:
        return deepseek_specs(a)
    if a.arch in HYBRID_ARCHS:
        return hybrid_specs(a)
    h, hd, ffn = a.hidden, a.head_dim, a.ffn
    q_out, kv_out = a.heads * hd, a.kv_heads * hd
    head_std = 3.0 / math.sqrt(h)
    # Tied: logits = E . norm(x), and the token's own embedding E[t] sits in x, giving it a
    # self-logit bonus of ~|E[t]|^2 / rms(x) that makes greedy decoding repeat tokens.
    # Larger block outputs (a larger rms(x)) shrink that bonus below the logit spread.
    out_gain = 4.0 if a.tie else 1.0
    specs = [TensorSpec("model.embed_tokens.weight", (a.vocab, h), "normal", head_std if a.tie else 1.0)]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        specs += [
            TensorSpec(p + "input_layernorm.weight", (h,), "norm", 0.1),
            TensorSpec(p + "self_attn.q_proj.weight", (q_out, h), "normal", 1.0 / math.sqrt(h)),
            TensorSpec(p + "self_attn.k_proj.weight", (kv_out, h), "normal", 1.0 / math.sqrt(h)),
            TensorSpec(p + "self_attn.v_proj.weight", (kv_out, h), "normal", 1.0 / math.sqrt(h)),
            TensorSpec(p + "self_attn.o_proj.weight", (h, q_out), "normal", out_gain / math.sqrt(q_out)),
        ]
        if a.arch in ("qwen3", "qwen3_moe"):
            specs += [TensorSpec(p + "self_attn.q_norm.weight", (hd,), "norm", 0.1),
                      TensorSpec(p + "self_attn.k_norm.weight", (hd,), "norm", 0.1)]
        specs.append(TensorSpec(p + "post_attention_layernorm.weight", (h,), "norm", 0.1))
        if a.arch == "qwen3_moe" and is_moe_layer(a, i):
            specs += moe_specs(p + "mlp.", a, out_gain, fused=False)
            continue
        specs += [
            TensorSpec(p + "mlp.gate_proj.weight", (ffn, h), "normal", 1.0 / math.sqrt(h)),
            TensorSpec(p + "mlp.up_proj.weight", (ffn, h), "normal", 1.0 / math.sqrt(h)),
            # SwiGLU outputs have RMS ~0.5; 2/sqrt(ffn) gives the block an O(1) update.
            TensorSpec(p + "mlp.down_proj.weight", (h, ffn), "normal", 2.0 * out_gain / math.sqrt(ffn)),
        ]
    specs.append(TensorSpec("model.norm.weight", (h,), "norm", 0.1))
    if not a.tie:
        specs.append(TensorSpec("lm_head.weight", (a.vocab, h), "normal", head_std))
    return specs


def generate_chunks(spec, index, a, table, chunk=1 << 24):
    """Yields the tensor's storage bytes in chunks (numpy arrays)."""
    if spec.kind == "derived":
        parts = [derived_part(p, a, table) for p in spec.parts]
        yield encode(np.ascontiguousarray(spec.fn(*parts), dtype=np.float32).reshape(-1), a.dtype)
        return
    for values in generate_values(spec, index if spec.seed_index is None else spec.seed_index, a, table, chunk):
        yield encode(values, a.dtype)


_PART_CACHE = {}


def derived_part(spec, a, table):
    """A base tensor's f32 values, shaped; the last one is kept, since consecutive derived
    tensors (the experts of one layer) slice the same base tensor."""
    key = (spec.name, spec.seed_index)
    if key not in _PART_CACHE:
        _PART_CACHE.clear()
        values = np.concatenate(list(generate_values(spec, spec.seed_index, a, table)))
        _PART_CACHE[key] = values.reshape(spec.shape)
    return _PART_CACHE[key]


def generate_values(spec, index, a, table, chunk=1 << 24):
    """Yields the tensor's f32 values in chunks, from its own random stream."""
    rng = np.random.default_rng([a.seed, index])
    n = spec.numel()
    done = 0
    while done < n:
        m = min(chunk, n - done)
        idx = np.frombuffer(rng.bytes(2 * m), dtype=np.uint16)
        values = table[idx] * np.float32(spec.std)
        if spec.kind == "norm":
            values += np.float32(1.0)
        elif spec.kind == "a_log":
            # HF init: A = uniform(1, 16), stored as log(A); the normal table's CDF gives the uniform.
            u = 0.5 * (1.0 + np.vectorize(math.erf)(table[idx] / math.sqrt(2.0)))
            values = np.log(1.0 + 15.0 * u).astype(np.float32)
        yield values
        done += m


def plan_shards(specs, a):
    elem = DTYPES[a.dtype][1]
    shards, current, size = [], [], 0
    for i, s in enumerate(specs):
        nbytes = s.numel() * elem
        if current and size + nbytes > a.max_shard_size:
            shards.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    shards.append(current)
    return shards


def write_safetensors(path, specs, indices, a, table, progress):
    st_dtype, elem, _ = DTYPES[a.dtype]
    entries = [(specs[i].name, st_dtype, specs[i].shape, specs[i].numel() * elem) for i in indices]
    with open(path, "wb") as f:
        f.write(st.header_bytes(entries, metadata={"format": "pt"}))
        for i in indices:
            for part in generate_chunks(specs[i], i, a, table):
                f.write(part.tobytes())
            progress(specs[i].numel() * elem)
    return sum(e[3] for e in entries)


def write_weights(out, a):
    specs = tensor_specs(a)
    table = quantile_table(a.seed)
    shards = plan_shards(specs, a)
    elem = DTYPES[a.dtype][1]
    total = sum(s.numel() for s in specs) * elem
    state = {"done": 0, "last": -1}
    show = sys.stderr.isatty() and total > 100_000_000

    def progress(nbytes):
        state["done"] += nbytes
        pct = int(100 * state["done"] / total)
        if show and pct != state["last"]:
            state["last"] = pct
            print(f"\r  writing weights: {pct:3d}% of {total / 1e9:.2f} GB", end="", file=sys.stderr, flush=True)

    if len(shards) == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), specs, shards[0], a, table, progress)
    else:
        weight_map = {}
        for k, indices in enumerate(shards):
            name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(out, name), specs, indices, a, table, progress)
            for i in indices:
                weight_map[specs[i].name] = name
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        write_json(os.path.join(out, "model.safetensors.index.json"), index)
    if show:
        print(file=sys.stderr)
    return sum(s.numel() for s in specs), len(shards)


# ----------------------------------------------------------------------------- tokenizers

def corpus_words(prefix_space_marker):
    """Corpus words with their leading-space marker, and counts."""
    counts = {}
    for line in CORPUS.split("\n"):
        for w in re.findall(r"[A-Za-z]+|[0-9]|[^\sA-Za-z0-9]+", line):
            word = prefix_space_marker + w if w[0].isalpha() else w
            counts[word] = counts.get(word, 0) + 1
    return counts


def learn_merges(words, alphabet, n_merges, rng, max_len=12):
    """Classic BPE on `words` (str -> count) over single-character symbols, then random
    merges of existing pieces once the corpus has no pair left. Returns [(left, right)]."""
    seqs = {w: [c for c in w] for w in words}
    vocab = set(alphabet)
    merges = []
    while len(merges) < n_merges:
        pairs = {}
        for w, syms in seqs.items():
            for x, y in zip(syms, syms[1:]):
                if x in vocab and y in vocab and x + y not in vocab:
                    pairs[(x, y)] = pairs.get((x, y), 0) + words[w]
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], -len(kv[0][0] + kv[0][1]), kv[0]))[0]
        merges.append(best)
        vocab.add(best[0] + best[1])
        for w, syms in seqs.items():
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and (syms[i], syms[i + 1]) == best:
                    out.append(syms[i] + syms[i + 1])
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            seqs[w] = out
    pieces = sorted(vocab, key=lambda p: (len(p), p))
    attempts = 0
    while len(merges) < n_merges:
        x = pieces[int(rng.integers(len(pieces)))]
        y = pieces[int(rng.integers(len(pieces)))]
        attempts += 1
        if len(x) + len(y) <= max_len and x + y not in vocab:
            merges.append((x, y))
            vocab.add(x + y)
            pieces.append(x + y)
        elif attempts > 50 * n_merges + 1000:
            raise SystemExit("gen_model: cannot invent enough merges for this vocab size")
    return merges


def spm_tokenizer(a, rng):
    """SentencePiece-style BPE with byte fallback (llama2.c / Llama 2 layout)."""
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    chars = list("▁etaoinshrdlucmfwygpbvkxjqzETAOINSHRDLUCMFWYGPBVKXJQZ0123456789.,!?'\":;-()")
    n_free = a.vocab - len(specials) - len(byte_tokens)
    if n_free < 2:
        raise SystemExit(f"gen_model: --vocab {a.vocab} is too small for a byte-fallback tokenizer (need >= 261)")
    chars = chars[:max(2, min(len(chars), n_free // 3))]
    n_merged = n_free - len(chars)
    merges = learn_merges(corpus_words("▁"), chars, n_merged, rng)
    merged = [x + y for x, y in merges]
    tokens = specials + byte_tokens + merged + chars  # SentencePiece order: merged pieces, then characters
    assert len(tokens) == a.vocab and len(set(tokens)) == a.vocab
    vocab = {t: i for i, t in enumerate(tokens)}
    # llama.cpp merges any adjacent pair whose concatenation is a piece (highest score =
    # lowest id first); HF only merges listed pairs by rank. Listing every split of every
    # merged piece, ordered by piece id, makes the two agree.
    all_merges = []
    for piece in merged:
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                all_merges.append(f"{left} {right}")
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(specials)]
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": all_merges},
    }
    decoder = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True} for i, t in enumerate(specials)}
    config = {
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": decoder,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
        "clean_up_tokenization_spaces": False, "legacy": True, "model_max_length": a.max_pos,
        "sp_model_kwargs": {}, "spaces_between_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer", "use_default_system_prompt": False,
    }
    special_map = {k: {"content": v, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
                   for k, v in (("bos_token", "<s>"), ("eos_token", "</s>"), ("unk_token", "<unk>"))}
    ids = {"bos": 1, "eos": 2, "pad": None}
    return tok, config, special_map, ids


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bytelevel_tokenizer(a, rng):
    """Qwen2/Qwen3-style byte-level BPE with ChatML special tokens."""
    b2u = bytes_to_unicode()
    alphabet = list(b2u.values())  # ids 0..255 in GPT-2 order, as in Qwen's vocab.json
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    n_merges = a.vocab - len(alphabet) - len(specials)
    if n_merges < 0:
        raise SystemExit(f"gen_model: --vocab {a.vocab} is too small for a byte-level tokenizer (need >= 259)")
    words = {}
    for w, c in corpus_words(" ").items():
        mapped = "".join(b2u[b] for b in w.encode("utf-8"))
        words[mapped] = words.get(mapped, 0) + c
    merges = learn_merges(words, alphabet, n_merges, rng)
    tokens = alphabet + [x + y for x, y in merges]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens)
    added = [{"id": len(tokens) + k, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, t in enumerate(specials)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PRETOKENIZER_REGEX}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{x} {y}" for x, y in merges]},
    }
    decoder = {str(t["id"]): {"content": t["content"], "lstrip": False, "normalized": False, "rstrip": False,
                              "single_word": False, "special": True} for t in added}
    config = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "chat_template": CHATML_TEMPLATE, "clean_up_tokenization_spaces": False, "errors": "replace",
        "model_max_length": a.max_pos, "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
    }
    special_map = {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
        "pad_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
    }
    base = len(tokens)
    ids = {"bos": base, "eos": base + 2, "pad": base, "endoftext": base}
    return tok, config, special_map, ids


# ----------------------------------------------------------------------------- config

def rope_scaling(a):
    if not a.rope_scaling:
        return None
    factor = a.rope_factor if a.rope_factor else {"llama3": 8.0, "yarn": 4.0, "linear": 2.0}[a.rope_scaling]
    orig = a.rope_orig_max_pos or max(1, int(a.max_pos / factor))
    if a.rope_scaling == "llama3":
        return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": orig}
    if a.rope_scaling == "yarn":
        if a.arch in DEEPSEEK_ARCHS:  # DeepSeek's attention scale correction
            return {"type": "yarn", "factor": factor, "original_max_position_embeddings": orig, "beta_fast": 32,
                    "beta_slow": 1, "mscale": a.yarn_mscale, "mscale_all_dim": a.yarn_mscale}
        return {"rope_type": "yarn", "type": "yarn", "factor": factor, "original_max_position_embeddings": orig}
    return {"rope_type": "linear", "type": "linear", "factor": factor}


def model_config(a, ids):
    torch_dtype = DTYPES[a.dtype][2]
    common = {
        "hidden_size": a.hidden, "intermediate_size": a.ffn, "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
        "hidden_act": "silu", "vocab_size": a.vocab, "max_position_embeddings": a.max_pos,
        "rms_norm_eps": a.rms_eps, "rope_theta": a.rope_theta, "rope_scaling": rope_scaling(a),
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
        "tie_word_embeddings": a.tie, "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
        "use_cache": True, "torch_dtype": torch_dtype, "transformers_version": "4.51.0",
    }
    if a.arch == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common,
                "mlp_bias": False, "pretraining_tp": 1}
    if a.arch == "qwen3_moe":
        return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **common,
                "sliding_window": None, "use_sliding_window": False, "max_window_layers": a.layers,
                "num_experts": a.experts, "num_experts_per_tok": a.experts_per_tok,
                "moe_intermediate_size": a.moe_ffn, "norm_topk_prob": a.norm_topk,
                "decoder_sparse_step": a.decoder_sparse_step, "mlp_only_layers": a.mlp_only_layers,
                "router_aux_loss_coef": 0.001, "output_router_logits": False}
    if a.arch == "qwen3_next":
        return qwen3_next_config(a, common)
    if a.arch in DEEPSEEK_ARCHS:
        return deepseek_config(a, common)
    if a.arch in HYBRID_ARCHS:
        return hybrid_config(a, common)
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **common,
            "sliding_window": None, "use_sliding_window": False, "max_window_layers": a.layers}


def hybrid_config(a, common):
    """Qwen3.5 VLM-style config: the language model's fields under text_config."""
    text = dict(common)
    for key in ("rope_theta", "rope_scaling", "torch_dtype", "tie_word_embeddings"):
        text.pop(key)
    partial = a.partial_rotary
    text.update({
        "model_type": a.arch + "_text", "layer_types": layer_types(a),
        "full_attention_interval": a.full_attn_interval, "attn_output_gate": True,
        "partial_rotary_factor": partial,
        "rope_parameters": {"rope_type": "default", "rope_theta": a.rope_theta, "partial_rotary_factor": partial,
                            "mrope_section": mrope_section(a), "mrope_interleaved": True},
        "linear_conv_kernel_dim": a.conv_kernel, "linear_key_head_dim": a.lin_dk,
        "linear_value_head_dim": a.lin_dv, "linear_num_key_heads": a.lin_k_heads,
        "linear_num_value_heads": a.lin_v_heads, "mamba_ssm_dtype": "float32",
        "mtp_num_hidden_layers": 1 if a.mtp else 0, "mtp_use_dedicated_embeddings": False,
        "dtype": DTYPES[a.dtype][2],
    })
    if a.arch == "qwen3_5_moe":
        text.update({"num_experts": a.experts, "num_experts_per_tok": a.experts_per_tok,
                     "moe_intermediate_size": a.moe_ffn, "shared_expert_intermediate_size": a.shared_ffn,
                     "router_aux_loss_coef": 0.001, "output_router_logits": False})
        text.pop("intermediate_size")
    arch = "Qwen3_5MoeForConditionalGeneration" if a.arch == "qwen3_5_moe" else "Qwen3_5ForConditionalGeneration"
    return {"architectures": [arch], "model_type": a.arch, "text_config": text,
            "tie_word_embeddings": a.tie, "torch_dtype": DTYPES[a.dtype][2], "transformers_version": "4.57.0"}


def qwen3_next_config(a, common):
    """Qwen3-Next: flat, as the published Qwen3-Next-80B-A3B config.json (the layer pattern
    from full_attention_interval, no layer_types, no mtp_num_hidden_layers)."""
    return {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", **common,
            "full_attention_interval": a.full_attn_interval, "partial_rotary_factor": a.partial_rotary,
            "linear_conv_kernel_dim": a.conv_kernel, "linear_key_head_dim": a.lin_dk,
            "linear_value_head_dim": a.lin_dv, "linear_num_key_heads": a.lin_k_heads,
            "linear_num_value_heads": a.lin_v_heads, "num_experts": a.experts,
            "num_experts_per_tok": a.experts_per_tok, "moe_intermediate_size": a.moe_ffn,
            "shared_expert_intermediate_size": a.shared_ffn, "norm_topk_prob": a.norm_topk,
            "decoder_sparse_step": a.decoder_sparse_step, "mlp_only_layers": a.mlp_only_layers,
            "router_aux_loss_coef": 0.001, "output_router_logits": False, "use_sliding_window": False}


def deepseek_config(a, common):
    """DeepSeek-V3 as the published config.json lays it out (num_key_value_heads = heads,
    no head_dim: the q/k head is qk_nope_head_dim + qk_rope_head_dim)."""
    cfg = dict(common)
    cfg.pop("head_dim")
    cfg["num_key_value_heads"] = a.heads
    cfg.update({
        "q_lora_rank": a.q_lora_rank if a.q_lora_rank > 0 else None, "kv_lora_rank": a.kv_lora_rank,
        "qk_nope_head_dim": a.qk_nope_dim, "qk_rope_head_dim": a.qk_rope_dim, "v_head_dim": a.v_head_dim,
        "n_routed_experts": a.experts, "n_shared_experts": a.n_shared, "num_experts_per_tok": a.experts_per_tok,
        "moe_intermediate_size": a.moe_ffn, "moe_layer_freq": 1, "first_k_dense_replace": a.first_dense,
        "n_group": a.n_group, "topk_group": a.topk_group, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": a.norm_topk, "routed_scaling_factor": a.routed_scale,
        "num_nextn_predict_layers": 1 if a.mtp else 0, "aux_loss_alpha": 0.001, "seq_aux": True,
    })
    if a.arch == "deepseek_v32":
        cfg.update({"index_n_heads": a.index_heads, "index_head_dim": a.index_head_dim, "index_topk": a.index_topk})
        return {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", **cfg}
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **cfg}


def mrope_section(a):
    """Interleaved M-RoPE: pair i takes stream i % 3, so stream j covers ceil((pairs - j) / 3)
    pairs (Qwen's [11, 11, 10] for 32). llama.cpp rotates a pair outside its stream's section
    by a zero position, so the sections must cover every pair for text to be plain RoPE."""
    pairs = int(a.head_dim * a.partial_rotary) // 2
    return [(pairs - j + 2) // 3 for j in range(3)]


def is_moe_layer(a, i):
    return a.experts > 0 and i not in a.mlp_only_layers and (i + 1) % a.decoder_sparse_step == 0


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", help="directory to create (files in it are overwritten)")
    p.add_argument("--arch", choices=["llama", "qwen3", "qwen3_moe"] + HYBRID_ARCHS + DEEPSEEK_ARCHS, default=None,
                   help="architecture (default llama)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named shape; explicit options override it")
    p.add_argument("--hidden", type=int, help="hidden size (default 64)")
    p.add_argument("--layers", type=int, help="decoder layers (default 2)")
    p.add_argument("--heads", type=int, help="attention heads (default 4)")
    p.add_argument("--kv-heads", type=int, help="KV heads, divides --heads (default 2)")
    p.add_argument("--head-dim", type=int, help="per-head dim, even (default 16)")
    p.add_argument("--ffn", type=int, help="SwiGLU intermediate size (default 128)")
    p.add_argument("--vocab", type=int, help="vocabulary size incl. special tokens (default 512)")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="weight dtype (default f32)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--tokenizer-from", metavar="DIR",
                   help="copy DIR's tokenizer.json and tokenizer_config.json instead of generating a tokenizer "
                        "(byte-level BPE; --vocab must cover its ids)")
    p.add_argument("--tie", action="store_true", default=None, help="tie the output head to the embedding")
    p.add_argument("--max-pos", type=int, help="max_position_embeddings (default 512)")
    p.add_argument("--rope-theta", type=float, help="RoPE base (default 10000 for llama, 1000000 for qwen3)")
    p.add_argument("--rms-eps", type=float, help="RMSNorm epsilon (default 1e-5 llama, 1e-6 qwen3)")
    p.add_argument("--rope-scaling", choices=["llama3", "yarn", "linear"], help="add a rope_scaling block")
    p.add_argument("--rope-factor", type=float, help="rope_scaling factor (default 8 llama3, 4 yarn, 2 linear)")
    p.add_argument("--rope-orig-max-pos", type=int,
                   help="original_max_position_embeddings for llama3/yarn (default max-pos / factor)")
    moe = p.add_argument_group("MoE (qwen3_moe, qwen3_5_moe, qwen3_next)")
    moe.add_argument("--experts", type=int, default=8, help="routed experts (default 8)")
    moe.add_argument("--experts-per-tok", type=int, default=2, help="experts per token, top-k (default 2)")
    moe.add_argument("--moe-ffn", type=int, default=64, help="expert intermediate size (default 64)")
    moe.add_argument("--no-norm-topk", dest="norm_topk", action="store_false",
                     help="qwen3_moe: norm_topk_prob false (default true, as Qwen3-30B-A3B)")
    moe.add_argument("--decoder-sparse-step", type=int, default=1, help="qwen3_moe, qwen3_next: every n-th layer is MoE")
    moe.add_argument("--mlp-only-layers", type=lambda t: [int(x) for x in t.split(",") if x], default=[],
                     help="qwen3_moe, qwen3_next: comma-separated dense layers")
    moe.add_argument("--shared-ffn", type=int, default=64, help="qwen3_5_moe, qwen3_next: shared expert size (default 64)")
    hy = p.add_argument_group("hybrid Gated DeltaNet (qwen3_5, qwen3_5_moe, qwen3_next)")
    hy.add_argument("--full-attn-interval", type=int, default=4, help="every n-th layer is full attention (default 4)")
    hy.add_argument("--lin-k-heads", type=int, default=2, help="GDN key heads (default 2)")
    hy.add_argument("--lin-v-heads", type=int, default=4, help="GDN value heads (default 4)")
    hy.add_argument("--lin-dk", type=int, default=32, help="GDN key head dim (default 32)")
    hy.add_argument("--lin-dv", type=int, default=32, help="GDN value head dim (default 32)")
    hy.add_argument("--conv-kernel", type=int, default=4, help="GDN conv1d width (default 4)")
    hy.add_argument("--partial-rotary", type=float, default=0.25, help="partial_rotary_factor (default 0.25)")
    hy.add_argument("--no-mtp", dest="mtp", action="store_false", help="leave out the mtp.* weights")
    ds = p.add_argument_group("DeepSeek-V3 (deepseek_v3; also uses --experts, --experts-per-tok, --moe-ffn, --no-mtp)")
    ds.add_argument("--q-lora-rank", type=int, default=32, help="q low-rank width; 0: a direct q_proj (default 32)")
    ds.add_argument("--kv-lora-rank", type=int, default=32, help="latent c_kv width (default 32)")
    ds.add_argument("--qk-nope-dim", type=int, default=16, help="q/k head dims without RoPE (default 16)")
    ds.add_argument("--qk-rope-dim", type=int, default=8, help="q/k head dims with RoPE, even (default 8)")
    ds.add_argument("--v-head-dim", type=int, default=16, help="value head dim (default 16)")
    ds.add_argument("--first-dense", type=int, default=1, help="first_k_dense_replace: dense layers first (default 1)")
    ds.add_argument("--n-group", type=int, default=1, help="expert groups for group-limited routing (default 1)")
    ds.add_argument("--topk-group", type=int, default=1, help="groups a token may pick experts from (default 1)")
    ds.add_argument("--n-shared", type=int, default=1, help="shared experts, each --moe-ffn wide (default 1)")
    ds.add_argument("--routed-scale", type=float, default=2.5, help="routed_scaling_factor (default 2.5)")
    ds.add_argument("--yarn-mscale", type=float, default=1.0, help="mscale and mscale_all_dim under yarn (default 1)")
    ds.add_argument("--index-heads", type=int, default=4, help="deepseek_v32: indexer heads (default 4)")
    ds.add_argument("--index-head-dim", type=int, default=16,
                    help="deepseek_v32: indexer head dim, >= --qk-rope-dim (default 16)")
    ds.add_argument("--index-topk", type=int, default=8, help="deepseek_v32: positions each query keeps (default 8)")
    p.add_argument("--max-shard-size", type=parse_size, default=parse_size("2GB"),
                   help="split weights into model-0000X-of-0000Y.safetensors above this size (default 2GB)")
    a = p.parse_args(argv)
    defaults = dict(arch="llama", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=512,
                    dtype="f32", tie=False, max_pos=512)
    if a.preset:
        defaults.update(PRESETS[a.preset])
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.rope_theta is None:
        a.rope_theta = {"llama": 10000.0, "qwen3_5": 10000000.0, "qwen3_5_moe": 10000000.0,
                        "qwen3_next": 10000000.0, "deepseek_v3": 10000.0, "deepseek_v32": 10000.0}.get(a.arch, 1000000.0)
    if a.arch == "qwen3_5":
        a.experts = 0
    if a.arch in ["qwen3_moe", "qwen3_5_moe", "qwen3_next"] + DEEPSEEK_ARCHS and not 1 <= a.experts_per_tok <= a.experts:
        p.error("--experts-per-tok must be in [1, --experts]")
    if a.arch == "deepseek_v32" and (a.q_lora_rank <= 0 or a.index_head_dim < a.qk_rope_dim or a.index_topk <= 0):
        p.error("deepseek_v32 needs --q-lora-rank > 0, --index-head-dim >= --qk-rope-dim and --index-topk > 0")
    if a.arch in DEEPSEEK_ARCHS:
        a.kv_heads = a.heads  # MLA: num_key_value_heads = heads in the published configs
        if a.qk_rope_dim <= 0 or a.qk_rope_dim % 2:
            p.error("--qk-rope-dim must be positive and even")
        if a.n_group < 1 or a.experts % a.n_group or not 1 <= a.topk_group <= a.n_group:
            p.error("--n-group must divide --experts and --topk-group be in [1, --n-group]")
        if a.experts_per_tok > a.topk_group * (a.experts // a.n_group):
            p.error("--experts-per-tok exceeds the experts of --topk-group groups")
    if a.arch in HYBRID_ARCHS and a.lin_v_heads % a.lin_k_heads:
        p.error("--lin-v-heads must be a multiple of --lin-k-heads")
    if a.rms_eps is None:
        a.rms_eps = 1e-5 if a.arch == "llama" else 1e-6
    for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "max_pos"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if a.heads % a.kv_heads:
        p.error(f"--heads {a.heads} must be a multiple of --kv-heads {a.kv_heads}")
    if a.head_dim % 2:
        p.error("--head-dim must be even (RoPE rotates pairs)")
    if a.max_shard_size <= 0:
        p.error("--max-shard-size must be positive")
    return a


def copied_tokenizer(a):
    """tokenizer.json and tokenizer_config.json of --tokenizer-from (a real byte-level BPE
    tokenizer, e.g. Qwen3's 151,669 tokens, beyond what learn_merges can invent)."""
    with open(os.path.join(a.tokenizer_from, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    with open(os.path.join(a.tokenizer_from, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    added = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    top = max([len(tok["model"]["vocab"])] + [i + 1 for i in added.values()])
    if top > a.vocab:
        raise SystemExit(f"gen_model: --vocab {a.vocab} is smaller than the tokenizer's {top} ids")
    eos = added.get(config.get("eos_token") or "", added.get("<|im_end|>", top - 1))
    endoftext = added.get("<|endoftext|>", eos)
    ids = {"bos": endoftext, "eos": eos, "pad": endoftext, "endoftext": endoftext}
    return tok, config, {"eos_token": config.get("eos_token")}, ids


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(a.out_dir, exist_ok=True)
    # Tokenizer randomness has its own stream so that shapes do not change the vocabulary.
    tok_rng = np.random.default_rng([a.seed, 0xC0DE])
    if a.tokenizer_from:
        tok, tok_config, special_map, ids = copied_tokenizer(a)
    elif a.arch == "llama":
        tok, tok_config, special_map, ids = spm_tokenizer(a, tok_rng)
    else:
        tok, tok_config, special_map, ids = bytelevel_tokenizer(a, tok_rng)
    write_json(os.path.join(a.out_dir, "tokenizer.json"), tok)
    write_json(os.path.join(a.out_dir, "tokenizer_config.json"), tok_config)
    write_json(os.path.join(a.out_dir, "special_tokens_map.json"), special_map)
    write_json(os.path.join(a.out_dir, "config.json"), model_config(a, ids))
    gen = {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"] if a.arch == "llama" else [ids["eos"], ids["endoftext"]],
           "transformers_version": "4.51.0"}
    write_json(os.path.join(a.out_dir, "generation_config.json"), gen)
    # Remove stale weights from an earlier run with another shard count.
    for f in os.listdir(a.out_dir):
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".safetensors.index.json")):
            os.remove(os.path.join(a.out_dir, f))
    n_params, n_shards = write_weights(a.out_dir, a)
    print(f"wrote {a.out_dir}: {a.arch}, {n_params / 1e6:.2f}M parameters, {a.dtype}, {n_shards} shard(s)")


if __name__ == "__main__":
    main()
