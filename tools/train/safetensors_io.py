"""Minimal safetensors reader/writer (bf16 and f32) so the training script needs nothing beyond torch and numpy.

Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, ...,
"__metadata__": {...}}, then the raw little-endian tensor bytes. The header is padded with spaces to a multiple of 8.
"""

import json
import struct

import numpy as np
import torch

_DTYPE_NAMES = {torch.bfloat16: "BF16", torch.float32: "F32"}


def _tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    return t.numpy().astype("<f4").tobytes()


def save_file(tensors, path, metadata=None):
    """tensors: dict name -> torch tensor (bf16 or f32). Names are written in sorted order."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in _DTYPE_NAMES:
            raise ValueError(f"{name}: unsupported dtype {t.dtype}")
        data = _tensor_bytes(t)
        header[name] = {"dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for data in blobs:
            f.write(data)


def load_file(path):
    """Returns dict name -> torch tensor in the stored dtype."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        chunk = raw[base + begin:base + end]
        if info["dtype"] == "BF16":
            arr = np.frombuffer(chunk, dtype="<i2").copy()
            out[name] = torch.from_numpy(arr).view(torch.bfloat16).reshape(info["shape"])
        elif info["dtype"] == "F32":
            out[name] = torch.from_numpy(np.frombuffer(chunk, dtype="<f4").copy()).reshape(info["shape"])
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
    return out
