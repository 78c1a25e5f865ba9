"""_core.py - the Python objects over dsattn's C API (include/dsattn.h):
Context, Model (one class for every generation), Sequence, trace and bill.

Ownership follows the C API: whoever creates an object destroys it.  Each
Python object owns one C object and destroys it in close() (also at garbage
collection and on leaving a `with` block); a Sequence keeps its Model and a
cache view keeps its Sequence alive.  Arrays go in as float32 [n, dim]
(converted when needed) and come out as new float32 arrays, except the
packed caches, which are read-only views of the library's own bytes.
"""
import ctypes
import json
import os
import shutil
import subprocess
import tempfile
import threading
import weakref

import numpy as np

from . import _lib
from . import _safetensors
from ._lib import DsattnError, check, errbuf, lib

_MODES = {"fast": 0, "reference": 1}
_ISAS = {None: 0, "auto": 0, "ref": 1, "avx2": 2, "avx512": 3, "neon": 4}


def version():
    """The library's version string."""
    return lib.dsattn_version().decode()


def _b(path):
    if path is None:
        return None
    b = os.fsencode(path)
    if b"\0" in b:                      # C would stop at it: another file
        raise ValueError(f"path {path!r} holds a NUL byte")
    return b


_INT_RANGES = {"int": (-2**31, 2**31 - 1), "size_t": (0, 2**64 - 1),
               "int64": (-2**63, 2**63 - 1)}


def _int(v, what, kind="int", lo=None):
    """v as a Python int within the C type's range (and >= lo): ctypes would
    wrap it silently (2**32 + 1 -> 1, -1 -> SIZE_MAX)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be an int, not {type(v).__name__}")
    v = int(v)
    a, b = _INT_RANGES[kind]
    if lo is not None:
        a = max(a, lo)
    if not a <= v <= b:
        raise ValueError(f"{what} = {v} is outside [{a}, {b}]")
    return v


def _f32p(a):
    return a.ctypes.data_as(_lib.c_float_p)


# ==== Context ===============================================================

class Context:
    """Threads, the kernel table and the arithmetic mode.

    mode "fast": SIMD kernels, fp32 accumulation, OpenMP threads;
    "reference": the bit-reproducible contract of the golden cases.
    threads None: OpenMP's default.  isa None/"auto": the best the CPU has
    ($DSATTN_ISA overrides), or "ref" / "avx2" / "avx512" (x86-64) / "neon"
    (aarch64); one the build or CPU cannot run raises DsattnError."""

    def __init__(self, mode="fast", threads=None, isa=None):
        if mode not in _MODES:
            raise ValueError(f"mode must be 'fast' or 'reference', not {mode!r}")
        if isa not in _ISAS:
            raise ValueError("isa must be None, 'auto', 'ref', 'avx2', 'avx512' or 'neon', "
                             f"not {isa!r}")
        if threads is not None:
            threads = _int(threads, "threads", lo=1)
        p = lib.dsattn_ctx_default_params()
        p.mode, p.isa, p.n_threads = _MODES[mode], _ISAS[isa], threads or 0
        h = ctypes.c_void_p()
        what = "dsattn.Context" if isa in (None, "auto") else \
            f"dsattn.Context(isa={isa!r}, not a table this build and CPU run)"
        check(lib.dsattn_ctx_create(ctypes.byref(h), ctypes.byref(p)), what)
        self._h = h

    @property
    def handle(self):
        if not self._h:
            raise DsattnError("dsattn.Context: used after close()")
        return self._h

    def close(self):
        if getattr(self, "_h", None):
            lib.dsattn_ctx_destroy(self._h)
            self._h = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def mode(self):
        return "reference" if lib.dsattn_ctx_mode(self.handle) == 1 else "fast"

    @property
    def isa(self):
        return lib.dsattn_ctx_isa_name(self.handle).decode()

    @property
    def threads(self):
        return lib.dsattn_ctx_threads(self.handle)

    @property
    def scratch_bytes(self):
        """Bytes of grow-only scratch the context holds (prefill Linear,
        batched steps, prefill chunks longer than a decode step)."""
        return lib.dsattn_ctx_scratch_bytes(self.handle)

    @property
    def amx(self):
        return bool(lib.dsattn_ctx_amx(self.handle))

    @amx.setter
    def amx(self, on):
        lib.dsattn_ctx_set_amx(self.handle, 1 if on else 0)

    def counters(self):
        """FLOPs and bytes read counted by the kernels since the last reset."""
        c = lib.dsattn_ctx_counters(self.handle)
        return {"flops": int(c.flops), "bytes_read": int(c.bytes_read)}

    def reset_counters(self):
        lib.dsattn_ctx_counters_reset(self.handle)

    def set_profiling(self, on=True):
        lib.dsattn_ctx_set_profiling(self.handle, 1 if on else 0)

    def profile(self):
        """{phase: {seconds, proj_seconds, bytes_read, flops, proj_flops}} (set_profiling first)."""
        p = lib.dsattn_ctx_profile(self.handle)
        return {lib.dsattn_phase_name(i).decode(): {
            "seconds": p.seconds[i], "proj_seconds": p.proj_seconds[i],
            "bytes_read": int(p.bytes_read[i]), "flops": int(p.flops[i]),
            "proj_flops": int(p.proj_flops[i])}
            for i in range(_lib.N_PHASES)}

    def __repr__(self):
        if not self._h:
            return "<dsattn.Context closed>"
        return f"<dsattn.Context mode={self.mode} isa={self.isa} threads={self.threads}>"


def _model(m):
    if not isinstance(m, Model):
        raise TypeError(f"model must be a dsattn.Model, not {type(m).__name__}")


def _layers(layers):
    return _int(layers[0], "layers[0]"), _int(layers[1], "layers[1]")


# The default fast context, one per thread: a context's scratch grows (is
# reallocated) under a call, and ctypes lets threads call at the same time.
_default = threading.local()


def _ctx(ctx):
    if ctx is not None:
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx must be a dsattn.Context, not {type(ctx).__name__}")
        return ctx.handle
    c = getattr(_default, "ctx", None)
    if c is None:
        c = _default.ctx = Context("fast")
    return c.handle


# ==== Models ================================================================

_V41_MODES = ["swa", "full", "reindex", "reuse", "mtp"]
_V4_KINDS = ["swa", "csa", "hca", "mtp"]


_MODEL_TYPES = {"llama": "mha", "deepseek_v3": "mla", "deepseek_v32": "mla",
                "deepseek_v4": "v4", "deepseek_v41": "v41", "deepseek_v41_text": "v41"}


def generation_of(config):
    """'mha', 'mla', 'v4' or 'v41' for a config.json path, by the library's
    own rules (its config reader): the model_type (top level, else
    text_config's); without one, the keys only one generation has - V4.1's
    kv_source_layers (HF: kv_source_layer_ids), V4's compress_ratios, MLA's
    kv_lora_rank."""
    with open(config) as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise DsattnError(f"{config}: not a JSON object", -4, "malformed input")
    obj = cfg
    if "text_config" in cfg:
        if not isinstance(cfg["text_config"], dict):
            raise DsattnError(f"{config}: key 'text_config' is not an object", -4,
                              "malformed input")
        obj = cfg["text_config"]
    mt = cfg.get("model_type", obj.get("model_type"))
    if mt is not None:
        if not isinstance(mt, str):
            raise DsattnError(f"{config}: key 'model_type' is not a string", -4,
                              "malformed input")
        if mt not in _MODEL_TYPES:
            raise DsattnError(f"{config}: unknown model_type {mt!r} (known: llama, deepseek_v3, "
                              f"deepseek_v32, deepseek_v4, deepseek_v41)", -3, "unsupported")
        return _MODEL_TYPES[mt]
    hf = "hidden_size" in obj or "num_hidden_layers" in obj
    if ("kv_source_layer_ids" if hf else "kv_source_layers") in obj:
        return "v41"
    if "compress_ratios" in obj:
        return "v4"
    if "kv_lora_rank" in obj:
        return "mla"
    raise DsattnError(f"{config}: no model_type and no key that identifies a DeepSeek "
                      f"attention generation", -3, "unsupported")


def _config_beside(path):
    d = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    c = os.path.join(d, "config.json")
    if not os.path.exists(c):
        raise DsattnError(f"{path}: no config.json beside the weights and none given", -7,
                          "not found")
    return c


class Model:
    """The attention stack of one model: config, layer plan and weights
    (or none: a config-only model sizes caches and bills).  Make one with
    dsattn.load, dsattn.random or dsattn.from_config.

    generation: 'mha' (MHA / GQA, DeepSeek-LLM), 'mla' (V3 MLA, V3.2 MLA +
    DSA), 'v4' (CSA + HCA), 'v41' (CSA2)."""

    def __init__(self, generation, handle, config):
        self.generation = generation
        self.config = config
        self._h = handle
        self._pre = f"dsattn_{generation}_"

    def _f(self, name):
        return getattr(lib, self._pre + name)

    @property
    def handle(self):
        if not self._h:
            raise DsattnError("dsattn.Model: used after close()")
        return self._h

    def close(self):
        if getattr(self, "_h", None):
            self._f("destroy")(self._h)
            self._h = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def n_layers(self):
        return self._f("n_layers")(self.handle)

    @property
    def dim(self):
        return self._f("dim")(self.handle)

    @property
    def weight_bytes(self):
        return int(self._f("weight_bytes")(self.handle))

    @property
    def has_weights(self):
        if self.generation == "mha":
            return any(lib.dsattn_mha_has_weights(self.handle, l) for l in range(self.n_layers))
        if self.generation == "mla":
            return bool(lib.dsattn_mla_has_weights(self.handle))
        return self.weight_bytes > 0

    @property
    def plan(self):
        """One dict per layer: 'layer', 'mode' and, where the generation has
        them, 'ratio' (compress ratio), 'kv_source' / 'topk_source' (V4.1:
        the layer whose compressed cache / top-k rows it reads), weights."""
        h, g = self.handle, self.generation
        rows = []
        if g == "mha":
            gqa = lib.dsattn_mha_n_kv_heads(h) < lib.dsattn_mha_n_heads(h)
            for l in range(self.n_layers):
                rows.append({"layer": l, "mode": "gqa" if gqa else "mha",
                             "n_heads": lib.dsattn_mha_n_heads(h),
                             "n_kv_heads": lib.dsattn_mha_n_kv_heads(h),
                             "head_dim": lib.dsattn_mha_head_dim(h),
                             "has_weights": bool(lib.dsattn_mha_has_weights(h, l))})
        elif g == "mla":
            mode = "mla+dsa" if lib.dsattn_mla_is_dsa(h) else "mla"
            rows = [{"layer": l, "mode": mode} for l in range(self.n_layers)]
        elif g == "v4":
            l = 0
            while lib.dsattn_v4_layer_ratio(h, l) >= 0:   # n_layers + the MTP entries
                rows.append({"layer": l, "mode": _V4_KINDS[lib.dsattn_v4_layer_kind(h, l)],
                             "ratio": lib.dsattn_v4_layer_ratio(h, l)})
                l += 1
        else:
            for l in range(self.n_layers):
                kv, tk = lib.dsattn_v41_layer_kv_source(h, l), lib.dsattn_v41_layer_topk_source(h, l)
                rows.append({"layer": l, "mode": _V41_MODES[lib.dsattn_v41_layer_mode(h, l)],
                             "ratio": lib.dsattn_v41_layer_ratio(h, l),
                             "kv_source": None if kv < 0 else kv,
                             "topk_source": None if tk < 0 else tk})
        return rows

    def _v41(self, what):
        if self.generation != "v41":
            raise DsattnError(f"dsattn.Model.{what}: V4.1 (CSA2) only, not {self.generation}",
                              -3, "unsupported")

    def ced_plan(self, n, mode="exact"):
        """V4.1 CED prefill: the rows each layer needs for a prompt of n
        tokens at position 0, as int64 [n_layers, 2]: row l = (in_first,
        out_first), layer l's input for positions [in_first, n) and its
        attention output for [out_first, n) (out_first of l is in_first of
        l + 1).  mode 'exact' (the decode after it equals a full prefill's
        bit for bit in reference mode), 'bounded' (the last window only past
        the last KV source: an approximation) or 'off' (every row)."""
        self._v41("ced_plan")
        rows = (_lib.CedRows * self.n_layers)()
        check(lib.dsattn_v41_ced_plan(self.handle, _int(n, "n", "size_t"),
                                      _opt(_CED, mode, "mode"), rows),
              f"dsattn.Model.ced_plan({n}, {mode!r})")
        return np.array([(r.in_first, r.out_first) for r in rows], dtype=np.int64)

    def ced_work(self, n, mode="exact"):
        """V4.1: (input rows, output rows) a prefill of n tokens runs in that
        CED mode, summed over the layers."""
        self._v41("ced_work")
        i, o = ctypes.c_uint64(), ctypes.c_uint64()
        check(lib.dsattn_v41_ced_work(self.handle, _int(n, "n", "size_t"), _opt(_CED, mode, "mode"),
                                      ctypes.byref(i), ctypes.byref(o)),
              f"dsattn.Model.ced_work({n}, {mode!r})")
        return int(i.value), int(o.value)

    def scratch_at(self, max_seq_len, cache="latent_bf16"):
        """The decode scratch bytes a sequence of max_seq_len tokens sizes at
        creation (the kv_bill's scratch_bytes; the bill's per-sequence
        column at a context no cache could be made for), without making one.
        cache: the MLA cache format.  Raises on a size that overflows."""
        cap = _int(max_seq_len, "max_seq_len", "size_t")
        if self.generation == "mla":
            n = lib.dsattn_mla_seq_scratch_at(self.handle, cap, _opt(_MLA_CACHES, cache, "cache"))
        else:
            n = self._f("seq_scratch_at")(self.handle, cap)
        if n == ctypes.c_size_t(-1).value:
            raise DsattnError(f"dsattn.Model.scratch_at({max_seq_len}): the size overflows", -5,
                              lib.dsattn_status_str(-5).decode())
        return int(n)

    @property
    def index_shape(self):
        """V4: the CSA indexer's (n_heads, head_dim, topk)."""
        if self.generation != "v4":
            raise DsattnError("dsattn.Model.index_shape: V4 only (V4.1: config.json's index_*)",
                              -3, "unsupported")
        h, d, k = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        check(lib.dsattn_v4_index_shape(self.handle, ctypes.byref(h), ctypes.byref(d),
                                        ctypes.byref(k)), "dsattn.Model.index_shape")
        return h.value, d.value, k.value

    def sequence(self, max_seq_len, **opts):
        """A new Sequence over this model holding max_seq_len tokens.
        Options by generation: v41 index_k='owner'|'reference'; mla
        cache='latent_bf16'|'latent_fp8'|'naive'; v4 empty='nan'|'zero';
        mha, mla and v4 layers=(first, n): the caches of those layers only
        (a pipeline stage's share; forward takes only those layers, stack
        none)."""
        return Sequence(self, max_seq_len, **opts)

    def __repr__(self):
        if not self._h:
            return f"<dsattn.Model {self.generation} closed>"
        return (f"<dsattn.Model {self.generation} {self.n_layers} layers dim {self.dim} "
                f"weights {self.weight_bytes} B>")


def load(weights, config=None, layers=None):
    """A model from a checkpoint: weights is a .safetensors file, a
    model.safetensors.index.json or a folder; config the config.json
    (default: the one beside the weights).  config.json's model_type picks
    the generation (llama: MHA / GQA, DeepSeek-LLM 7B / 67B, HF names).
    layers=(first, n), MLA only: bind only those layers' weights (V3's FP8
    projections are converted to bf16 at load, some 374 MB a layer)."""
    config = config or _config_beside(weights)
    g = generation_of(config)
    h, err = ctypes.c_void_p(), errbuf()
    if layers is not None and g != "mla":
        raise ValueError("layers= is for MLA (V3 / V3.2) checkpoints")
    if layers is not None:
        st = lib.dsattn_mla_load_layers(ctypes.byref(h), _b(config), _b(weights),
                                        *_layers(layers), err, len(err))
    else:
        st = getattr(lib, f"dsattn_{g}_load")(ctypes.byref(h), _b(config), _b(weights), err,
                                              len(err))
    check(st, f"dsattn.load({weights!s})", err)
    return Model(g, h, config)


def random(config, seed=0, fp8=False, layers=None):
    """A model with random weights from a seed at the config's dims.  fp8:
    FP8 weights as the released checkpoints store them (not MHA / GQA,
    which are bf16).  layers=(first, n): MHA / GQA weights for those
    layers only."""
    g = generation_of(config)
    h, err = ctypes.c_void_p(), errbuf()
    if g == "mha":
        if fp8:
            raise ValueError("MHA / GQA random weights are bf16 only")
        if layers is None:
            st = lib.dsattn_mha_create_random(ctypes.byref(h), _b(config), seed, err, len(err))
        else:
            st = lib.dsattn_mha_create_random_layers(ctypes.byref(h), _b(config), seed,
                                                     *_layers(layers), err, len(err))
    else:
        if layers is not None:
            raise ValueError("layers= is for MHA / GQA models")
        st = getattr(lib, f"dsattn_{g}_create_random")(ctypes.byref(h), _b(config), seed,
                                                       1 if fp8 else 0, err, len(err))
    check(st, f"dsattn.random({config!s})", err)
    return Model(g, h, config)


def from_config(config):
    """A config-only model (no weights): sequences, plans and KV bills
    work; forward raises."""
    g = generation_of(config)
    h, err = ctypes.c_void_p(), errbuf()
    fn = {"mha": "dsattn_mha_load_config", "mla": "dsattn_mla_create_config_only",
          "v4": "dsattn_v4_load_config", "v41": "dsattn_v41_load_config"}[g]
    check(getattr(lib, fn)(ctypes.byref(h), _b(config), err, len(err)),
          f"dsattn.from_config({config!s})", err)
    return Model(g, h, config)


# ==== Sequences =============================================================

_MLA_CACHES = {"naive": 0, "latent_bf16": 1, "latent_fp8": 2}
_INDEX_K = {"owner": 0, "reference": 1}
_V4_EMPTY = {"nan": 0, "zero": 1}
_CED = {"off": 0, "exact": 1, "bounded": 2}


def _opt(table, value, what):
    if value not in table:
        raise ValueError(f"{what} must be one of {sorted(table)}, not {value!r}")
    return table[value]


class Sequence:
    """One sequence over a Model: its packed caches and runtime state.

    Protocol (the reference's): for each chunk, forward() every layer in
    order with that layer's normalised input, then advance(n); or stack()
    the golden-case stand-in block over all layers (it advances itself).
    The first chunk may be a prefill of n >= 1 tokens at position 0; later
    chunks are one token (MHA / GQA take any chunk at any position)."""

    def __init__(self, model, max_seq_len, index_k="owner", cache="latent_bf16", empty="nan",
                 layers=None):
        _model(model)
        g = model.generation
        max_seq_len = _int(max_seq_len, "max_seq_len", "size_t", lo=1)
        h = ctypes.c_void_p()
        mh = model.handle
        if layers is not None:
            if g == "v41":
                raise ValueError("layers: a V4.1 sequence holds every layer (its layers share "
                                 "caches and indices across layers)")
            if len(layers) != 2:
                raise ValueError(f"layers must be (first_layer, n_layers), not {layers!r}")
        if g == "v41":
            st = lib.dsattn_v41_seq_create(ctypes.byref(h), mh, max_seq_len,
                                           _opt(_INDEX_K, index_k, "index_k"))
        elif g == "mla" and layers is None:
            st = lib.dsattn_mla_seq_create(ctypes.byref(h), mh, max_seq_len,
                                           _opt(_MLA_CACHES, cache, "cache"))
        elif g == "mla":
            st = lib.dsattn_mla_seq_create_layers(ctypes.byref(h), mh, max_seq_len,
                                                  _opt(_MLA_CACHES, cache, "cache"),
                                                  *_layers(layers))
        elif g == "v4" and layers is None:
            st = lib.dsattn_v4_seq_create(ctypes.byref(h), mh, max_seq_len,
                                          _opt(_V4_EMPTY, empty, "empty"))
        elif g == "v4":
            st = lib.dsattn_v4_seq_create_layers(ctypes.byref(h), mh, max_seq_len,
                                                 _opt(_V4_EMPTY, empty, "empty"),
                                                 *_layers(layers))
        elif layers is None:
            st = lib.dsattn_mha_seq_create(ctypes.byref(h), mh, max_seq_len)
        else:
            st = lib.dsattn_mha_seq_create_layers(ctypes.byref(h), mh, max_seq_len,
                                                  *_layers(layers))
        check(st, f"dsattn.Sequence({g}, max_seq_len={max_seq_len})")
        self.model = model            # the C sequence borrows the model
        self.generation = g
        self.max_seq_len = int(max_seq_len)
        self._h = h
        self._pre = f"dsattn_{g}_"
        self._views = []              # weak references to the live cache buffers

    def _f(self, name):
        return getattr(lib, self._pre + name)

    @property
    def handle(self):
        if not self._h:
            raise DsattnError("dsattn.Sequence: used after close()")
        if not self.model._h:            # the C sequence reads its model
            raise DsattnError("dsattn.Sequence: its Model was closed")
        return self._h

    def close(self):
        """Free the sequence now.  Raises while a cache view of it is alive
        (the view would point at freed memory); garbage collection waits
        for the views instead."""
        if getattr(self, "_h", None):
            if any(r() is not None for r in self._views):
                raise DsattnError("dsattn.Sequence.close: cache views of this sequence are "
                                  "still alive (delete them first)")
            self._f("seq_destroy")(self._h)
            self._h = None

    def __del__(self):
        if getattr(self, "_h", None):
            self._f("seq_destroy")(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def position(self):
        """Tokens consumed so far (advance() moves it)."""
        return int(self._f("seq_pos")(self.handle))

    def _input(self, x):
        a = np.ascontiguousarray(x, dtype=np.float32)
        if a.ndim == 1:
            a = a.reshape(1, -1)
        dim = self.model.dim
        if a.ndim != 2 or a.shape[1] != dim or a.shape[0] < 1:
            raise ValueError(f"x must be float32 [n_tokens, {dim}], got shape {np.shape(x)}")
        return a

    def forward(self, layer, x, ctx=None):
        """One layer's attention on x [n, dim] (its normalised input); returns
        out [n, dim].  Does not advance."""
        a = self._input(x)
        out = np.empty_like(a)
        st = self._f("attn_forward")(_ctx(ctx), self.handle, _int(layer, "layer"), _f32p(a),
                                     a.shape[0],
                                     _f32p(out))
        check(st, f"dsattn.Sequence.forward(layer {layer}, {a.shape[0]} tokens at position "
                  f"{self.position})")
        return out

    def advance(self, n=1):
        check(self._f("seq_advance")(self.handle, _int(n, "n", "size_t")),
              f"dsattn.Sequence.advance({n})")

    def stack(self, h, ctx=None, capture=False):
        """The golden-case stand-in stack over every layer,
        h += attn_l(bf16(RMSNorm_l(h))), on the residual h [n, dim]; advances
        by n.  Returns the new h, or with capture=True (h, attn_in, attn_out)
        with attn_in / attn_out [n_layers, n, dim].  Not for MHA / GQA."""
        if self.generation == "mha":
            raise DsattnError("dsattn.Sequence.stack: MHA / GQA have no stand-in stack "
                              "(forward each layer)", -3, "unsupported")
        a = self._input(h).copy()
        n, nl = a.shape[0], self.model.n_layers
        ain = aout = None
        if capture:
            ain = np.empty((nl, n, a.shape[1]), np.float32)
            aout = np.empty_like(ain)
        st = self._f("stack_forward")(_ctx(ctx), self.handle, _f32p(a), n,
                                      _f32p(ain) if capture else None,
                                      _f32p(aout) if capture else None)
        check(st, f"dsattn.Sequence.stack({n} tokens at position {self.position})")
        return (a, ain, aout) if capture else a

    def forward_rows(self, layer, x, first=0, out_first=None, ctx=None):
        """V4.1 CED prefill, one layer over a suffix of a prompt chunk at
        position 0: x [n, dim] the layer's input for positions [first,
        first + n) (the chunk ends at first + n); returns its attention
        output for positions [out_first, first + n) (default out_first =
        first).  Call it for every layer in order with the rows
        Model.ced_plan gives, (first, out_first) = plan[layer], then
        advance(chunk end).  A KV-source layer takes first = 0.  The output
        rows equal forward()'s over the whole chunk bit for bit in reference
        mode."""
        if self.generation != "v41":
            raise DsattnError("dsattn.Sequence.forward_rows: V4.1 (CSA2) only", -3,
                              "unsupported")
        a = self._input(x)
        first = int(first)
        out_first = first if out_first is None else int(out_first)
        n = a.shape[0]
        if first < 0 or not first <= out_first < first + n:
            raise ValueError(f"forward_rows: need 0 <= first <= out_first < first + n, got "
                             f"first {first}, out_first {out_first}, n {n}")
        out = np.empty((first + n - out_first, a.shape[1]), np.float32)
        st = lib.dsattn_v41_attn_forward_rows(_ctx(ctx), self.handle, _int(layer, "layer"),
                                              _f32p(a), n,
                                              first, out_first - first, _f32p(out))
        check(st, f"dsattn.Sequence.forward_rows(layer {layer}, rows [{first}, {first + n}), "
                  f"out from {out_first})")
        return out

    def prefill(self, h, mode="exact", ctx=None, capture=False):
        """V4.1: the stand-in stack of stack() over a prompt h [n, dim] at
        position 0 in a CED mode ('off' is stack() itself); advances by n.
        In 'exact' and 'bounded' only the returned h's last row is the
        stack's output (the rows before hold partial sums).  capture=True
        returns (h, attn_out), attn_out [n_layers, n, dim] each layer's
        outputs, 0 on the rows the mode skips."""
        if self.generation != "v41":
            raise DsattnError("dsattn.Sequence.prefill: V4.1 (CSA2) only", -3, "unsupported")
        a = self._input(h).copy()
        n = a.shape[0]
        aout = np.empty((self.model.n_layers, n, a.shape[1]), np.float32) if capture else None
        st = lib.dsattn_v41_stack_prefill(_ctx(ctx), self.handle, _f32p(a), n,
                                          _opt(_CED, mode, "mode"),
                                          _f32p(aout) if capture else None)
        check(st, f"dsattn.Sequence.prefill({n} tokens, {mode!r})")
        return (a, aout) if capture else a

    def selection(self, layer):
        """The last chunk's top-k selection of a layer as int32 [rows, width]
        (-1 padded; meaning per generation in include/dsattn*.h), or None
        when the layer does not select."""
        if self.generation == "mha":
            return None
        rows, nr, w = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t(), ctypes.c_size_t()
        st = self._f("seq_selection")(self.handle, _int(layer, "layer"), ctypes.byref(rows),
                                      ctypes.byref(nr), ctypes.byref(w))
        if st == -7 or (st == 0 and not rows):      # DSATTN_ERR_NOT_FOUND: no selection
            return None
        check(st, f"dsattn.Sequence.selection({layer})")
        n = nr.value * w.value
        return np.ctypeslib.as_array(rows, shape=(n,)).reshape(nr.value, w.value).copy() \
            if n else np.empty((nr.value, w.value), np.int32)

    def cache(self, layer, which=0):
        """The packed cache rows of a layer as a read-only uint8 NumPy view
        [rows, row_bytes] of the library's own memory (no copy).  V4: which 0
        = the KV buffer (window ring, then the compressed entries written),
        1 = the indexer's keys.  V4.1: 0 = window ring, 1 = compressed KV,
        2 = index keys.  The view keeps the sequence alive; its bytes change
        as the sequence runs, its row count is the one at the call."""
        if self.generation not in ("v4", "v41"):
            raise DsattnError(f"dsattn.Sequence.cache: the {self.generation} API offers no "
                              "packed rows (see latent() / kv())", -3, "unsupported")
        rows, nr, rb = ctypes.POINTER(ctypes.c_uint8)(), ctypes.c_size_t(), ctypes.c_size_t()
        st = self._f("seq_cache")(self.handle, _int(layer, "layer"), _int(which, "which"),
                                  ctypes.byref(rows),
                                  ctypes.byref(nr), ctypes.byref(rb))
        check(st, f"dsattn.Sequence.cache(layer {layer}, which {which})")
        n = nr.value * rb.value
        if n == 0 or not rows:
            return np.empty((0, rb.value), np.uint8)
        buf = (ctypes.c_uint8 * n).from_address(ctypes.addressof(rows.contents))
        # every view derived from this one keeps buf alive, and buf keeps
        # the sequence alive: the memory is the sequence's
        buf._dsattn_owner = self
        v = np.frombuffer(buf, dtype=np.uint8).reshape(nr.value, rb.value)
        v.flags.writeable = False
        self._views = [r for r in self._views if r() is not None] + [weakref.ref(buf)]
        return v

    def sources(self, layer):
        """V4.1: which layers' compressed KV, index keys and top-k rows the
        layer read in the last chunk (None: none)."""
        if self.generation != "v41":
            raise DsattnError("dsattn.Sequence.sources: V4.1 only", -3, "unsupported")
        f = lambda v: None if v < 0 else v
        h, l = self.handle, _int(layer, "layer")
        return {"kv": f(lib.dsattn_v41_seq_source_read(h, l)),
                "index": f(lib.dsattn_v41_seq_index_read(h, l)),
                "topk": f(lib.dsattn_v41_seq_topk_read(h, l))}

    def latent(self, layer, pos):
        """MLA latent caches: (kv [kv_lora_rank], pe [rope dims]) of token pos,
        dequantized to float32 (copies)."""
        if self.generation != "mla":
            raise DsattnError("dsattn.Sequence.latent: MLA only", -3, "unsupported")
        kvn, pen = ctypes.c_int(), ctypes.c_int()     # the model's own widths
        check(lib.dsattn_mla_latent_dims(self.model.handle, ctypes.byref(kvn), ctypes.byref(pen)),
              "dsattn.Sequence.latent")
        kv, pe = np.empty(kvn.value, np.float32), np.empty(pen.value, np.float32)
        l, p = _int(layer, "layer"), _int(pos, "pos", "size_t")
        check(lib.dsattn_mla_seq_latent(self.handle, l, p, _f32p(kv), _f32p(pe)),
              f"dsattn.Sequence.latent(layer {layer}, pos {pos})")
        return kv, pe

    def kv(self, layer, pos):
        """MHA / GQA cache row of token pos: (k, v) [n_kv_heads * head_dim]."""
        if self.generation != "mha":
            raise DsattnError("dsattn.Sequence.kv: MHA / GQA only", -3, "unsupported")
        mh = self.model.handle
        n = lib.dsattn_mha_n_kv_heads(mh) * lib.dsattn_mha_head_dim(mh)
        k, v = np.empty(n, np.float32), np.empty(n, np.float32)
        l, p = _int(layer, "layer"), _int(pos, "pos", "size_t")
        check(lib.dsattn_mha_seq_kv(self.handle, l, p, _f32p(k), _f32p(v)),
              f"dsattn.Sequence.kv(layer {layer}, pos {pos})")
        return k, v

    def kv_bill(self):
        """The KV bill measured from the live allocations (dsattn_kv_bill)."""
        b = _lib.KvBill()
        check(self._f("seq_kv_bill")(self.handle, ctypes.byref(b)), "dsattn.Sequence.kv_bill")
        return {"global_bytes_per_token": b.global_bytes_per_token,
                "global_bytes_allocated": int(b.global_bytes_allocated),
                "window_bytes": int(b.window_bytes), "state_bytes": int(b.state_bytes),
                "scratch_bytes": int(b.scratch_bytes)}

    def fill_synthetic(self, depth, seed=1):
        """Fill the caches as if depth tokens had been consumed (random valid
        entries; benchmarks at long contexts).  Sets the position to depth."""
        check(self._f("seq_fill_synthetic")(self.handle, _int(depth, "depth", "int64"),
                                                 _int(seed, "seed", "size_t")),
              f"dsattn.Sequence.fill_synthetic({depth})")

    # ---- sessions (include/dsattn.h, "Sessions"; format: docs/sessions.md)

    @classmethod
    def _wrap(cls, model, handle, max_seq_len):
        s = cls.__new__(cls)
        s.model, s.generation, s.max_seq_len = model, model.generation, max_seq_len
        s._h, s._pre, s._views = handle, f"dsattn_{model.generation}_", []
        return s

    def save(self, path):
        """Save the sequence to a session file (atomic: temporary file,
        fsync, rename)."""
        err = errbuf()
        check(self._f("seq_save")(self.handle, _b(path), err, len(err)),
              f"dsattn.Sequence.save({path!s})", err)

    @classmethod
    def load(cls, model, path, max_seq_len=0):
        """A sequence over model from a session file (validated whole before
        anything is created); max_seq_len 0 keeps the saved capacity, a larger
        one grows it.  The per-chunk observations (selection, sources) start
        empty."""
        _model(model)
        h, err = ctypes.c_void_p(), errbuf()
        st = getattr(lib, f"dsattn_{model.generation}_seq_load")(
            ctypes.byref(h), model.handle, _b(path), _int(max_seq_len, "max_seq_len", "size_t"),
            err, len(err))
        check(st, f"dsattn.Sequence.load({path!s})", err)
        return cls._wrap(model, h, int(max_seq_len) or None)

    @classmethod
    def load_bytes(cls, model, data, max_seq_len=0):
        """The same from the bytes of a session file."""
        _model(model)
        data = bytes(data)
        h, err = ctypes.c_void_p(), errbuf()
        st = getattr(lib, f"dsattn_{model.generation}_seq_load_buffer")(
            ctypes.byref(h), model.handle, data, len(data), _int(max_seq_len, "max_seq_len",
                                                                 "size_t"), err,
            len(err))
        check(st, "dsattn.Sequence.load_bytes", err)
        return cls._wrap(model, h, int(max_seq_len) or None)

    def clone(self):
        """An independent copy in memory (a prefix two continuations share)."""
        h = ctypes.c_void_p()
        check(self._f("seq_clone")(ctypes.byref(h), self.handle), "dsattn.Sequence.clone")
        return Sequence._wrap(self.model, h, self.max_seq_len)

    def __repr__(self):
        if not self._h:
            return f"<dsattn.Sequence {self.generation} closed>"
        cap = self.max_seq_len if self.max_seq_len is not None else "saved capacity"
        return f"<dsattn.Sequence {self.generation} position {self.position} / {cap}>"


def session_info(path):
    """A session file's header, after the library has validated the whole
    file (every section's length and checksum; not against a model):
    format, lib_version (of the writer), generation ('mha', 'mla', 'v4',
    'v41'), options (the sequence's: V4.1 index_k, V4 empty, MLA cache),
    layers ((first, n) of a sequence holding only those layers, else None),
    position, capacity, config_hash / shapes_hash (of the model it was
    saved with), n_sections, file_bytes.  Raises DsattnError naming the
    section on a damaged file."""
    info, err = _lib.SessionInfo(), errbuf()
    check(lib.dsattn_session_info_read(_b(path), ctypes.byref(info), err, len(err)),
          f"dsattn.session_info({path!s})", err)
    g = lib.dsattn_session_gen_name(info.generation).decode()
    v0, v1 = int(info.variant[0]), int(info.variant[1])
    inv = lambda table, v: {k: i for i, k in table.items()}.get(v, v)  # noqa: E731
    opts, layers = {}, None
    if g == "v41":
        opts["index_k"] = inv(_INDEX_K, v0)
    elif g == "v4":
        opts["empty"] = inv(_V4_EMPTY, v0)
    elif g == "mla":
        opts["cache"] = inv(_MLA_CACHES, v0)
    if g == "mha":
        layers = (v0, v1)
    elif g in ("mla", "v4") and v1:
        layers = (v1 & 0xffff, v1 >> 16)
    return {"format": int(info.format), "lib_version": info.lib_version.decode(),
            "generation": g, "options": opts, "layers": layers, "position": int(info.pos),
            "capacity": int(info.capacity), "config_hash": int(info.config_hash),
            "shapes_hash": int(info.shapes_hash), "n_sections": int(info.n_sections),
            "file_bytes": int(info.file_bytes)}


# ==== Batched decode ========================================================

def _batch_args(seqs, what):
    seqs = list(seqs)
    if not seqs:
        raise ValueError(f"{what}: no sequences")
    for i, q in enumerate(seqs):
        if not isinstance(q, Sequence):
            raise TypeError(f"{what}: seqs[{i}] is {type(q).__name__}, not a dsattn.Sequence")
        if q.generation != seqs[0].generation:
            raise ValueError(f"{what}: seqs[{i}] is a {q.generation} sequence, seqs[0] a "
                             f"{seqs[0].generation} one")
    return seqs, (ctypes.c_void_p * len(seqs))(*[q.handle for q in seqs])


def _batch_check(st, what, failed):
    if st == 0:
        return
    bad = failed.value if failed.value != ctypes.c_size_t(-1).value else None
    name = _lib.status_name(st)
    where = f"sequence {bad}" if bad is not None else "the batch"
    raise DsattnError(f"{what}: {where}: {name}", st, name, bad)


def forward_batch(seqs, layer, x, ctx=None):
    """One token of each sequence through one layer in one call, the layer's
    weights read once for all of them (a serving loop's step): x
    [len(seqs), dim], row i the normalised input of seqs[i]'s next token,
    each sequence at its own position; returns out [len(seqs), dim].  Does
    not advance: call every layer in order, then advance(1) on each.  Row i
    equals seqs[i].forward(layer, x[i:i+1]) bit for bit in reference mode.
    The sequences: distinct, of one model, each with room for one more
    token; a bad batch changes nothing and raises DsattnError with
    e.failed = the index of the first bad sequence."""
    seqs, arr = _batch_args(seqs, "dsattn.forward_batch")
    a = np.ascontiguousarray(x, dtype=np.float32)
    dim = seqs[0].model.dim
    if a.shape != (len(seqs), dim):
        raise ValueError(f"dsattn.forward_batch: x must be float32 [{len(seqs)}, {dim}] (one row "
                         f"a sequence), got shape {np.shape(x)}")
    out = np.empty_like(a)
    failed = ctypes.c_size_t(0)
    g = seqs[0].generation
    st = getattr(lib, f"dsattn_{g}_attn_forward_batch")(_ctx(ctx), arr, len(seqs), _int(layer,
                                                                                        "layer"),
                                                        _f32p(a), _f32p(out),
                                                        ctypes.byref(failed))
    _batch_check(st, f"dsattn.forward_batch(layer {layer}, {len(seqs)} sequences)", failed)
    return out


def stack_batch(seqs, h, ctx=None, capture=False):
    """The golden-case stand-in stack over every layer for one token of each
    sequence, in one call per layer: h [len(seqs), dim] the residual rows
    (row i: seqs[i]'s token); advances every sequence by one.  Returns the
    new h, or with capture=True (h, attn_in, attn_out), those
    [n_layers, len(seqs), dim].  Row i equals seqs[i].stack(h[i:i+1]) bit
    for bit in reference mode.  Not for MHA / GQA (no stand-in stack)."""
    seqs, arr = _batch_args(seqs, "dsattn.stack_batch")
    g = seqs[0].generation
    if g == "mha":
        raise DsattnError("dsattn.stack_batch: MHA / GQA have no stand-in stack (forward_batch "
                          "each layer)", -3, "unsupported")
    dim, nl = seqs[0].model.dim, seqs[0].model.n_layers
    a = np.array(h, dtype=np.float32, order="C", copy=True)
    if a.shape != (len(seqs), dim):
        raise ValueError(f"dsattn.stack_batch: h must be float32 [{len(seqs)}, {dim}] (one row "
                         f"a sequence), got shape {np.shape(h)}")
    ain = aout = None
    if capture:
        ain = np.empty((nl, len(seqs), dim), np.float32)
        aout = np.empty_like(ain)
    failed = ctypes.c_size_t(0)
    st = getattr(lib, f"dsattn_{g}_stack_forward_batch")(_ctx(ctx), arr, len(seqs), _f32p(a),
                                                         _f32p(ain) if capture else None,
                                                         _f32p(aout) if capture else None,
                                                         ctypes.byref(failed))
    _batch_check(st, f"dsattn.stack_batch({len(seqs)} sequences)", failed)
    return (a, ain, aout) if capture else a


# ==== trace =================================================================

def trace(case_dir, mode="reference", index_k="owner", mla="absorb", v4_empty="nan",
          threads=None):
    """Run a golden case folder as `dsattn trace` does (dsattn_trace_write)
    and return {name: numpy array} with exactly the tensors it writes:
    out, layer.{i}.attn_in / attn_out, layer.{i}.topk, cache.{i}.*.  FP8
    and byte tensors come back as uint8, BF16 as raw uint16 words."""
    p = lib.dsattn_trace_default_params()
    p.mode = _opt(_MODES, mode, "mode")
    p.index_k = _opt(_INDEX_K, index_k, "index_k")
    p.mla_naive = _opt({"absorb": 0, "naive": 1}, mla, "mla")
    p.v4_empty = _opt(_V4_EMPTY, v4_empty, "v4_empty")
    p.n_threads = threads or 0
    fd, out = tempfile.mkstemp(prefix="dsattn_trace_", suffix=".safetensors")
    os.close(fd)
    try:
        err = errbuf()
        st = lib.dsattn_trace_write(_b(case_dir), _b(out), ctypes.byref(p), err, len(err))
        check(st, f"dsattn.trace({case_dir!s})", err)
        return _safetensors.read(out)
    finally:
        os.unlink(out)


# ==== bill ==================================================================

def _find_cli():
    env = os.environ.get("DSATTN_CLI")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    cands = [os.path.join(here, "_native", "dsattn")]
    try:
        from . import _install
        cands.append(os.path.normpath(os.path.join(here, _install.BIN, "dsattn")))
    except ImportError:
        pass
    if _lib.lib_dir:
        cands.append(os.path.join(_lib.lib_dir, "dsattn"))
    for c in cands:
        if os.access(c, os.X_OK) and os.path.isfile(c):
            return c
    return shutil.which("dsattn")


def _find_configs():
    env = os.environ.get("DSATTN_CONFIGS")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    cands = [os.path.join(here, "_native", "configs")]
    try:
        from . import _install
        cands.append(os.path.normpath(os.path.join(here, _install.CONFIGS)))
    except ImportError:
        pass
    if _lib.lib_dir:
        cands.append(os.path.join(_lib.lib_dir, "..", "configs"))
    for c in cands:
        if os.path.exists(os.path.join(c, "deepseek-v4.1-flash.json")):
            return os.path.normpath(c)
    return None


def bill(ctx_len=1 << 20, kv_only=False, only=None, threads=None, seed=1):
    """The rows of `dsattn bill` (one dict per generation at its published
    config, the keys of `dsattn bill --format json`: global KV bytes per
    token from the live allocations, window / state bytes, and unless
    kv_only the attention FLOPs and bytes per decoded token at ctx_len,
    counted by the kernels).  Runs the dsattn CLI of this install
    ($DSATTN_CLI overrides); kv_only takes seconds, the full bill minutes.
    only: a list of row keys ("v1-7b", "v3", "v4.1-flash", ...)."""
    cli = _find_cli()
    if not cli:
        raise DsattnError("dsattn.bill: the dsattn CLI was not found (set DSATTN_CLI)", -7,
                          "not found")
    if not isinstance(ctx_len, (int, np.integer)) or ctx_len < 2:
        raise ValueError(f"ctx_len must be an int >= 2, not {ctx_len!r}")
    cmd = [cli, "bill", "--format", "json", "--quiet", "--ctx", str(int(ctx_len)),
           "--seed", str(int(seed))]
    if kv_only:
        cmd.append("--kv-only")
    if only:
        cmd += ["--only", ",".join(only)]
    if threads:
        cmd += ["--threads", str(int(threads))]
    cfg = _find_configs()
    if cfg:
        cmd += ["--configs", cfg]
    r = subprocess.run(cmd, capture_output=True, text=True)
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        raise DsattnError(f"dsattn.bill: {' '.join(cmd)} exited {r.returncode}: "
                          f"{r.stderr.strip() or r.stdout.strip()}", -6, "I/O error") from None
    rows = doc.get("rows", [])
    bad = [f"{x['key']}: {x.get('error', '')}" for x in rows if x.get("status") == "error"]
    if r.returncode != 0 or bad:
        raise DsattnError("dsattn.bill: " + ("; ".join(bad) or r.stderr.strip()), -6, "I/O error")
    return rows
