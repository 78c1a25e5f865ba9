"""_lib.py - finds and loads libdsattn.so, declares the C prototypes the
package calls (ctypes: no compiler, no build step), and turns a failing
dsattn_status into DsattnError carrying the library's own message.

ctypes releases the GIL for the whole of every call into a CDLL, so other
Python threads run while dsattn computes.

Where the library is looked for, first hit wins:
  1. $DSATTN_LIBRARY (a path to libdsattn.so*);
  2. _native/ inside this package (what `pip install ./python` copies);
  3. the prefix of a `cmake --install` (_install.py, written by it);
  4. $DSATTN_BUILD_DIR, then build/ of the source tree this package sits in;
  5. the system loader (ldconfig paths, $LD_LIBRARY_PATH).
"""
import ctypes
import glob
import os

_HERE = os.path.dirname(os.path.abspath(__file__))

c_int, c_size_t, c_char_p, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p
c_int64, c_uint64, c_double, c_float = ctypes.c_int64, ctypes.c_uint64, ctypes.c_double, ctypes.c_float
P = ctypes.POINTER
c_float_p = P(c_float)


class DsattnError(RuntimeError):
    """A dsattn call failed.  str(e) is the library's message; e.status is
    the dsattn_status code (negative int) and e.status_name its name; a
    batched call's e.failed is the index of the first bad sequence (None
    when the fault is no one sequence's)."""

    def __init__(self, message, status=0, status_name="", failed=None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name
        self.failed = failed    # a batched call: the index of the first bad sequence


def _candidates():
    env = os.environ.get("DSATTN_LIBRARY")
    if env:
        yield env
    yield from _in_dir(os.path.join(_HERE, "_native"))
    try:
        from . import _install  # written by cmake --install
        yield from _in_dir(os.path.normpath(os.path.join(_HERE, _install.LIB)))
    except ImportError:
        pass
    bd = os.environ.get("DSATTN_BUILD_DIR")
    if bd:
        yield from _in_dir(bd)
    yield from _in_dir(os.path.normpath(os.path.join(_HERE, "..", "..", "build")))


def _in_dir(d):
    # the SONAME link (libdsattn.so.N) first, then the dev link
    d = os.path.abspath(d)
    names = sorted(glob.glob(os.path.join(d, "libdsattn.so.[0-9]*")), key=len)
    names += glob.glob(os.path.join(d, "libdsattn.so"))
    return names


def _blas_env():
    # Debian's OpenBLAS falls back to SSE3 kernels on CPUs it does not know
    # unless told the core type when it loads; the CLI decides it the same
    # way (src/core/blas.h): unset and AVX-512 F/BW/VL/DQ -> SkylakeX.  It
    # only helps when OpenBLAS was not loaded yet (import dsattn first).
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
                        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
                    return
    except OSError:
        pass


def _load():
    _blas_env()
    tried = []
    for path in _candidates():
        if not os.path.exists(path):
            continue
        try:
            return ctypes.CDLL(os.path.abspath(path)), os.path.abspath(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
    try:
        return ctypes.CDLL("libdsattn.so.0"), "libdsattn.so.0"
    except OSError as e:
        tried.append(f"libdsattn.so.0: {e}")
    raise ImportError("dsattn: cannot load libdsattn.so (set DSATTN_LIBRARY, build the "
                      "library, or install it):\n  " + "\n  ".join(tried))


lib, path = _load()
lib_dir = os.path.dirname(os.path.abspath(path)) if os.path.isabs(path) else None


class CtxParams(ctypes.Structure):
    _fields_ = [("mode", c_int), ("isa", c_int), ("n_threads", c_int)]


class Counters(ctypes.Structure):
    _fields_ = [("flops", c_uint64), ("bytes_read", c_uint64)]


N_PHASES = 7


class Profile(ctypes.Structure):
    _fields_ = [("seconds", c_double * N_PHASES), ("proj_seconds", c_double * N_PHASES),
                ("bytes_read", c_uint64 * N_PHASES), ("flops", c_uint64 * N_PHASES),
                ("proj_flops", c_uint64 * N_PHASES)]


class KvBill(ctypes.Structure):
    _fields_ = [("global_bytes_per_token", c_double), ("global_bytes_allocated", c_size_t),
                ("window_bytes", c_size_t), ("state_bytes", c_size_t),
                ("scratch_bytes", c_size_t)]


class SessionInfo(ctypes.Structure):
    _fields_ = [("format", ctypes.c_uint), ("lib_version", ctypes.c_char * 16),
                ("generation", c_int), ("variant", ctypes.c_uint32 * 2),
                ("n_sections", ctypes.c_uint32), ("config_hash", c_uint64),
                ("shapes_hash", c_uint64), ("pos", c_int64), ("capacity", c_uint64),
                ("file_bytes", c_uint64)]


class CedRows(ctypes.Structure):
    _fields_ = [("in_first", c_size_t), ("out_first", c_size_t)]


class TraceParams(ctypes.Structure):
    _fields_ = [("mode", c_int), ("n_threads", c_int), ("index_k", c_int),
                ("mla_naive", c_int), ("v4_empty", c_int)]


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


ERR = (c_char_p, c_size_t)
_s = c_int  # dsattn_status
_rows = (P(P(ctypes.c_int32)), P(c_size_t), P(c_size_t))
_bytes = (P(P(ctypes.c_uint8)), P(c_size_t), P(c_size_t))

_proto("dsattn_status_str", c_char_p, c_int)
_proto("dsattn_version", c_char_p)
_proto("dsattn_ctx_default_params", CtxParams)
_proto("dsattn_ctx_create", _s, P(c_void_p), P(CtxParams))
_proto("dsattn_ctx_destroy", None, c_void_p)
_proto("dsattn_ctx_isa_name", c_char_p, c_void_p)
_proto("dsattn_ctx_mode", c_int, c_void_p)
_proto("dsattn_ctx_threads", c_int, c_void_p)
_proto("dsattn_ctx_scratch_bytes", c_size_t, c_void_p)
_proto("dsattn_ctx_amx", c_int, c_void_p)
_proto("dsattn_ctx_set_amx", c_int, c_void_p, c_int)
_proto("dsattn_ctx_counters_reset", None, c_void_p)
_proto("dsattn_ctx_counters", Counters, c_void_p)
_proto("dsattn_ctx_set_profiling", None, c_void_p, c_int)
_proto("dsattn_ctx_profile", Profile, c_void_p)
_proto("dsattn_phase_name", c_char_p, c_int)
_proto("dsattn_trace_default_params", TraceParams)
_proto("dsattn_trace_write", _s, c_char_p, c_char_p, P(TraceParams), *ERR)
_proto("dsattn_session_info_read", _s, c_char_p, P(SessionInfo), *ERR)
_proto("dsattn_session_gen_name", c_char_p, c_int)

# Per generation: the calls every one has (prefix dsattn_<g>_).
for g in ("mha", "mla", "v4", "v41"):
    _proto(f"dsattn_{g}_destroy", None, c_void_p)
    _proto(f"dsattn_{g}_n_layers", c_int, c_void_p)
    _proto(f"dsattn_{g}_dim", c_int, c_void_p)
    _proto(f"dsattn_{g}_weight_bytes", c_size_t, c_void_p)
    _proto(f"dsattn_{g}_seq_destroy", None, c_void_p)
    _proto(f"dsattn_{g}_seq_pos", c_int64, c_void_p)
    if g != "mla":
        _proto(f"dsattn_{g}_seq_scratch_at", c_size_t, c_void_p, c_size_t)
    _proto(f"dsattn_{g}_attn_forward", _s, c_void_p, c_void_p, c_int, c_float_p, c_size_t, c_float_p)
    _proto(f"dsattn_{g}_seq_advance", _s, c_void_p, c_size_t)
    _proto(f"dsattn_{g}_seq_kv_bill", _s, c_void_p, P(KvBill))
    _proto(f"dsattn_{g}_seq_fill_synthetic", _s, c_void_p, c_int64, c_uint64)
    # sessions: save / load / clone (include/dsattn.h, "Sessions")
    _proto(f"dsattn_{g}_seq_save", _s, c_void_p, c_char_p, *ERR)
    _proto(f"dsattn_{g}_seq_load", _s, P(c_void_p), c_void_p, c_char_p, c_size_t, *ERR)
    _proto(f"dsattn_{g}_seq_load_buffer", _s, P(c_void_p), c_void_p, c_void_p, c_size_t,
           c_size_t, *ERR)
    _proto(f"dsattn_{g}_seq_clone", _s, P(c_void_p), c_void_p)
    _proto(f"dsattn_{g}_load", _s, P(c_void_p), c_char_p, c_char_p, *ERR)
    # batched decode: one token of each of n sequences (the failed index last)
    _proto(f"dsattn_{g}_attn_forward_batch", _s, c_void_p, P(c_void_p), c_size_t, c_int,
           c_float_p, c_float_p, P(c_size_t))
    if g != "mha":
        _proto(f"dsattn_{g}_stack_forward_batch", _s, c_void_p, P(c_void_p), c_size_t,
               c_float_p, c_float_p, c_float_p, P(c_size_t))
        _proto(f"dsattn_{g}_create_random", _s, P(c_void_p), c_char_p, c_uint64, c_int, *ERR)
        _proto(f"dsattn_{g}_stack_forward", _s, c_void_p, c_void_p, c_float_p, c_size_t,
               c_float_p, c_float_p)
        _proto(f"dsattn_{g}_seq_selection", _s, c_void_p, c_int, *_rows)

_proto("dsattn_mha_create_random", _s, P(c_void_p), c_char_p, c_uint64, *ERR)
_proto("dsattn_mha_create_random_layers", _s, P(c_void_p), c_char_p, c_uint64, c_int, c_int, *ERR)
_proto("dsattn_mha_load_config", _s, P(c_void_p), c_char_p, *ERR)
_proto("dsattn_mha_n_heads", c_int, c_void_p)
_proto("dsattn_mha_n_kv_heads", c_int, c_void_p)
_proto("dsattn_mha_head_dim", c_int, c_void_p)
_proto("dsattn_mha_has_weights", c_int, c_void_p, c_int)
_proto("dsattn_mha_seq_create", _s, P(c_void_p), c_void_p, c_size_t)
_proto("dsattn_mha_seq_create_layers", _s, P(c_void_p), c_void_p, c_size_t, c_int, c_int)
_proto("dsattn_mha_seq_kv", _s, c_void_p, c_int, c_size_t, c_float_p, c_float_p)

_proto("dsattn_mla_create_config_only", _s, P(c_void_p), c_char_p, *ERR)
_proto("dsattn_mla_is_dsa", c_int, c_void_p)
_proto("dsattn_mla_has_weights", c_int, c_void_p)
_proto("dsattn_mla_softmax_scale", c_float, c_void_p)
_proto("dsattn_mla_seq_create", _s, P(c_void_p), c_void_p, c_size_t, c_int)
_proto("dsattn_mla_load_layers", _s, P(c_void_p), c_char_p, c_char_p, c_int, c_int, *ERR)
_proto("dsattn_mla_seq_create_layers", _s, P(c_void_p), c_void_p, c_size_t, c_int, c_int,
       c_int)
_proto("dsattn_mla_seq_cache_format", c_int, c_void_p)
_proto("dsattn_mla_seq_latent", _s, c_void_p, c_int, c_size_t, c_float_p, c_float_p)
_proto("dsattn_mla_latent_dims", _s, c_void_p, ctypes.POINTER(ctypes.c_int),
       ctypes.POINTER(ctypes.c_int))
_proto("dsattn_mla_seq_index_key", _s, c_void_p, c_int, c_size_t, P(ctypes.c_uint8), c_float_p)

_proto("dsattn_mla_seq_scratch_at", c_size_t, c_void_p, c_size_t, c_int)
_proto("dsattn_v4_index_shape", _s, c_void_p, P(c_int), P(c_int), P(c_int))
_proto("dsattn_v4_load_config", _s, P(c_void_p), c_char_p, *ERR)
_proto("dsattn_v4_layer_kind", c_int, c_void_p, c_int)
_proto("dsattn_v4_layer_ratio", c_int, c_void_p, c_int)
_proto("dsattn_v4_seq_create", _s, P(c_void_p), c_void_p, c_size_t, c_int)
_proto("dsattn_v4_seq_create_layers", _s, P(c_void_p), c_void_p, c_size_t, c_int, c_int,
       c_int)
_proto("dsattn_v4_seq_cache", _s, c_void_p, c_int, c_int, *_bytes)

_proto("dsattn_v41_load_config", _s, P(c_void_p), c_char_p, *ERR)
_proto("dsattn_v41_layer_mode", c_int, c_void_p, c_int)
_proto("dsattn_v41_layer_ratio", c_int, c_void_p, c_int)
_proto("dsattn_v41_layer_kv_source", c_int, c_void_p, c_int)
_proto("dsattn_v41_layer_topk_source", c_int, c_void_p, c_int)
_proto("dsattn_v41_seq_create", _s, P(c_void_p), c_void_p, c_size_t, c_int)
_proto("dsattn_v41_seq_source_read", c_int, c_void_p, c_int)
_proto("dsattn_v41_seq_index_read", c_int, c_void_p, c_int)
_proto("dsattn_v41_seq_topk_read", c_int, c_void_p, c_int)
_proto("dsattn_v41_seq_cache", _s, c_void_p, c_int, c_int, *_bytes)
# CED prefill (include/dsattn.h, "CED prefill")
_proto("dsattn_v41_ced_plan", _s, c_void_p, c_size_t, c_int, P(CedRows))
_proto("dsattn_v41_ced_work", _s, c_void_p, c_size_t, c_int, P(c_uint64), P(c_uint64))
_proto("dsattn_v41_attn_forward_rows", _s, c_void_p, c_void_p, c_int, c_float_p, c_size_t,
       c_size_t, c_size_t, c_float_p)
_proto("dsattn_v41_stack_prefill", _s, c_void_p, c_void_p, c_float_p, c_size_t, c_int,
       c_float_p)


def status_name(st):
    return lib.dsattn_status_str(st).decode()


def check(st, what, err=None):
    """Raise DsattnError when st != DSATTN_OK; the message is the library's
    detail text (err buffer) when it wrote one, else the status' name."""
    if st == 0:
        return
    name = status_name(st)
    detail = err.value.decode(errors="replace") if err is not None and err.value else ""
    raise DsattnError(f"{what}: {detail or name}" + (f" ({name})" if detail else ""), st, name)


def errbuf():
    return ctypes.create_string_buffer(1024)


def has(name):
    return hasattr(lib, name)
