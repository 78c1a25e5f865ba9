"""_safetensors.py - reads a safetensors file (8-byte little-endian header
length, JSON header, raw little-endian tensors) into NumPy arrays, the way
dsattn writes them: bytes kept as stored, no conversion.

dtype mapping: F32/F16/F64, I8..I64, U8..U64 and BOOL to their NumPy
types; F8_E4M3 and F8_E8M0 (FP8 codes, UE8M0 scale bytes) to uint8; BF16 to
uint16 (the raw bf16 words - NumPy has no bfloat16; `bf16_to_f32` widens).
"""
import json
import struct

import numpy as np

_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "F8_E4M3": "u1", "F8_E8M0": "u1",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}


def read(path, with_metadata=False):
    """{name: numpy array} for every tensor of the file (copies; the file
    may be deleted afterwards).  with_metadata: also return the
    __metadata__ dict."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} past the end of the file")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    body = memoryview(data)[8 + n:]
    out = {}
    for name, t in header.items():
        dt = _DTYPES.get(t["dtype"])
        if dt is None:
            raise ValueError(f"{path}: {name}: dtype {t['dtype']} not supported")
        a, b = t["data_offsets"]
        arr = np.frombuffer(body[a:b], dtype=dt).reshape(t["shape"]).copy()
        out[name] = arr
    return (out, meta) if with_metadata else out


def bf16_to_f32(words):
    """uint16 bf16 words -> float32 (exact)."""
    return (np.asarray(words, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
