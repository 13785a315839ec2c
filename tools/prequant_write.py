#!/usr/bin/env python3
"""Write a pre-quantized copy of a float Hugging Face model directory, as published formats lay
it out, for Infera's tests and benchmarks (docs/quantization.md, "Pre-quantized checkpoints").

    python3 tools/prequant_write.py SRC_DIR OUT_DIR --format FORMAT [options]

FORMAT (what config.json's quantization_config and the tensors then say):
  fp8-block     quant_method "fp8", e4m3 weights, weight_block_size [B, B] (--block, default
                128), <m>.weight_scale_inv f32 [ceil(O/B), ceil(I/B)] (multiplied), dynamic
                activations (DeepSeek-V3, Qwen3-FP8)
  fp8-tensor    quant_method "fp8", one f32 <m>.weight_scale per matrix
  fp8-channel   quant_method "fp8", <m>.weight_scale f32 [O, 1]
  ct-w8a8       compressed-tensors int-quantized: int8 <m>.weight [O, I], <m>.weight_scale
                [O, 1] (channel, symmetric, absmax / 127.5), int8 activations per token, dynamic
  ct-w4a16      compressed-tensors pack-quantized: <m>.weight_packed int32 [O, I/8] (LSB-first
                along I, value + 8), <m>.weight_shape, <m>.weight_scale [O, I/G] (--group-size,
                default 128; --asym adds packed <m>.weight_zero_point [O/8, I/G])
  ct-fp8        compressed-tensors float-quantized: e4m3 <m>.weight, <m>.weight_scale [O, 1]
                (FP8_DYNAMIC)

Quantized: every 2-D "*_proj.weight" of the decoder layers (attention, MLP, experts, shared
experts; DeepSeek-V3.2's indexer wq_b and wk, its weights_proj kept float as DeepSeek's FP8
release keeps it), and in the fp8 formats fused 3-D experts (Qwen3.5's mlp.experts.gate_up_proj [E, 2F, H]
and down_proj: e4m3 under the same name, the experts' scales stacked [E, ...] under
<name>.weight_scale_inv / .weight_scale, as Qwen3.5's FP8 release stores them), whose input
features the scheme can divide; in the compressed-tensors formats fused 3-D experts are
quantized per expert (gate and up apart, as llm-compressor's linearized experts are) and
stacked as its repack_moe_model saves them: <name>.weight_packed / .weight [E, O, ...],
.weight_scale [E, O, ...], .weight_zero_point [E, ...], gate_up's gate and up joined along the
outputs and .weight_shape [E, 4] (gate's (F, I), up's) or [E, 2] (down); the rest (embeddings, lm_head, norms, the
MoE router) stay as stored, and modules left out are listed in the config's ignore list
(compressed-tensors) or modules_to_not_convert (fp8). Scales are --scale-dtype (fp8 default f32,
compressed-tensors default bf16, as the writers of each store them).

Beside the checkpoint, OUT_DIR/reference/model.safetensors holds every quantized matrix
dequantized to f32 under its logical name (what a loader must reconstruct, exactly), and --dequantized DIR
writes a float model directory with those weights (the model the checkpoint stands for).

--break KIND damages the first quantized matrix, for tests of the loader's error messages:
  scale-shape (a scale with one row too many), missing-scale, missing-zero (with --asym),
  weight-shape (a weight with one column too few), group (a group size that does not divide
  the input features, declared in config.json); for fused experts (compressed-tensors):
  fused-scale (the first gate_up_proj's stacked scale one expert short), fused-shape (its
  weight_shape [E, 2], as if gate and up were not joined).

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
from safetensors_file import bf16_bits, bf16_value, to_f32

# ---- float8 e4m3fn ----

def e4m3_table():
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes >> 7 == 1, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    mant = codes & 7
    val = np.where(exp == 0, mant / 8.0 * 2.0 ** -6, (1 + mant / 8.0) * 2.0 ** (exp - 7.0))
    val = (sign * val).astype(np.float32)
    val[0x7F] = np.nan
    val[0xFF] = np.nan
    return val


E4M3 = e4m3_table()
_POS = E4M3[:0x7F]  # codes 0..126: 0 .. 448, increasing


def to_e4m3(x):
    """f32 -> e4m3fn codes, round to nearest (ties to the even code), saturating at 448."""
    x = np.asarray(x, dtype=np.float32)
    a = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(_POS, a, side="left"), 0, 0x7E)
    lo = np.maximum(hi - 1, 0)
    d_hi = _POS[hi] - a
    d_lo = a - _POS[lo]
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0))
    code = np.where(pick_lo, lo, hi).astype(np.uint8)
    return np.where((x < 0) & (code != 0), code | 0x80, code).astype(np.uint8)


def scale_store(s, dtype):
    """The scale as stored (dtype string, array) and the f32 value a reader gets back."""
    s = np.asarray(s, dtype=np.float32)
    if dtype == "bf16":
        b = bf16_bits(s)
        return ("BF16", b), bf16_value(b)
    if dtype == "f16":
        h = s.astype(np.float16)
        return ("F16", h), h.astype(np.float32)
    return ("F32", s), s


# ---- formats ----

def quant_fp8_block(w, B, sdt):
    O, I = w.shape
    bo, bi = -(-O // B), -(-I // B)
    pad = np.zeros((bo * B, bi * B), dtype=np.float32)
    pad[:O, :I] = w
    blocks = np.abs(pad.reshape(bo, B, bi, B)).max(axis=(1, 3))
    s = np.where(blocks > 0, blocks / 448.0, 1.0).astype(np.float32)
    stored, sv = scale_store(s, sdt)
    full = np.repeat(np.repeat(sv, B, axis=0), B, axis=1)[:O, :I]
    code = to_e4m3(w / full)
    return code, stored, E4M3[code] * full


def quant_fp8_rows(w, per_tensor, sdt):
    O, I = w.shape
    amax = np.abs(w).max() if per_tensor else np.abs(w).max(axis=1, keepdims=True)
    s = np.where(amax > 0, amax / 448.0, 1.0).astype(np.float32)
    if per_tensor:
        s = np.array(s, dtype=np.float32).reshape(())
    stored, sv = scale_store(s, sdt)
    code = to_e4m3(w / sv)
    return code, stored, E4M3[code] * sv


def quant_int(w, bits, group, asym, sdt):
    """compressed-tensors' reference quantizer: q = clamp(round(x / s + zp), qmin, qmax)."""
    O, I = w.shape
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    g = w.reshape(O, I // group, group)
    if asym:
        lo = np.minimum(g.min(axis=2), 0)
        hi = np.maximum(g.max(axis=2), 0)
        s = (hi - lo) / float(qmax - qmin)
        s = np.where(s > 0, s, 1.0).astype(np.float32)
        stored, sv = scale_store(s, sdt)
        zp = np.clip(np.round(qmin - lo / sv), qmin, qmax).astype(np.int8)
    else:
        amax = np.abs(g).max(axis=2)
        s = np.where(amax > 0, amax / ((qmax - qmin) / 2.0), 1.0).astype(np.float32)
        stored, sv = scale_store(s, sdt)
        zp = np.zeros_like(sv, dtype=np.int8)
    q = np.clip(np.round(g / sv[:, :, None] + zp[:, :, None]), qmin, qmax).astype(np.int8)
    deq = (sv[:, :, None] * (q.astype(np.float32) - zp[:, :, None].astype(np.float32))).reshape(O, I)
    return q.reshape(O, I), stored, zp, deq.astype(np.float32)


def pack_int32(values, bits, axis):
    """Signed values -> int32 words, value + 2^(bits-1), LSB-first along `axis` (0 or 1)."""
    v = values.astype(np.int64) + (1 << (bits - 1))
    if axis == 0:
        v = v.T
    R, C = v.shape
    pf = 32 // bits
    words = -(-C // pf)
    pad = np.zeros((R, words * pf), dtype=np.int64)
    pad[:, :C] = v
    pad = pad.reshape(R, words, pf)
    out = np.zeros((R, words), dtype=np.uint64)
    for i in range(pf):
        out |= (pad[:, :, i].astype(np.uint64) << np.uint64(bits * i))
    out = out.astype(np.uint32).view(np.int32)
    return out.T.copy() if axis == 0 else out


PROJ = re.compile(r"\.layers\.\d+\.(.*_proj(_with_mqa)?|self_attn\.indexer\.(wq_b|wk))\.weight$")
# DeepSeek-V3.2's lightning indexer: wq_b and wk are e4m3 in DeepSeek's FP8 release, weights_proj
# bf16 (its reference code holds it in f32). Kept float here in every format (compressed-tensors
# lists it in ignore).
KEEP_FLOAT = re.compile(r"\.self_attn\.indexer\.weights_proj\.weight$")
FUSED_EXPERTS = re.compile(r"\.layers\.\d+\.mlp\.experts\.(gate_up|down)_proj$")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--format", required=True,
                   choices=["fp8-block", "fp8-tensor", "fp8-channel", "ct-w8a8", "ct-w4a16", "ct-fp8"])
    p.add_argument("--block", type=int, default=128, help="fp8-block: block size (default 128)")
    p.add_argument("--group-size", type=int, default=128, help="ct-w4a16: group size (default 128)")
    p.add_argument("--asym", action="store_true", help="ct-w4a16 / ct-w8a8: asymmetric, with zero points")
    p.add_argument("--scale-dtype", choices=["f32", "bf16", "f16"], help="dtype of stored scales")
    p.add_argument("--dequantized", help="also write this float model directory with the dequantized weights")
    p.add_argument("--break", dest="breakage",
                   choices=["scale-shape", "missing-scale", "missing-zero", "weight-shape", "group",
                            "fused-scale", "fused-shape"])
    a = p.parse_args()

    fmt = a.format
    sdt = a.scale_dtype or ("f32" if fmt.startswith("fp8") else "bf16")
    src = st.read_model(a.src)
    with open(os.path.join(a.src, "config.json")) as f:
        config = json.load(f)
    os.makedirs(a.out, exist_ok=True)

    out, ref, skipped, dequant = {}, {}, [], {}
    first = None
    first_fused = None
    for name in sorted(src):
        dt, arr = src[name]
        if FUSED_EXPERTS.search(name) and arr.ndim == 3 and dt in ("F32", "BF16", "F16") and fmt.startswith("fp8-"):
            # Fused experts (Qwen3.5's FP8 layout): the e4m3 tensor under its own name, each expert's
            # scales stacked under <name>.weight_scale_inv (or .weight_scale).
            w3 = to_f32(dt, arr)
            res = [quant_fp8_block(w, a.block, sdt) if fmt == "fp8-block"
                   else quant_fp8_rows(w, fmt == "fp8-tensor", sdt) for w in w3]
            out[name] = ("F8_E4M3", np.stack([r[0] for r in res]))
            out[name + (".weight_scale_inv" if fmt == "fp8-block" else ".weight_scale")] = (
                res[0][1][0], np.stack([np.asarray(r[1][1]) for r in res]))
            deq = np.stack([r[2] for r in res]).astype(np.float32)
            ref[name] = ("F32", deq)
            dequant[name] = deq
            continue
        if FUSED_EXPERTS.search(name) and arr.ndim == 3 and dt in ("F32", "BF16", "F16") and fmt.startswith("ct-"):
            w3 = to_f32(dt, arr)
            E, O, I = w3.shape
            parts = 2 if name.endswith("gate_up_proj") else 1
            F = O // parts
            if fmt == "ct-w4a16" and (I % a.group_size != 0 or I % 8 != 0 or (a.asym and F % 8 != 0)):
                skipped.append(name)
                out[name] = (dt, arr)
                continue
            if first_fused is None and parts == 2:
                first_fused = name
            per = {}  # tensor -> per expert list of per-part arrays
            deq = np.zeros((E, O, I), dtype=np.float32)
            sdtype = None
            for e in range(E):
                for p_ in range(parts):
                    w = w3[e, p_ * F:(p_ + 1) * F]
                    t = {}
                    if fmt == "ct-fp8":
                        code, stored, d = quant_fp8_rows(w, False, sdt)
                        t["weight"] = code
                        sdtype, t["weight_scale"] = stored[0], stored[1].reshape(F, 1)
                    elif fmt == "ct-w8a8":
                        q, stored, zp, d = quant_int(w, 8, I, a.asym, sdt)
                        t["weight"] = q
                        sdtype, t["weight_scale"] = stored[0], stored[1].reshape(F, 1)
                        if a.asym:
                            t["weight_zero_point"] = zp.reshape(F, 1)
                    else:
                        q, stored, zp, d = quant_int(w, 4, a.group_size, a.asym, sdt)
                        t["weight_packed"] = pack_int32(q, 4, 1)
                        t["weight_shape"] = np.array([F, I], dtype=np.int64)
                        sdtype, t["weight_scale"] = stored
                        if a.asym:
                            t["weight_zero_point"] = pack_int32(zp, 4, 0)
                    deq[e, p_ * F:(p_ + 1) * F] = d
                    for k, v in t.items():
                        per.setdefault(k, [[] for _ in range(E)])[e].append(np.asarray(v))
            dtypes = {"weight": "F8_E4M3" if fmt == "ct-fp8" else "I8", "weight_packed": "I32", "weight_shape": "I64",
                      "weight_scale": sdtype, "weight_zero_point": "I32" if fmt == "ct-w4a16" else "I8"}
            for k, experts in per.items():
                # Joined along the outputs (dimension 0 of each expert's tensor; 1-D ones end to end).
                out[name + "." + k] = (dtypes[k], np.stack([np.concatenate(x, axis=0) for x in experts]))
            ref[name] = ("F32", deq)
            dequant[name] = deq
            continue
        if KEEP_FLOAT.search(name):
            if fmt.startswith("ct-"):
                skipped.append(name[:-len(".weight")])
            out[name] = (dt, arr)
            continue
        if not PROJ.search(name) or arr.ndim != 2 or dt not in ("F32", "BF16", "F16"):
            out[name] = (dt, arr)
            continue
        w = to_f32(dt, arr)
        O, I = w.shape
        m = name[:-len(".weight")]
        group = a.group_size if fmt == "ct-w4a16" else I
        if fmt == "ct-w4a16" and (I % group != 0 or I % 8 != 0):
            skipped.append(m)
            out[name] = (dt, arr)
            continue
        if first is None:
            first = m
        if fmt == "fp8-block":
            code, stored, deq = quant_fp8_block(w, a.block, sdt)
            out[name] = ("F8_E4M3", code)
            out[m + ".weight_scale_inv"] = stored
        elif fmt in ("fp8-tensor", "fp8-channel", "ct-fp8"):
            code, stored, deq = quant_fp8_rows(w, fmt == "fp8-tensor", sdt)
            out[name] = ("F8_E4M3", code)
            out[m + ".weight_scale"] = stored
        elif fmt == "ct-w8a8":
            q, stored, zp, deq = quant_int(w, 8, I, a.asym, sdt)
            out[name] = ("I8", q)
            out[m + ".weight_scale"] = (stored[0], stored[1].reshape(O, 1))
            if a.asym:
                out[m + ".weight_zero_point"] = ("I8", zp.reshape(O, 1))
        else:  # ct-w4a16
            q, stored, zp, deq = quant_int(w, 4, group, a.asym, sdt)
            out[m + ".weight_packed"] = ("I32", pack_int32(q, 4, 1))
            out[m + ".weight_shape"] = ("I64", np.array([O, I], dtype=np.int64))
            out[m + ".weight_scale"] = stored
            if a.asym:
                out[m + ".weight_zero_point"] = ("I32", pack_int32(zp, 4, 0))
        ref[name] = ("F32", deq.astype(np.float32))
        dequant[name] = deq.astype(np.float32)

    if first is None:
        sys.exit("prequant_write.py: no matrix to quantize in " + a.src)

    # Damage, for the loader's error tests.
    group_decl = a.group_size
    if a.breakage == "scale-shape":
        key = next(k for k in out if k.startswith(first + ".weight_scale"))
        dt, arr = out[key]
        arr = np.asarray(arr)
        shape = (arr.shape[0] + 1,) + arr.shape[1:] if arr.ndim else (2,)
        out[key] = (dt, np.resize(arr, shape))
    elif a.breakage == "missing-scale":
        for k in [k for k in out if k.startswith(first + ".weight_scale")]:
            del out[k]
    elif a.breakage == "missing-zero":
        del out[first + ".weight_zero_point"]
    elif a.breakage == "weight-shape":
        key = first + (".weight_packed" if fmt == "ct-w4a16" else ".weight")
        dt, arr = out[key]
        out[key] = (dt, np.ascontiguousarray(arr[:, :-1]))
    elif a.breakage == "group":
        group_decl = 48  # divides no published model's features of this test's shapes
    elif a.breakage == "fused-scale":
        dt, arr = out[first_fused + ".weight_scale"]
        out[first_fused + ".weight_scale"] = (dt, np.ascontiguousarray(arr[:-1]))
    elif a.breakage == "fused-shape":
        dt, arr = out[first_fused + ".weight_shape"]
        out[first_fused + ".weight_shape"] = (dt, np.ascontiguousarray(arr[:, :2]))

    st.write(os.path.join(a.out, "model.safetensors"), out, aligned=True)
    os.makedirs(os.path.join(a.out, "reference"), exist_ok=True)
    st.write(os.path.join(a.out, "reference", "model.safetensors"), ref, aligned=True)

    if fmt.startswith("fp8"):
        qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
        if fmt == "fp8-block":
            qc["weight_block_size"] = [a.block, a.block]
        if skipped:
            qc["modules_to_not_convert"] = skipped
    else:
        def args(bits, typ, strategy, group=None, sym=True):
            d = {"num_bits": bits, "type": typ, "symmetric": sym, "strategy": strategy, "group_size": group,
                 "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax"}
            return d
        act = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
        if fmt == "ct-w8a8":
            group_cfg = {"targets": ["Linear"], "weights": args(8, "int", "channel", None, not a.asym),
                         "input_activations": act, "output_activations": None}
            cformat = "int-quantized"
        elif fmt == "ct-fp8":
            group_cfg = {"targets": ["Linear"], "weights": args(8, "float", "channel"),
                         "input_activations": dict(act, type="float"), "output_activations": None}
            cformat = "float-quantized"
        else:
            group_cfg = {"targets": ["Linear"], "weights": args(4, "int", "group", group_decl, not a.asym),
                         "input_activations": None, "output_activations": None}
            cformat = "pack-quantized"
        ignore = ["lm_head"] + skipped + ["re:.*mlp.gate$", "re:.*shared_expert_gate$"]
        qc = {"quant_method": "compressed-tensors", "format": cformat, "quantization_status": "compressed",
              "config_groups": {"group_0": group_cfg}, "ignore": ignore, "kv_cache_scheme": None,
              "sparsity_config": {}, "version": "0.10.2"}
    config["quantization_config"] = qc
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for fn in os.listdir(a.src):
        if fn.endswith(".json") and fn not in ("config.json", "model.safetensors.index.json"):
            shutil.copyfile(os.path.join(a.src, fn), os.path.join(a.out, fn))

    if a.dequantized:
        os.makedirs(a.dequantized, exist_ok=True)
        plain = {}
        for name, (dt, arr) in src.items():
            plain[name] = ("F32", dequant[name]) if name in dequant else (dt, arr)
        st.write(os.path.join(a.dequantized, "model.safetensors"), plain, aligned=True)
        for fn in os.listdir(a.src):
            if fn.endswith(".json") and fn != "model.safetensors.index.json":
                shutil.copyfile(os.path.join(a.src, fn), os.path.join(a.dequantized, fn))


if __name__ == "__main__":
    main()
