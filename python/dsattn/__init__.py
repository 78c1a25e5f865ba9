"""dsattn - DeepSeek's attention generations (MHA/GQA, MLA, DSA, CSA/HCA,
CSA2) from Python: ctypes over libdsattn.so, NumPy arrays in and out.

    import dsattn
    ctx = dsattn.Context(mode="reference")
    m = dsattn.load("case/weights.safetensors")        # config.json beside it
    s = m.sequence(max_seq_len=64)
    h = s.stack(x[:7], ctx)                            # prefill, advances
    h1 = s.stack(x[7:8], ctx)                          # one decode step
    hb = dsattn.stack_batch([s, s2], x[8:10], ctx)     # a step of two sequences
    hp = m.sequence(64).prefill(x[:7], "exact", ctx)   # V4.1: CED prefill (last row)
    rows = dsattn.bill(kv_only=True)                   # `dsattn bill` rows
    tensors = dsattn.trace("tests/data/golden/v41/tiny-seed0")

docs/python.md describes every call.  Errors raise dsattn.DsattnError with
the library's message; the GIL is released while the library computes.
"""
from ._lib import DsattnError
from ._lib import path as library_path
from ._core import (Context, Model, Sequence, bill, forward_batch, from_config, generation_of,
                    load, random, session_info, stack_batch, trace, version)
from ._safetensors import bf16_to_f32
from ._safetensors import read as read_safetensors

__version__ = version()

__all__ = ["Context", "Model", "Sequence", "DsattnError", "load", "random", "from_config",
           "generation_of", "forward_batch", "stack_batch", "session_info", "trace", "bill",
           "version",
           "read_safetensors", "bf16_to_f32", "library_path"]
