#!/usr/bin/env python3
"""NumPy reference of the importance matrix (llama-imatrix's in_sum2 / counts) of a small
llama, qwen3 or qwen3_moe checkpoint: the whole forward over the calibration tokens, in
windows of --chunk-size tokens (each a fresh sequence from position 0), written from the
Hugging Face modeling code's equations independently of Infera's kernels, recording for
every block matrix the sum over tokens of its input squared, per input column, and the
number of tokens (per expert, the tokens routed to it). Names are llama.cpp's GGUF names.

    python3 tools/imatrix_ref.py MODEL_DIR --tokens 3,14,15,92 --chunk-size 64 --out ref.json

writes {"tokens": T, "entries": {"blk.0.attn_q.weight": {"cols": C, "counts": [...],
"sums": [...]}, ...}}, sums [matrices * cols] matrix-major as in the GGUF file.

Conventions (HF modeling_llama.py / modeling_qwen3.py / modeling_qwen3_moe.py): RMSNorm
x / sqrt(mean(x^2) + eps) * w; RoPE rotate_half on the head dimension, inv_freq
theta^(-2i/d) (no rope scaling); qwen3's q_norm / k_norm per head before RoPE; causal
softmax attention scaled by 1/sqrt(head_dim), kv heads shared by groups of q heads; SwiGLU
MLP; qwen3_moe: a sparse layer when (i + 1) % decoder_sparse_step == 0 and i is not in
mlp_only_layers, softmax router over all experts, the top num_experts_per_tok experts per
token (their order is immaterial here). Requires only python3 and numpy.
"""

import argparse
import json
import os

import numpy as np

import safetensors_file as st


def load(model_dir):
    out = {}
    for name, (dtype, arr) in st.read_model(model_dir).items():
        out[name] = st.to_f32(dtype, arr).astype(np.float64)
    return out


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


class Recorder:
    def __init__(self):
        self.entries = {}

    def add(self, name, x, matrices=1, mat=0):
        cols = x.shape[1]
        e = self.entries.setdefault(name, {"cols": cols, "sums": np.zeros((matrices, cols)),
                                           "counts": np.zeros(matrices, dtype=np.int64)})
        e["sums"][mat] += np.sum(x * x, axis=0)
        e["counts"][mat] += x.shape[0]


def rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    f = pos[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([f, f], -1)), np.sin(np.concatenate([f, f], -1))
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def attention(w, p, b, cfg, h, rec):
    T = h.shape[0]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    for s, g in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v")):
        rec.add(f"{b}{g}.weight", h)
    q = (h @ w[p + "q_proj.weight"].T).reshape(T, nh, hd)
    k = (h @ w[p + "k_proj.weight"].T).reshape(T, nkv, hd)
    v = (h @ w[p + "v_proj.weight"].T).reshape(T, nkv, hd)
    if p + "q_norm.weight" in w:
        q = rms(q, w[p + "q_norm.weight"], eps)
        k = rms(k, w[p + "k_norm.weight"], eps)
    pos = np.arange(T, dtype=np.float64)
    theta = cfg.get("rope_theta", 10000.0)
    q, k = rope(q, pos, theta), rope(k, pos, theta)
    out = np.zeros((T, nh, hd))
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(nh):
        j = i // (nh // nkv)
        s = q[:, i, :] @ k[:, j, :].T / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, i, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, j, :]
    o = out.reshape(T, nh * hd)
    rec.add(f"{b}attn_output.weight", o)
    return o @ w[p + "o_proj.weight"].T


def mlp(w, p, b, x, rec, suffix=""):
    rec.add(f"{b}ffn_gate{suffix}.weight", x)
    rec.add(f"{b}ffn_up{suffix}.weight", x)
    hidden = silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)
    rec.add(f"{b}ffn_down{suffix}.weight", hidden)
    return hidden @ w[p + "down_proj.weight"].T


def moe_forward(w, p, b, cfg, x, rec):
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    logits = x @ w[p + "gate.weight"].T
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    chosen = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, chosen, axis=1)
    if cfg.get("norm_topk_prob", False):
        weights = weights / weights.sum(axis=1, keepdims=True)
    y = np.zeros_like(x)
    for e in range(E):
        rows, slots = np.nonzero(chosen == e)
        if len(rows) == 0:
            continue
        xe = x[rows]
        q = f"{p}experts.{e}."
        rec.add(f"{b}ffn_gate_exps.weight", xe, E, e)
        rec.add(f"{b}ffn_up_exps.weight", xe, E, e)
        hidden = silu(xe @ w[q + "gate_proj.weight"].T) * (xe @ w[q + "up_proj.weight"].T)
        rec.add(f"{b}ffn_down_exps.weight", hidden, E, e)
        y[rows] += weights[rows, slots][:, None] * (hidden @ w[q + "down_proj.weight"].T)
    return y


def is_moe_layer(cfg, i):
    return (cfg.get("num_experts", 0) > 0 and i not in (cfg.get("mlp_only_layers") or [])
            and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0)


def window(w, cfg, tokens, rec):
    eps = cfg.get("rms_norm_eps", 1e-6)
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        x = x + attention(w, p + "self_attn.", b, cfg, rms(x, w[p + "input_layernorm.weight"], eps), rec)
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        if cfg["model_type"] == "qwen3_moe" and is_moe_layer(cfg, i):
            x = x + moe_forward(w, p + "mlp.", b, cfg, h, rec)
        else:
            x = x + mlp(w, p + "mlp.", b, h, rec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--out", required=True, help="JSON output")
    a = ap.parse_args()
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") not in ("llama", "qwen3", "qwen3_moe"):
        raise SystemExit(f"{a.model_dir}: model_type {cfg.get('model_type')} is not llama, qwen3 or qwen3_moe")
    if cfg.get("rope_scaling"):
        raise SystemExit(f"{a.model_dir}: rope scaling is not covered by this reference")
    w = load(a.model_dir)
    tokens = [int(t) for t in a.tokens.split(",") if t]
    rec = Recorder()
    for begin in range(0, len(tokens), a.chunk_size):
        window(w, cfg, tokens[begin:begin + a.chunk_size], rec)
    out = {"tokens": len(tokens), "entries": {}}
    for name, e in sorted(rec.entries.items()):
        out["entries"][name] = {"cols": e["cols"], "counts": [int(c) for c in e["counts"]],
                                "sums": [float(v) for v in e["sums"].reshape(-1)]}
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
