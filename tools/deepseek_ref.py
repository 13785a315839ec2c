#!/usr/bin/env python3
"""NumPy reference of DeepSeek-V3 (deepseek_v3) and V3.2 (deepseek_v32): the whole forward of a
small checkpoint, built from one MLA layer (`mla`, with V3.2's lightning indexer choosing the
positions each query attends to, `indexer_mask`), written from the Hugging Face / DeepSeek
reference code's equations (ARCHITECTURES.md section 5), independently of Infera's kernels,
for tests and the layer-by-layer dump diff.

    python3 tools/deepseek_ref.py MODEL_DIR --tokens 3,14,15,92 --out logits.npy [--dump DIR]

writes the logits of every position, [T, vocab] float32 (.npy, or raw for another suffix). --dump DIR also writes the
per-layer intermediates under the file names `infera run --dump-tensors` uses for the
prompt's forward (0000-layer_out-000.npy, ...), so tools/diff_dump.py can compare them.

Conventions followed (HF modeling_deepseek_v3.py):
  - RoPE on the q_pe / k_pe parts with interleaved pairs: HF de-interleaves (x0, x2, ...,
    x1, x3, ...) and applies rotate_half; the same permutation of q and k leaves scores
    unchanged, which is what the reference does literally here;
  - YaRN inverse frequencies (_compute_yarn_parameters) and cos/sin times
    mscale(factor, mscale) / mscale(factor, mscale_all_dim);
  - softmax scale 1/sqrt(qk_nope + qk_rope), times mscale(factor, mscale_all_dim)^2;
  - the naive attention form: k_nope and v expanded from c_kv by kv_b_proj;
  - V3.2 indexer: q_I = wq_b(c_q), k_I = LayerNorm(wk(x)), both rotated NeoX-style on their
    first qk_rope_head_dim dims, head weights weights_proj(x) / sqrt(heads * head_dim), score
    sum_h w_h relu(q_I,h . k_I); the Hadamard rotation of the official kernels is orthogonal
    and so left out (it changes no score in exact arithmetic);
  - router: sigmoid scores, + e_score_correction_bias for selection, group score = sum of
    the best two in each group, the topk_group best groups kept (others -inf, as
    llama.cpp), top-k, weights the unbiased scores, renormalised, times
    routed_scaling_factor; shared experts added ungated.
Requires only python3 and numpy.
"""

import argparse
import json
import math
import os

import numpy as np

import safetensors_file as st


def load_safetensors(model_dir):
    """Every float tensor of the checkpoint, as float64."""
    out = {}
    for name, (dtype, arr) in st.read_model(model_dir).items():
        if dtype not in ("F32", "BF16", "F16"):
            raise SystemExit(f"{name}: dtype {dtype} not supported")
        out[name] = st.to_f32(dtype, arr).astype(np.float64)
    return out


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def yarn_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_params(cfg):
    """inv_freq [P/2], cos/sin factor, softmax scale."""
    d = cfg["qk_rope_head_dim"]
    base = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    scale = 1.0 / math.sqrt(cfg["qk_nope_head_dim"] + d)
    attn_factor = 1.0
    rs = cfg.get("rope_scaling")
    if rs and (rs.get("rope_type") or rs.get("type")) == "yarn":
        factor = rs["factor"]
        orig = rs.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        bf, bs = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

        def corr(rot):
            return (d * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
        low, high = max(math.floor(corr(bf)), 0), min(math.ceil(corr(bs)), d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extra = 1.0 - ramp
        inv = (inv / factor) * (1 - extra) + inv * extra
        m, mad = rs.get("mscale"), rs.get("mscale_all_dim")
        if rs.get("attention_factor") is not None:
            attn_factor = rs["attention_factor"]
        elif m and mad:
            attn_factor = yarn_mscale(factor, m) / yarn_mscale(factor, mad)
        else:
            attn_factor = yarn_mscale(factor, 1.0)
        if mad:
            ms = yarn_mscale(factor, mad)
            scale *= ms * ms
    return inv, attn_factor, scale


def rope_hf(x, pos, inv, attn_factor):
    """x [..., T, d] with interleaved pairs, HF style: de-interleave, then rotate_half."""
    d = x.shape[-1]
    x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
    freqs = np.outer(pos, inv)  # [T, d/2]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb) * attn_factor, np.sin(emb) * attn_factor
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * cos + rot * sin


def mla(w, p, cfg, a, pos):
    """One MLA attention over a whole sequence a [T, H] (naive form, causal)."""
    T = a.shape[0]
    nh, nope, pr, vd, r = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                           cfg["v_head_dim"], cfg["kv_lora_rank"])
    eps = cfg.get("rms_norm_eps", 1e-6)
    s = p + "self_attn."
    cq = None
    if cfg.get("q_lora_rank"):
        cq = rms(a @ w[s + "q_a_proj.weight"].T, w[s + "q_a_layernorm.weight"], eps)
        q = cq @ w[s + "q_b_proj.weight"].T
    else:
        q = a @ w[s + "q_proj.weight"].T
    q = q.reshape(T, nh, nope + pr).transpose(1, 0, 2)  # [nh, T, qk]
    ckv = a @ w[s + "kv_a_proj_with_mqa.weight"].T
    c, k_pe = ckv[:, :r], ckv[:, r:]
    c = rms(c, w[s + "kv_a_layernorm.weight"], eps)
    kv = (c @ w[s + "kv_b_proj.weight"].T).reshape(T, nh, nope + vd).transpose(1, 0, 2)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    inv, af, scale = rope_params(cfg)
    q_pe = rope_hf(q[..., nope:], pos, inv, af)
    k_pe = rope_hf(k_pe[None], pos, inv, af)  # [1, T, pr]
    scores = (q[..., :nope] @ k_nope.transpose(0, 2, 1) + q_pe @ np.broadcast_to(k_pe, (nh, T, pr)).transpose(0, 2, 1))
    scores = scores * scale + np.triu(np.full((T, T), -np.inf), 1)
    if cfg.get("index_n_heads"):
        scores = scores + indexer_mask(w, s + "indexer.", cfg, a, cq, pos, inv, af)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    o = (scores @ v).transpose(1, 0, 2).reshape(T, nh * vd)
    return o @ w[s + "o_proj.weight"].T


def rope_neox(x, pos, inv, attn_factor, rot):
    """NeoX pairing (i, i + rot/2) on the first `rot` dims of x [..., T, d]."""
    half = rot // 2
    ang = np.outer(pos, inv)  # [T, rot/2]
    cos, sin = np.cos(ang) * attn_factor, np.sin(ang) * attn_factor
    y = x.copy()
    a, b = x[..., :half], x[..., half:rot]
    y[..., :half] = a * cos - b * sin
    y[..., half:rot] = b * cos + a * sin
    return y


def indexer_mask(w, p, cfg, a, cq, pos, inv, af):
    """DeepSeek-V3.2 lightning indexer: 0 where query t keeps position s (its index_topk best
    scores among s <= t, ties to the lower position; every s <= t when t + 1 <= index_topk),
    -inf elsewhere. [T, T]."""
    T = a.shape[0]
    nI, dI, k, pr = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"], cfg["qk_rope_head_dim"]
    q = (cq @ w[p + "wq_b.weight"].T).reshape(T, nI, dI).transpose(1, 0, 2)  # [nI, T, dI]
    kk = a @ w[p + "wk.weight"].T
    mu = kk.mean(-1, keepdims=True)
    var = ((kk - mu) ** 2).mean(-1, keepdims=True)
    kk = (kk - mu) / np.sqrt(var + 1e-6) * w[p + "k_norm.weight"] + w[p + "k_norm.bias"]
    q = rope_neox(q, pos, inv, af, pr)
    kk = rope_neox(kk, pos, inv, af, pr)
    wt = (a @ w[p + "weights_proj.weight"].T) / math.sqrt(nI * dI)  # [T, nI]
    score = np.einsum("th,hts->ts", wt, np.maximum(q @ kk.T, 0.0))  # [T, T]
    mask = np.full((T, T), -np.inf)
    for t in range(T):
        if t + 1 <= k:
            mask[t, :t + 1] = 0.0
            continue
        order = sorted(range(t + 1), key=lambda s_: (-score[t, s_], s_))[:k]
        mask[t, order] = 0.0
    return mask


def swiglu(w, p, x):
    return (silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def moe(w, p, cfg, x):
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    ng, tg = max(cfg.get("n_group") or 1, 1), max(cfg.get("topk_group") or 1, 1)
    s = 1.0 / (1.0 + np.exp(-(x @ w[p + "gate.weight"].T)))  # [T, E]
    bias = w.get(p + "gate.e_score_correction_bias")
    sel = s + (bias if bias is not None else 0.0)
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        st = sel[t].copy()
        if ng > 1 and tg < ng:
            g = st.reshape(ng, E // ng)
            gs = np.sort(g, axis=1)[:, ::-1][:, :2].sum(1) if E // ng >= 2 else g[:, 0]
            keep = np.argsort(-gs, kind="stable")[:tg]
            mask = np.full(ng, True)
            mask[keep] = False
            g[mask] = -np.inf
            st = g.reshape(E)
        idx = np.argsort(-st, kind="stable")[:k]
        wt = s[t, idx]
        if cfg.get("norm_topk_prob", True):
            wt = wt / (wt.sum() + 1e-20)
        wt = wt * cfg.get("routed_scaling_factor", 1.0)
        for j, e in zip(wt, idx):
            y[t] += j * swiglu(w, f"{p}experts.{e}.", x[t:t + 1])[0]
    if cfg.get("n_shared_experts"):
        y += swiglu(w, p + "shared_experts.", x)
    return y


def forward(w, cfg, tokens, dump=None):
    eps = cfg.get("rms_norm_eps", 1e-6)
    x = w["model.embed_tokens.weight"][tokens]
    pos = np.arange(len(tokens), dtype=np.float64)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + mla(w, p, cfg, rms(x, w[p + "input_layernorm.weight"], eps), pos)
        m = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        dense = i < cfg.get("first_k_dense_replace", 0) or not cfg.get("n_routed_experts")
        x = x + (swiglu(w, p + "mlp.", m) if dense else moe(w, p + "mlp.", cfg, m))
        if dump:
            np.save(os.path.join(dump, f"0000-layer_out-{i:03d}.npy"), x.astype(np.float32))
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return rms(x, w["model.norm.weight"], eps) @ head.T


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True, help="logits [T, vocab]: .npy, or raw little-endian float32 (any other name)")
    ap.add_argument("--dump", help="also write per-layer outputs here")
    a = ap.parse_args()
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") not in ("deepseek_v3", "deepseek_v32"):
        raise SystemExit(f"{a.model_dir}: model_type {cfg.get('model_type')} is not deepseek_v3 or deepseek_v32")
    w = load_safetensors(a.model_dir)
    tokens = [int(t) for t in a.tokens.split(",") if t]
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
    logits = forward(w, cfg, tokens, a.dump).astype("<f4")
    if a.out.endswith(".npy"):
        np.save(a.out, logits)
    else:
        logits.tofile(a.out)


if __name__ == "__main__":
    main()
