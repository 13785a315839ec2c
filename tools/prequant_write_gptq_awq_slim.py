#!/usr/bin/env python3
"""Write a pre-quantized checkpoint in a published third-party layout from a float model.

    python3 tools/prequant_write_gptq_awq_slim.py IN_DIR OUT_DIR --format FORMAT [options] [--dequant-dir DIR]

FORMAT:
  gptq        GPTQ int4 (AutoGPTQ/GPTQModel): <p>.qweight int32 [I/8, O] packed along the input,
              <p>.qzeros int32 [ng, O/8] along the output (LSB first; the v1 format stores zero - 1),
              <p>.scales f16 [ng, O], <p>.g_idx int32 [I]; --sym/--asym, --desc-act (columns
              grouped in a shuffled order, g_idx recording each column's group), --v2
              (checkpoint_format gptq_v2: zeros stored as they are).
  awq         AWQ int4, GEMM layout (AutoAWQ): <p>.qweight int32 [I, O/8] and <p>.qzeros int32
              [ng, O/8] packed along the output in the order [0, 2, 4, 6, 1, 3, 5, 7], <p>.scales
              f16 [ng, O]; asymmetric zero points.
  slim-w8a8-dynamic, slim-w8a8, slim-w4a8
              Ascend msModelSlim: quant_model_description.json (each tensor's type) and
              quant_model_weights.safetensors. W8A8_DYNAMIC: int8 weight, f32 weight_scale and
              weight_offset [O, 1]. W8A8 (static): int8 weight, input_scale / input_offset [1] from a
              calibration pass (llama-family models: a numpy forward over --calib-tokens tokens),
              deq_scale [O] (f32, or int64 with --deq-int64), quant_bias int32 [O]. W4A8_DYNAMIC
              (version 1.0.0): int4 packed along the output into int8 [O/2, I] (row 2j low nibble),
              weight_scale / weight_offset [O, 1], scale_bias [O, 1] (or [O, 16] for o_proj/down_proj);
              a layer whose inputs are not a multiple of 32 is written W8A8_DYNAMIC (mixed types).

Quantized: every 2-D "*_proj.weight" of the decoder layers (attention, MLP, shared and per-expert
MoE experts) and DeepSeek-V3.2's indexer wq_b and wk; the indexer's weights_proj stays float, as
DeepSeek's V3.2 FP8 release keeps it. A float model with fused experts (Qwen3.5's mlp.experts.gate_up_proj [E, 2F, H] and
down_proj [E, H, F]) has them split per expert first (<L>.mlp.experts.E.{gate,up,down}_proj), as
msModelSlim does: its Qwen3.5 and Qwen3-VL-MoE adapters turn the 3-D tensors into one Linear
module per expert, and its saver writes each module. Layers the layout cannot hold (a group size
not dividing the inputs, outputs not a multiple of 8) stay float and are listed as such (GPTQ
"dynamic" "-:" rule, AWQ modules_to_not_convert, msModelSlim FLOAT). Everything else is copied
as stored.

--fused-experts: a MoE's experts stored fused, as Infera's own format lays them out: each
expert's gate and up concatenated along the outputs (gate first) and quantized as one matrix,
every tensor of the per-module layout then stacked with the experts first, [E, ...]:
<L>.mlp.experts.gate_up_proj.{qweight,qzeros,scales,g_idx} (GPTQ; --desc-act gives one g_idx
per expert) or .{weight,weight_scale,weight_offset[,scale_bias]} (msModelSlim W8A8_DYNAMIC /
W4A8_DYNAMIC, described under <L>.mlp.experts.gate_up_proj.weight), and the same for down_proj.

--dequant-dir DIR writes the same model with every quantized layer replaced by the f32 weights
the checkpoint stands for (scale x (q - zero)): the reference tests compare against.

Requires only python3 and numpy.
"""

import argparse
import json
import os
import re
import shutil
import sys

import numpy as np

import safetensors_file as st

LINEAR = re.compile(
    r"^(model\.(?:language_model\.)?layers\.\d+\.(?:.*_proj(?:_[a-z]+)*|self_attn\.indexer\.(?:wq_b|wk)))\.weight$")
# Kept float as DeepSeek's V3.2 release keeps it (bf16; its reference code runs it in f32): the
# lightning indexer's per-head weights. Its query and key projections (wq_b, wk) are quantized.
KEEP_FLOAT = re.compile(r"\.self_attn\.indexer\.weights_proj\.weight$")
# A MoE's experts stored fused in the float model (Qwen3.5, Qwen3-Next's HF layout): [E, 2F, H]
# gate then up outputs, and [E, H, F].
FUSED_FLOAT = re.compile(r"^(model\.(?:language_model\.)?layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def as_stored(dtype, arr):
    if dtype == "BF16":  # back to bf16 bits (values came from bf16: exact)
        return (arr.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return arr


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


# ---- GPTQ / AWQ ------------------------------------------------------------------------------


def int4_groups(w, groups, sym, v1):
    """w [O, I] f64; groups: list of column index arrays. Returns q [O, I] uint8, scales f16 [ng, O],
    zeros int [ng, O] (the real zero point)."""
    O, _ = w.shape
    q = np.zeros(w.shape, dtype=np.uint8)
    scales = np.zeros((len(groups), O), dtype=np.float16)
    zeros = np.zeros((len(groups), O), dtype=np.int64)
    for g, cols in enumerate(groups):
        wg = w[:, cols]
        if sym:
            xmax = np.maximum(np.abs(wg).max(axis=1), 1e-8)
            s = f16(2 * xmax / 15).astype(np.float64)
            z = np.full(O, 8)
        else:
            xmin, xmax = np.minimum(wg.min(axis=1), 0), np.maximum(wg.max(axis=1), 0)
            s = f16(np.maximum(xmax - xmin, 1e-8) / 15).astype(np.float64)
            z = np.clip(np.round(-xmin / s), 1 if v1 else 0, 15).astype(np.int64)  # v1 cannot store zero 0
        s[s == 0] = 1.0
        q[:, cols] = np.clip(np.round(wg / s[:, None]) + z[:, None], 0, 15).astype(np.uint8)
        scales[g] = s.astype(np.float16)
        zeros[g] = z
    return q, scales, zeros


def dequant(q, scales, zeros, g_idx):
    s = scales.astype(np.float32)[g_idx].T  # [O, I]
    z = zeros[g_idx].T
    return (s * (q.astype(np.float32) - z.astype(np.float32))).astype(np.float32)


def pack_lsb(values, axis):
    """Eight 4-bit values per int32 along `axis`, element i of each run at bits 4i."""
    v = np.moveaxis(values.astype(np.uint32) & 0xF, axis, 0)
    v = v.reshape(v.shape[0] // 8, 8, *v.shape[1:])
    words = np.zeros(v.shape[:1] + v.shape[2:], dtype=np.uint32)
    for i in range(8):
        words |= v[:, i] << np.uint32(4 * i)
    return np.moveaxis(words, 0, axis).view(np.int32)


def pack_awq(values):
    """[R, O] 4-bit values -> int32 [R, O/8], slot i holding column 8c + AWQ_ORDER[i]."""
    v = values.astype(np.uint32).reshape(values.shape[0], -1, 8)
    words = np.zeros(v.shape[:2], dtype=np.uint32)
    for i, col in enumerate(AWQ_ORDER):
        words |= v[:, :, col] << np.uint32(4 * i)
    return words.view(np.int32)


def gptq_layer(w, a, rng):
    O, I = w.shape
    G = I if a.group_size == -1 else a.group_size
    if I % G or O % 8 or I % 8:
        return None
    order = rng.permutation(I) if a.desc_act else np.arange(I)
    groups = [np.sort(order[g * G:(g + 1) * G]) for g in range(I // G)]
    g_idx = np.zeros(I, dtype=np.int32)
    for g, cols in enumerate(groups):
        g_idx[cols] = g
    q, scales, zeros = int4_groups(w, groups, a.sym, v1=not a.v2)
    stored = zeros if a.v2 else zeros - 1
    t = {
        "qweight": ("I32", pack_lsb(q.T, 0)),  # [I/8, O]
        "qzeros": ("I32", pack_lsb(stored, 1)),  # [ng, O/8]
        "scales": ("F16", scales),
        "g_idx": ("I32", g_idx),
    }
    return t, dequant(q, scales, zeros, g_idx)


def awq_layer(w, a, rng):
    O, I = w.shape
    G = I if a.group_size == -1 else a.group_size
    if I % G or O % 8:
        return None
    groups = [np.arange(g * G, (g + 1) * G) for g in range(I // G)]
    q, scales, zeros = int4_groups(w, groups, sym=False, v1=False)
    g_idx = np.arange(I) // G
    t = {"qweight": ("I32", pack_awq(q.T)), "qzeros": ("I32", pack_awq(zeros)), "scales": ("F16", scales)}
    return t, dequant(q, scales, zeros, g_idx)


# ---- msModelSlim -----------------------------------------------------------------------------


def slim_w8a8_dynamic(w):
    s = np.maximum(np.abs(w).max(axis=1), 1e-8) / 127
    s = s.astype(np.float32)
    q = np.clip(np.round(w / s[:, None]), -128, 127).astype(np.int8)
    t = {
        "weight": ("I8", q),
        "weight_scale": ("F32", s[:, None]),
        "weight_offset": ("F32", np.zeros((w.shape[0], 1), dtype=np.float32)),
    }
    return t, (q.astype(np.float32) * s[:, None]).astype(np.float32)


def slim_w8a8_static(w, lo, hi, deq_int64):
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    in_scale = np.float32(max(hi - lo, 1e-6) / 255)
    in_offset = np.float32(np.round(-128 - lo / in_scale))
    ws = (np.maximum(np.abs(w).max(axis=1), 1e-8) / 127).astype(np.float32)
    q = np.clip(np.round(w / ws[:, None]), -128, 127).astype(np.int8)
    deq = (in_scale * ws).astype(np.float32)
    qbias = np.round(-in_offset.astype(np.float64) * q.astype(np.int64).sum(axis=1)).astype(np.int32)
    deq_t = ("I64", deq.view(np.uint32).astype(np.int64)) if deq_int64 else ("F32", deq)
    t = {
        "weight": ("I8", q),
        "input_scale": ("F32", np.array([in_scale], dtype=np.float32)),
        "input_offset": ("F32", np.array([in_offset], dtype=np.float32)),
        "deq_scale": deq_t,
        "quant_bias": ("I32", qbias),
    }
    ref = (q.astype(np.float32) * (deq / in_scale)[:, None]).astype(np.float32)
    return t, ref


def slim_w4a8(w, name):
    O, I = w.shape
    if O % 2:
        return None
    s = (np.maximum(np.abs(w).max(axis=1), 1e-8) / 7).astype(np.float32)
    q = np.clip(np.round(w / s[:, None]), -8, 7).astype(np.int8)
    packed = ((q[0::2] & 0xF) | ((q[1::2] & 0xF) << 4)).astype(np.uint8).view(np.int8)  # [O/2, I]
    deq = (q.astype(np.float32) * s[:, None]).astype(np.float32)
    chunks = 16 if re.search(r"(down_proj|o_proj|w2)$", name) and I % 16 == 0 else 1
    scale_bias = 8 * deq.reshape(O, chunks, I // chunks).sum(axis=2)
    t = {
        "weight": ("I8", packed),
        "weight_scale": ("F32", s[:, None]),
        "weight_offset": ("F32", np.zeros((O, 1), dtype=np.float32)),
        "scale_bias": ("F32", scale_bias.astype(np.float32)),
    }
    return t, deq


# ---- calibration (static W8A8): a numpy forward of a llama-family model --------------------


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def calibrate_llama(cfg, W, n_tokens, seed):
    """Min and max of the input of every linear layer over a random token sequence."""
    if cfg.get("model_type") not in ("llama", "qwen3") or cfg.get("num_local_experts") or cfg.get("num_experts"):
        sys.exit("slim-w8a8 (static activations) calibrates llama and qwen3 dense models only")
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or H // nh
    eps, theta = cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 10000.0)
    f = lambda n: W[n].astype(np.float64)  # noqa: E731
    rng = np.random.default_rng(seed)
    toks = rng.integers(3, cfg["vocab_size"], size=n_tokens)
    x = f("model.embed_tokens.weight")[toks]
    T = len(toks)
    inv = theta ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    ranges = {}

    def see(name, v):
        lo, hi = ranges.get(name, (np.inf, -np.inf))
        ranges[name] = (min(lo, float(v.min())), max(hi, float(v.max())))

    def rope(v):  # [T, h, hd], rotate-half
        a, b = v[..., : hd // 2], v[..., hd // 2:]
        return np.concatenate([a * cos[:, None] - b * sin[:, None], a * sin[:, None] + b * cos[:, None]], axis=-1)

    for i in range(L):
        p = f"model.layers.{i}."
        h = rms(x, f(p + "input_layernorm.weight"), eps)
        for n in ("q_proj", "k_proj", "v_proj"):
            see(p + "self_attn." + n, h)
        q = (h @ f(p + "self_attn.q_proj.weight").T).reshape(T, nh, hd)
        k = (h @ f(p + "self_attn.k_proj.weight").T).reshape(T, nkv, hd)
        v = (h @ f(p + "self_attn.v_proj.weight").T).reshape(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in W:
            q = rms(q, f(p + "self_attn.q_norm.weight"), eps)
            k = rms(k, f(p + "self_attn.k_norm.weight"), eps)
        q, k = rope(q), rope(k)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        att = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        att = att + np.triu(np.full((T, T), -np.inf), 1)[None]
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att /= att.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", att, v).reshape(T, nh * hd)
        see(p + "self_attn.o_proj", o)
        x = x + o @ f(p + "self_attn.o_proj.weight").T
        h = rms(x, f(p + "post_attention_layernorm.weight"), eps)
        see(p + "mlp.gate_proj", h)
        see(p + "mlp.up_proj", h)
        g = h @ f(p + "mlp.gate_proj.weight").T
        u = h @ f(p + "mlp.up_proj.weight").T
        m = g / (1 + np.exp(-g)) * u
        see(p + "mlp.down_proj", m)
        x = x + m @ f(p + "mlp.down_proj.weight").T
    return ranges


# ---- main ------------------------------------------------------------------------------------


EXPERT = re.compile(r"^(model\.(?:language_model\.)?layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
STACKED = re.compile(
    r"^(model\.(?:language_model\.)?layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_up_proj|down_proj)\.(\w+)$")


def unstack_experts(W):
    """Fused float experts -> per-expert 2-D weights <prefix>.E.{gate,up,down}_proj.weight, as msModelSlim
    does before quantizing (its Qwen3.5 / Qwen3-VL-MoE adapters split the 3-D tensors into Linear
    modules, and its saver writes one module each)."""
    out = {}
    for name, (dt, arr) in W.items():
        m = FUSED_FLOAT.match(name)
        if not m or arr.ndim != 3:
            out[name] = (dt, arr)
            continue
        prefix, proj = m.groups()
        for e in range(arr.shape[0]):
            if proj == "down_proj":
                out[f"{prefix}.{e}.down_proj.weight"] = (dt, arr[e])
            else:
                f = arr.shape[1] // 2
                out[f"{prefix}.{e}.gate_proj.weight"] = (dt, arr[e, :f])
                out[f"{prefix}.{e}.up_proj.weight"] = (dt, arr[e, f:])
    return out


def fuse_expert_floats(W):
    """Per-expert gate and up -> one <prefix>.E.gate_up_proj.weight [2F, H] each (gate rows first), so
    that every expert's fused matrix is quantized as one layer (one act-order permutation per
    expert and matrix, as a fused checkpoint stores it). Returns the new dict and the split map
    (fused name -> (gate name, up name))."""
    out, split, pairs = {}, {}, {}
    for name, (dt, arr) in W.items():
        m = EXPERT.match(name)
        if not m or m.group(3) == "down":
            out[name] = (dt, arr)
            continue
        pairs.setdefault((m.group(1), m.group(2)), {})[m.group(3)] = (name, dt, arr)
    for (prefix, e), gu in pairs.items():
        (gn, dt, g), (un, _, u) = gu["gate"], gu["up"]
        fused = f"{prefix}.{e}.gate_up_proj.weight"
        out[fused] = (dt, np.concatenate([g, u], axis=0))
        split[fused] = (gn, un)
    return out, split


def stack_experts(out, desc):
    """<prefix>.E.{gate_up,down}_proj.<part> -> <prefix>.{gate_up,down}_proj.<part> [E, ...]: every
    tensor of the per-module layout with the experts first (GPTQ/AWQ qweight, qzeros, scales, g_idx;
    msModelSlim weight, weight_scale, weight_offset, scale_bias). The description follows."""
    groups, stacked, sdesc = {}, {}, {}
    for name, t in out.items():
        m = STACKED.match(name)
        if not m:
            stacked[name] = t
            if name in desc:
                sdesc[name] = desc[name]
            continue
        prefix, e, proj, part = m.groups()
        groups.setdefault((prefix, proj, part), {})[int(e)] = (name, t)
    for (prefix, proj, part), experts in groups.items():
        n = len(experts)
        if sorted(experts) != list(range(n)):
            sys.exit(f"--fused-experts: {prefix}.{proj}.{part}: experts missing")
        dts = {experts[e][1][0] for e in range(n)}
        types = {desc.get(experts[e][0]) for e in range(n)}
        if len(dts) != 1 or len(types) != 1 or (part == "weight" and desc and types == {"FLOAT"}):
            sys.exit(f"--fused-experts: {prefix}.{proj}: the experts are stored differently")
        fused = f"{prefix}.{proj}.{part}"
        stacked[fused] = (dts.pop(), np.stack([experts[e][1][1] for e in range(n)]))
        if desc:
            sdesc[fused] = types.pop()
    return stacked, sdesc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("in_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--format", required=True, choices=["gptq", "awq", "slim-w8a8-dynamic", "slim-w8a8", "slim-w4a8"])
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--asym", dest="sym", action="store_false", help="GPTQ: asymmetric zero points")
    ap.add_argument("--desc-act", action="store_true", help="GPTQ: act-order (g_idx permutes the groups)")
    ap.add_argument("--v2", action="store_true", help="GPTQ: checkpoint_format gptq_v2")
    ap.add_argument("--deq-int64", action="store_true", help="msModelSlim W8A8: deq_scale as int64 f32 bits")
    ap.add_argument("--calib-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dequant-dir", help="also write the model with the dequantized f32 weights here")
    ap.add_argument("--fused-experts", action="store_true", help="gptq/awq: experts fused [E, ...] per projection")
    a = ap.parse_args(argv)

    cfg = json.load(open(os.path.join(a.in_dir, "config.json")))
    # BF16 tensors as their f32 values (as_stored() turns them back into bits).
    W = {n: (dt, st.bf16_value(arr) if dt == "BF16" else arr) for n, (dt, arr) in st.read_model(a.in_dir).items()}
    W = unstack_experts(W)
    unfused = W  # the reference model's tensors: per expert (what --dequant-dir writes)
    split = {}
    if a.fused_experts:
        if a.format == "slim-w8a8":
            sys.exit("--fused-experts: msModelSlim writes MoE experts W8A8_DYNAMIC or W4A8_DYNAMIC, not static W8A8")
        W, split = fuse_expert_floats(W)
    floats = {n: arr.astype(np.float32) for n, (dt, arr) in W.items() if dt in ("F32", "F16", "BF16")}
    rng = np.random.default_rng(a.seed)
    ranges = calibrate_llama(cfg, floats, a.calib_tokens, a.seed) if a.format == "slim-w8a8" else None

    out, ref, skipped, desc, layer_type = {}, {}, [], {}, {}
    slim_type = {"slim-w8a8-dynamic": "W8A8_DYNAMIC", "slim-w8a8": "W8A8", "slim-w4a8": "W4A8_DYNAMIC"}.get(a.format)
    for name in sorted(W):
        dt, arr = W[name]
        m = None if KEEP_FLOAT.search(name) else LINEAR.match(name)
        res = None
        if m and arr.ndim == 2 and dt in ("F32", "F16", "BF16"):
            w = arr.astype(np.float64)
            prefix = m.group(1)
            if a.format == "gptq":
                res = gptq_layer(w, a, rng)
            elif a.format == "awq":
                res = awq_layer(w, a, rng)
            elif a.format == "slim-w8a8-dynamic":
                res = slim_w8a8_dynamic(w)
            elif a.format == "slim-w8a8":
                lo, hi = ranges[prefix]
                res = slim_w8a8_static(w, lo, hi, a.deq_int64)
            elif w.shape[1] % 32 == 0:
                res = slim_w4a8(w, prefix)
            else:  # int4 kernels take inputs in groups of 32: such a layer is W8A8_DYNAMIC
                res = slim_w8a8_dynamic(w)
                layer_type[prefix] = "W8A8_DYNAMIC"
            if res is None:
                skipped.append(prefix)
        if res is None:
            out[name] = (dt, as_stored(dt, arr))
            desc[name] = "FLOAT"
            continue
        tensors, deq = res
        if name in split:  # the fused gate_up of one expert: its reference as the model stores it
            f = deq.shape[0] // 2
            ref[split[name][0]], ref[split[name][1]] = deq[:f], deq[f:]
        else:
            ref[name] = deq
        for suffix, t in tensors.items():
            out[f"{prefix}.{suffix}"] = t
            desc[f"{prefix}.{suffix}"] = layer_type.get(prefix, slim_type)
    if a.fused_experts:
        out, desc = stack_experts(out, desc)
    os.makedirs(a.out_dir, exist_ok=True)
    for f in os.listdir(a.in_dir):
        if f.endswith(".json") and f not in ("config.json", "model.safetensors.index.json") or f.endswith(".model"):
            shutil.copy(os.path.join(a.in_dir, f), os.path.join(a.out_dir, f))
    qcfg = dict(cfg)
    if a.format == "gptq":
        qcfg["quantization_config"] = {
            "quant_method": "gptq", "bits": 4, "group_size": a.group_size, "desc_act": a.desc_act, "sym": a.sym,
            "checkpoint_format": "gptq_v2" if a.v2 else "gptq", "true_sequential": True, "damp_percent": 0.01,
            "dynamic": {f"-:^{re.escape(p)}$": {} for p in skipped},
        }
    elif a.format == "awq":
        qcfg["quantization_config"] = {
            "quant_method": "awq", "bits": 4, "group_size": a.group_size, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": skipped or None,
        }
    else:
        qcfg.pop("quantization_config", None)
    json.dump(qcfg, open(os.path.join(a.out_dir, "config.json"), "w"), indent=2)
    if slim_type:
        desc.update({"model_quant_type": slim_type, "version": "1.0.0", "group_size": 0})
        json.dump(desc, open(os.path.join(a.out_dir, "quant_model_description.json"), "w"), indent=2)
        st.write(os.path.join(a.out_dir, "quant_model_weights.safetensors"), out, metadata={"format": "pt"})
    else:
        st.write(os.path.join(a.out_dir, "model.safetensors"), out, metadata={"format": "pt"})
    if a.dequant_dir:
        os.makedirs(a.dequant_dir, exist_ok=True)
        for f in os.listdir(a.in_dir):
            if f.endswith(".json") and f != "model.safetensors.index.json" or f.endswith(".model"):
                shutil.copy(os.path.join(a.in_dir, f), os.path.join(a.dequant_dir, f))
        dq = {n: ("F32", ref[n]) if n in ref else (dt, as_stored(dt, arr)) for n, (dt, arr) in unfused.items()}
        st.write(os.path.join(a.dequant_dir, "model.safetensors"), dq, metadata={"format": "pt"})
    print(f"{a.out_dir}: {len(ref)} layers quantized ({a.format}), {len(skipped)} kept float")


if __name__ == "__main__":
    main()
