#!/usr/bin/env python3
"""A numpy reader of GGUF files: every tensor dequantized to float32, written from the
format's definition (llama.cpp's ggml-quants.c dequantize_row_*), independently of Infera's
C++ reference, so that tests can compare the two.

Usage: gguf_dequant.py FILE.gguf OUT_DIR
Writes OUT_DIR/<tensor name>.npy (float32, shape = the GGUF ne reversed) for each tensor of
a type it knows (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
IQ4_NL, IQ4_XS) and prints one line per tensor: name, type, shape.
"""
import os
import struct
import sys

import numpy as np

KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
# type id: (name, weights per block, bytes per block)
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
         6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84),
         11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
         20: ("IQ4_NL", 32, 18), 23: ("IQ4_XS", 256, 136)}
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class Cursor:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def get(self, fmt):
        v = struct.unpack_from("<" + fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize("<" + fmt)
        return v

    def string(self):
        n = self.get("Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.get("I"), self.get("Q")
            return [self.value(et) for _ in range(n)]
        return self.get(SCALARS[t])


def f16(b):  # uint8 [..., 2] -> float32
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)[..., 0]


def nibbles(qs):  # [nb, 16] -> [nb, 32]: low nibbles then high nibbles
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(np.int32)


def k4_scales(s):  # [nb, 12] -> sc [nb, 8], m [nb, 8]
    s = s.astype(np.int32)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), m.astype(np.float32)


def k_quants_low(qs, nb):  # Q4_K/Q5_K nibbles [nb, 128] -> [nb, 256]: per 64, 32 low then 32 high
    q = qs.reshape(nb, 4, 32).astype(np.int32)
    return np.concatenate([q & 0xF, q >> 4], axis=2).reshape(nb, 256)


def two_bit_groups(qs, nb):  # [nb, 64] -> [nb, 256]: per 128, shifts 0,2,4,6 over 32 bytes
    q = qs.reshape(nb, 2, 1, 32).astype(np.int32)
    return ((q >> np.array([0, 2, 4, 6]).reshape(1, 1, 4, 1)) & 3).reshape(nb, 256)


def dequant(tid, raw, n):
    name, bs, ts = TYPES[tid]
    if name == "F32":
        return np.frombuffer(raw, "<f4").astype(np.float32)
    if name == "F16":
        return np.frombuffer(raw, "<f2").astype(np.float32)
    if name == "BF16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    nb = n // bs
    b = np.frombuffer(raw, np.uint8).reshape(nb, ts)
    if name in ("Q4_0", "IQ4_NL"):
        d = f16(b[:, 0:2])[:, None]
        q = nibbles(b[:, 2:18])
        return (d * KVALUES[q] if name == "IQ4_NL" else (q - 8).astype(np.float32) * d).ravel()
    if name == "Q4_1":
        return (nibbles(b[:, 4:20]).astype(np.float32) * f16(b[:, 0:2])[:, None] + f16(b[:, 2:4])[:, None]).ravel()
    if name in ("Q5_0", "Q5_1"):
        one = name == "Q5_1"
        qh = b[:, (4 if one else 2):(8 if one else 6)].copy().view("<u4")[:, 0].astype(np.int64)
        high = (qh[:, None] >> np.arange(32)[None, :]) & 1
        q = nibbles(b[:, (8 if one else 6):]) | (high << 4)
        d = f16(b[:, 0:2])[:, None]
        return ((q.astype(np.float32) * d + f16(b[:, 2:4])[:, None]) if one else (q - 16).astype(np.float32) * d).ravel()
    if name == "Q8_0":
        return (b[:, 2:].view(np.int8).astype(np.float32) * f16(b[:, 0:2])[:, None]).ravel()
    if name == "Q2_K":
        sc = b[:, 0:16].astype(np.int32)
        q = two_bit_groups(b[:, 16:80], nb).reshape(nb, 16, 16).astype(np.float32)
        d, dmin = f16(b[:, 80:82])[:, None, None], f16(b[:, 82:84])[:, None, None]
        dl = d * (sc & 15).astype(np.float32)[:, :, None]
        ml = dmin * (sc >> 4).astype(np.float32)[:, :, None]
        return (dl * q - ml).ravel()
    if name == "Q3_K":
        hm = b[:, 0:32].astype(np.int32)
        q2 = two_bit_groups(b[:, 32:96], nb).reshape(nb, 2, 4, 32)
        hbit = ((hm[:, None, None, :] >> (4 * np.arange(2)[None, :, None, None] + np.arange(4)[None, None, :, None])) & 1)
        q = (q2 - np.where(hbit == 1, 0, 4)).reshape(nb, 16, 16).astype(np.float32)
        p = b[:, 96:108].astype(np.int32)
        j = np.arange(16)
        low = np.where(j < 8, p[:, np.minimum(j, 7)] & 0xF, p[:, np.maximum(j - 8, 0)] >> 4)
        high = (p[:, 8 + j % 4] >> (2 * (j // 4))) & 3
        sc = ((low | (high << 4)) - 32).astype(np.float32)
        return (f16(b[:, 108:110])[:, None, None] * sc[:, :, None] * q).ravel()
    if name in ("Q4_K", "Q5_K"):
        d, dmin = f16(b[:, 0:2])[:, None, None], f16(b[:, 2:4])[:, None, None]
        sc, m = k4_scales(b[:, 4:16])
        if name == "Q4_K":
            q = k_quants_low(b[:, 16:144], nb)
        else:
            qh = b[:, 16:48].astype(np.int32)
            e = np.arange(256)
            q = k_quants_low(b[:, 48:176], nb) | (((qh[:, e % 32] >> (e // 32)) & 1) << 4)
        q = q.reshape(nb, 8, 32).astype(np.float32)
        return ((d * sc[:, :, None]) * q - dmin * m[:, :, None]).ravel()
    if name == "Q6_K":
        ql = b[:, 0:128].reshape(nb, 2, 2, 32).astype(np.int32)  # [half, 32-row group of ql, l]
        qh = b[:, 128:192].reshape(nb, 2, 32).astype(np.int32)
        low = np.stack([ql[:, :, 0] & 0xF, ql[:, :, 1] & 0xF, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], axis=2)
        high = (qh[:, :, None, :] >> (2 * np.arange(4)[None, None, :, None])) & 3
        q = ((low | (high << 4)) - 32).reshape(nb, 16, 16).astype(np.float32)
        sc = b[:, 192:208].view(np.int8).astype(np.float32)
        return (f16(b[:, 208:210])[:, None, None] * sc[:, :, None] * q).ravel()
    if name == "IQ4_XS":
        d = f16(b[:, 0:2])[:, None, None]
        sh = b[:, 2:4].copy().view("<u2")[:, 0].astype(np.int32)
        sl = b[:, 4:8].astype(np.int32)
        ib = np.arange(8)
        ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 0xF) | (((sh[:, None] >> (2 * ib)) & 3) << 4)
        q = nibbles(b[:, 8:136].reshape(nb, 8, 16))
        return ((d * (ls - 32).astype(np.float32)[:, :, None]) * KVALUES[q]).ravel()
    raise ValueError(name)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, out = sys.argv[1], sys.argv[2]
    data = open(path, "rb").read()
    c = Cursor(data)
    if data[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    c.pos = 4
    c.get("I")
    n_tensors, n_kv = c.get("Q"), c.get("Q")
    meta = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.get("I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        ne = [c.get("Q") for _ in range(c.get("I"))]
        infos.append((name, ne, c.get("I"), c.get("Q")))
    align = meta.get("general.alignment", 32)
    start = (c.pos + align - 1) // align * align
    os.makedirs(out, exist_ok=True)
    for name, ne, tid, off in infos:
        if tid not in TYPES:
            print(f"{name}\tskipped type {tid}")
            continue
        n = int(np.prod(ne))
        _, bs, ts = TYPES[tid]
        raw = data[start + off:start + off + n // bs * ts]
        arr = dequant(tid, raw, n).astype(np.float32).reshape(list(reversed(ne)))
        np.save(os.path.join(out, name + ".npy"), arr)
        print(f"{name}\t{TYPES[tid][0]}\t{list(reversed(ne))}")


if __name__ == "__main__":
    main()
