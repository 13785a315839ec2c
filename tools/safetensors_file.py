"""Reading and writing safetensors files with numpy alone, for the tools in this folder
(gen_model.py, prequant_write.py, prequant_write_gptq_awq_slim.py, deepseek_ref.py).

A file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
data_offsets; "__metadata__" optional) padded with spaces to a multiple of 8, then the data.
Arrays are handled in their storage type: BF16 as uint16 bits, F8_E4M3 as uint8 codes
(bf16_bits / to_f32 convert).
"""

import json
import os
import struct

import numpy as np

# safetensors dtype -> (numpy storage dtype, bytes per element)
DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2), "I8": (np.int8, 1),
          "U8": (np.uint8, 1), "I32": (np.int32, 4), "I64": (np.int64, 8), "F8_E4M3": (np.uint8, 1)}


def header_bytes(entries, metadata=None):
    """The length prefix and padded JSON header for entries (name, dtype, shape, nbytes), laid
    out back to back in that order; metadata, when given, is stored last as __metadata__."""
    header, offset = {}, 0
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata is not None:
        header["__metadata__"] = metadata
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data section 8-byte aligned, as safetensors does
    return struct.pack("<Q", len(blob)) + blob


def write(path, tensors, metadata=None, aligned=False):
    """tensors: name -> (dtype string, numpy array in that dtype's storage type). Tensors are
    stored by name; aligned=True puts larger elements first (every tensor naturally aligned)."""
    if aligned:
        names = sorted(tensors, key=lambda k: (-DTYPES[tensors[k][0]][1], k))
    else:
        names = sorted(tensors)
    blobs = []
    for name in names:
        a = tensors[name][1]
        blobs.append(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    entries = [(n, tensors[n][0], tensors[n][1].shape, len(b)) for n, b in zip(names, blobs)]
    with open(path, "wb") as f:
        f.write(header_bytes(entries, metadata))
        for b in blobs:
            f.write(b)


def read(path):
    """name -> (dtype string, read-only numpy array in its storage type)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in DTYPES:
            raise SystemExit(f"{path}: tensor '{name}' has dtype {info['dtype']}, which these tools do not read")
        b, e = info["data_offsets"]
        np_dt = DTYPES[info["dtype"]][0]
        out[name] = (info["dtype"], np.frombuffer(raw[8 + n + b:8 + n + e], dtype=np_dt).reshape(info["shape"]))
    return out


def model_files(model_dir):
    """A model directory's safetensors files: those its index names, else every one there."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = set(json.load(f)["weight_map"].values())
    else:
        files = {f for f in os.listdir(model_dir) if f.endswith(".safetensors")}
    return [os.path.join(model_dir, f) for f in sorted(files)]


def read_model(model_dir):
    """Every tensor of a model directory (all its shards), as read()."""
    out = {}
    for path in model_files(model_dir):
        out.update(read(path))
    return out


def bf16_bits(x):
    """f32 -> bf16 bits, rounded to nearest even."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_value(bits):
    """bf16 bits -> f32."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def to_f32(dtype, a):
    """A float tensor (F32, F16 or BF16 bits) as f32."""
    if dtype == "BF16":
        return bf16_value(a)
    return a.astype(np.float32)
