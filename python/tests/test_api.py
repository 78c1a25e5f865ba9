"""test_api.py - the Python objects over the C API: a layer forward from
Python equals the C CLI's (bit for bit, reference mode, every generation
with a golden case), plans, errors raise with the library's message, cache
views alias the library's memory, the GIL is released during compute, and
create/destroy cycles do not leak."""
import ctypes
import json
import os
import subprocess
import threading

import numpy as np
import pytest

import dsattn
from conftest import GOLDEN, cli_traced, py_traced

V41 = os.path.join(GOLDEN, "v41", "tiny-seed0")
V4 = os.path.join(GOLDEN, "v4", "tiny-seed0")
FORWARD_CASES = ["v3/tiny-seed0", "v32/tiny-seed0", "v4/tiny-seed0", "v41/tiny-seed0",
                 "v41/tiny-seed2-fp8", "v41/alt-seed0"]


def _input(case_dir):
    t = dsattn.read_safetensors(os.path.join(case_dir, "input.safetensors"))
    return t["x"], int(t["prefill_len"].reshape(-1)[0])


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_layer_forward_equals_cli(case, cli):
    """Sequence.forward layer by layer on the CLI trace's attn_in gives the
    CLI's attn_out bit for bit: the prefill and two decode steps."""
    case_dir = os.path.join(GOLDEN, case)
    want = cli_traced(case_dir)
    x, P = _input(case_dir)
    ctx = dsattn.Context(mode="reference")
    m = dsattn.load(os.path.join(case_dir, "weights.safetensors"))
    s = m.sequence(x.shape[0])
    assert m.n_layers >= 3 and m.dim == x.shape[1]
    for t0, n in ((0, P), (P, 1), (P + 1, 1)):
        assert s.position == t0
        for l in range(m.n_layers):
            a_in = want[f"layer.{l}.attn_in"][t0:t0 + n]
            got = s.forward(l, a_in, ctx)
            assert got.dtype == np.float32 and got.shape == a_in.shape
            assert got.tobytes() == want[f"layer.{l}.attn_out"][t0:t0 + n].tobytes(), \
                f"{case} layer {l} tokens {t0}..{t0 + n}"
        s.advance(n)


def test_stack_and_selection_equal_trace():
    x, P = _input(V41)
    tr = py_traced(V41)
    ctx = dsattn.Context(mode="reference")
    m = dsattn.load(V41 + "/weights.safetensors")
    s = m.sequence(64)
    h, ain, aout = s.stack(x[:P], ctx, capture=True)
    assert h.tobytes() == tr["out"][:P].tobytes()
    assert ain.shape == (m.n_layers, P, m.dim)
    assert aout[3].tobytes() == tr["layer.3.attn_out"][:P].tobytes()
    h2 = s.stack(x[P:P + 1], ctx)
    assert h2.tobytes() == tr["out"][P:P + 1].tobytes()
    assert s.position == P + 1
    sel = s.selection(2)
    assert sel.dtype == np.int32 and sel.shape[0] == 1
    w = min(sel.shape[1], tr["layer.2.topk"].shape[1])
    assert set(sel[0][sel[0] >= 0]) == set(tr["layer.2.topk"][P][:w][tr["layer.2.topk"][P][:w] >= 0])
    assert s.selection(0) is None          # SWA layers do not select


def test_plan_and_sources():
    m = dsattn.load(V41 + "/weights.safetensors")
    plan = m.plan
    cfg = json.load(open(V41 + "/config.json"))
    assert [p["ratio"] for p in plan] == cfg["compress_ratios"]
    assert {p["layer"] for p in plan if p["mode"] == "full"} == set(cfg["kv_source_layers"])
    assert [p["mode"] for p in plan[:4]] == ["swa", "swa", "full", "reuse"]
    x, P = _input(V41)
    s = m.sequence(64)
    s.stack(x[:P], dsattn.Context(mode="reference"))
    for p in plan:
        src = s.sources(p["layer"])
        assert src["kv"] == p["kv_source"], p
        assert src["topk"] == p["topk_source"], p
    v4 = dsattn.from_config(V4 + "/config.json")
    modes = [p["mode"] for p in v4.plan]
    assert modes[-1] == "mtp" and len(modes) == v4.n_layers + 1
    assert set(modes[:-1]) == {"swa", "csa", "hca"}


def test_every_generation_from_configs():
    cfgs = os.path.join(os.path.dirname(GOLDEN), "..", "..", "configs")
    seen = set()
    for f in sorted(os.listdir(cfgs)):
        m = dsattn.from_config(os.path.join(cfgs, f))
        seen.add(m.generation)
        assert not m.has_weights and len(m.plan) >= m.n_layers
        s = m.sequence(64)
        b = s.kv_bill()
        assert b["global_bytes_per_token"] > 0
        assert b["scratch_bytes"] > 0          # the decode scratch, sized at creation
        with pytest.raises(dsattn.DsattnError):
            s.forward(0, np.zeros((1, m.dim), np.float32))
    assert seen == {"mha", "mla", "v4", "v41"}


def test_generation_of_follows_the_library(tmp_path):
    """generation_of reads a config as the library's reader does: the
    model_type at the top or in text_config, else the keys one generation
    has; a V4.1 config wrapped in text_config loads through from_config."""
    cfgs = os.path.join(os.path.dirname(GOLDEN), "..", "..", "configs")
    v41 = json.load(open(os.path.join(cfgs, "deepseek-v4.1-flash.json")))
    cases = [
        ({"text_config": dict(v41, model_type="deepseek_v41_text")}, "v41"),
        ({"model_type": "deepseek_v41", "text_config": dict(v41)}, "v41"),
        ({k: v for k, v in v41.items() if k != "model_type"}, "v41"),
        ({"hidden_size": 64, "kv_source_layer_ids": [2]}, "v41"),
        ({"hidden_size": 64, "kv_source_layers": [2], "compress_ratios": [0]}, "v4"),
        ({"dim": 64, "compress_ratios": [0, 4]}, "v4"),
        ({"dim": 64, "kv_lora_rank": 32}, "mla"),
        ({"model_type": "llama"}, "mha"),
    ]
    for i, (cfg, gen) in enumerate(cases):
        p = tmp_path / f"c{i}.json"
        p.write_text(json.dumps(cfg))
        assert dsattn.generation_of(str(p)) == gen, cfg.keys()
    p = tmp_path / "wrapped.json"
    p.write_text(json.dumps(cases[0][0]))
    m = dsattn.from_config(str(p))
    assert m.generation == "v41" and m.n_layers == v41["n_layers"]
    for cfg, status in (({"model_type": "gpt2"}, -3), ({"dim": 64}, -3),
                        ({"model_type": 3}, -4), ({"text_config": [1]}, -4)):
        p.write_text(json.dumps(cfg))
        with pytest.raises(dsattn.DsattnError) as e:
            dsattn.generation_of(str(p))
        assert e.value.status == status, cfg


def test_scratch_at_and_index_shape(tmp_path):
    """Model.scratch_at(n) is the scratch a sequence of n tokens takes (its
    kv_bill), for every generation and MLA cache; V4's index_shape is its
    config's."""
    models = [dsattn.load(os.path.join(GOLDEN, c, "weights.safetensors"))
              for c in ("v3/tiny-seed0", "v4/tiny-seed0", "v41/tiny-seed0")]
    models.append(_mha_model(tmp_path))
    for m in models:
        caches = ("naive", "latent_bf16") if m.generation == "mla" else (None,)
        for cache in caches:
            for n in (16, 200):
                opts = {"cache": cache} if cache else {}
                want = m.sequence(n, **opts).kv_bill()["scratch_bytes"]
                got = m.scratch_at(n, cache) if cache else m.scratch_at(n)
                assert got == want > 0, (m.generation, cache, n)
    with pytest.raises(dsattn.DsattnError) as e:     # a size past size_t
        models[2].scratch_at(1 << 62)
    assert e.value.status == -5 and e.value.status_name == "size overflow"
    cfg = json.load(open(V4 + "/config.json"))
    assert models[1].index_shape == (cfg["index_n_heads"], cfg["index_head_dim"],
                                     cfg["index_topk"])
    with pytest.raises(dsattn.DsattnError, match="V4 only"):
        models[2].index_shape


def test_random_models_run():
    for cfg in (V41 + "/config.json", V4 + "/config.json", GOLDEN + "/v32/tiny-seed0/config.json"):
        m = dsattn.random(cfg, seed=3)
        s = m.sequence(16)
        x = np.random.default_rng(0).standard_normal((4, m.dim)).astype(np.float32)
        h = s.stack(x, dsattn.Context(mode="fast", threads=1))
        assert h.shape == x.shape and np.isfinite(h).all() and s.position == 4


def test_context_lends_a_long_chunk_its_scratch():
    """A 40-token prefill borrows scratch from its context; a second
    sequence's equal prefill on the same context finds it there."""
    m = dsattn.random(V41 + "/config.json", seed=3)
    ctx = dsattn.Context(mode="fast", threads=1)
    x = np.random.default_rng(1).standard_normal((40, m.dim)).astype(np.float32)
    m.sequence(48).stack(x, ctx)
    lent = ctx.scratch_bytes
    assert lent > 0
    m.sequence(48).stack(x, ctx)
    assert ctx.scratch_bytes == lent


@pytest.mark.parametrize("case", ["v3/tiny-seed0", "v4/tiny-seed0"])
def test_layer_subset_sequence_equals_cli(case, cli):
    """A Sequence of layers=(1, 2) runs layers 1 and 2 as the CLI's whole
    stack did, bit for bit; other layers and stack() raise; V4.1 refuses
    layers= (its layers share caches)."""
    case_dir = os.path.join(GOLDEN, case)
    want = cli_traced(case_dir)
    x, P = _input(case_dir)
    ctx = dsattn.Context(mode="reference")
    m = dsattn.load(os.path.join(case_dir, "weights.safetensors"))
    s = m.sequence(x.shape[0], layers=(1, 2))
    for t0, n in ((0, P), (P, 1)):
        for l in (1, 2):
            a_in = want[f"layer.{l}.attn_in"][t0:t0 + n]
            assert s.forward(l, a_in, ctx).tobytes() == \
                want[f"layer.{l}.attn_out"][t0:t0 + n].tobytes(), f"{case} layer {l}"
        s.advance(n)
    with pytest.raises(dsattn.DsattnError):
        s.forward(0, want["layer.0.attn_in"][P + 1:P + 2], ctx)
    with pytest.raises(dsattn.DsattnError):
        s.stack(np.zeros((1, m.dim), np.float32), ctx)
    m41 = dsattn.load(os.path.join(V41, "weights.safetensors"))
    with pytest.raises(ValueError, match="V4.1"):
        m41.sequence(8, layers=(0, 1))
    if case.startswith("v3"):
        # the same layers from a model that bound only their weights
        m12 = dsattn.load(os.path.join(case_dir, "weights.safetensors"), layers=(1, 2))
        assert m12.weight_bytes * 3 == m.weight_bytes * 2
        s12 = m12.sequence(x.shape[0], layers=(1, 2))
        for l in (1, 2):
            a_in = want[f"layer.{l}.attn_in"][0:P]
            assert s12.forward(l, a_in, ctx).tobytes() == want[f"layer.{l}.attn_out"][0:P].tobytes()
        with pytest.raises(dsattn.DsattnError):
            m12.sequence(x.shape[0]).forward(0, want["layer.0.attn_in"][0:P], ctx)
    else:
        with pytest.raises(ValueError, match="MLA"):
            dsattn.load(os.path.join(case_dir, "weights.safetensors"), layers=(1, 2))


def _mha_model(tmp_path, seed=3):
    """a random GQA model: hidden 128, 4 heads of 32, 2 KV heads, 2 layers"""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 128,
                               "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "rope_theta": 10000.0,
                               "max_position_embeddings": 64, "rms_norm_eps": 1e-6}))
    return dsattn.random(str(cfg), seed=seed)


def test_mha_random(tmp_path):
    m = _mha_model(tmp_path, seed=1)
    assert m.generation == "mha" and m.plan[0]["mode"] == "gqa"
    s = m.sequence(8)
    x = np.ones((3, 128), np.float32) * 0.25
    for l in range(m.n_layers):
        y = s.forward(l, x)
        assert y.shape == x.shape
    s.advance(3)
    k, v = s.kv(1, 2)
    assert k.shape == (2 * 32,) and np.isfinite(v).all()


def test_mha_load_checkpoint(tmp_path, cli):
    """A DeepSeek-LLM-form checkpoint (HF names, two shards, written by
    `dsattn make-weights`) loads from its folder: the projections are the
    stored tensors, and the layers run."""
    cfg = tmp_path / "llama.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 128,
                               "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "rope_theta": 10000.0,
                               "max_position_embeddings": 64, "rms_norm_eps": 1e-6}))
    out = tmp_path / "ckpt"
    subprocess.run([cli, "make-weights", "--config", str(cfg), "--seed", "5", "--out", str(out),
                    "--names", "hf", "--shards", "2"], check=True, capture_output=True)
    m = dsattn.load(str(out))
    assert m.generation == "mha" and m.has_weights and m.plan[1]["mode"] == "gqa"
    assert m.weight_bytes == 2 * 2 * (128 * 128 * 2 + 64 * 128 * 2)
    s = m.sequence(8)
    x = np.full((3, 128), 0.25, np.float32)
    for l in range(m.n_layers):
        y = s.forward(l, x)
        assert y.shape == x.shape and np.isfinite(y).all() and np.abs(y).max() > 0
    s.advance(3)


@pytest.mark.parametrize("case", ["mha", "v3/tiny-seed0", "v32/tiny-seed0", "v4/tiny-seed0",
                                  "v41/tiny-seed0"])
def test_forward_batch_equals_forward(case, tmp_path):
    """dsattn.forward_batch over sequences at different depths (0, 1, 5
    tokens) equals each sequence's own forward, row for row, bit for bit in
    reference mode, for two decode steps through every layer; so do the
    packed caches afterwards (V4 / V4.1)."""
    ctx = dsattn.Context(mode="reference")
    m = _mha_model(tmp_path) if case == "mha" else \
        dsattn.load(os.path.join(GOLDEN, case, "weights.safetensors"))
    rng = np.random.default_rng(5)
    rows = lambda n: (rng.standard_normal((n, m.dim)) * 0.5).astype(np.float32)  # noqa: E731
    a = [m.sequence(16) for _ in range(3)]
    for s, n in zip(a, (0, 1, 5)):
        if n:
            for l in range(m.n_layers):
                s.forward(l, rows(n), ctx)
            s.advance(n)
    b = [s.clone() for s in a]
    for step in range(2):
        order = [2, 0, 1] if step else [0, 1, 2]
        for l in range(m.n_layers):
            x = rows(3)
            got = dsattn.forward_batch([a[i] for i in order], l, x, ctx)
            for k, i in enumerate(order):
                want = b[i].forward(l, x[k:k + 1], ctx)
                assert got[k:k + 1].tobytes() == want.tobytes(), f"{case} step {step} layer {l}"
        for s in a + b:
            s.advance(1)
    for sa, sb in zip(a, b):
        assert sa.position == sb.position
        if m.generation in ("v4", "v41"):
            for l in range(m.n_layers):
                assert np.array_equal(sa.cache(l), sb.cache(l))


@pytest.mark.parametrize("case", ["v3/tiny-seed0", "v4/tiny-seed0", "v41/tiny-seed0"])
def test_stack_batch_equals_stack(case):
    ctx = dsattn.Context(mode="reference")
    m = dsattn.load(os.path.join(GOLDEN, case, "weights.safetensors"))
    x, P = _input(os.path.join(GOLDEN, case))
    a = [m.sequence(32) for _ in range(2)]
    a[1].stack(x[:P], ctx)                         # one at position P, one at 0
    b = [s.clone() for s in a]
    h = x[P:P + 2].copy()
    got, ain, aout = dsattn.stack_batch(a, h, ctx, capture=True)
    assert ain.shape == (m.n_layers, 2, m.dim) and got.shape == (2, m.dim)
    for i in range(2):
        want = b[i].stack(h[i:i + 1], ctx)
        assert got[i:i + 1].tobytes() == want.tobytes()
        assert a[i].position == b[i].position
    assert np.array_equal(h, x[P:P + 2])           # the caller's rows are not written


def test_batch_errors(tmp_path):
    """A bad batch raises DsattnError naming the first bad sequence
    (e.failed) and changes nothing; shapes and types are ValueError /
    TypeError before the library is called."""
    ctx = dsattn.Context(mode="reference")
    m = dsattn.load(V4 + "/weights.safetensors")
    s0, s1 = m.sequence(8), m.sequence(1)
    x = np.zeros((2, m.dim), np.float32)
    s1.stack(x[:1], ctx)                           # s1 is full
    with pytest.raises(dsattn.DsattnError) as e:
        dsattn.forward_batch([s0, s1], 0, x, ctx)
    assert e.value.failed == 1 and e.value.status_name == "invalid argument" \
        and "sequence 1" in str(e.value)
    with pytest.raises(dsattn.DsattnError) as e:
        dsattn.forward_batch([s0, s0], 0, x, ctx)   # a sequence twice
    assert e.value.failed == 1
    with pytest.raises(dsattn.DsattnError) as e:
        dsattn.forward_batch([s0], 99, x[:1], ctx)  # no such layer: no one sequence's
    assert e.value.failed is None
    assert s0.position == 0
    with pytest.raises(ValueError):
        dsattn.forward_batch([s0], 0, x, ctx)       # two rows for one sequence
    with pytest.raises(ValueError):
        dsattn.forward_batch([], 0, x, ctx)
    with pytest.raises(TypeError):
        dsattn.forward_batch([s0, "s"], 0, x, ctx)
    mha = _mha_model(tmp_path)
    with pytest.raises(ValueError):
        dsattn.forward_batch([s0, mha.sequence(4)], 0, x, ctx)   # two generations
    with pytest.raises(dsattn.DsattnError):
        dsattn.stack_batch([mha.sequence(4)], np.zeros((1, mha.dim), np.float32), ctx)


def test_errors_raise_with_the_library_message(tmp_path):
    with pytest.raises(dsattn.DsattnError) as e:
        dsattn.load(str(tmp_path / "missing.safetensors"), config=V41 + "/config.json")
    assert "missing.safetensors" in str(e.value) and e.value.status < 0
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "deepseek_v4", "dim": -3}')
    with pytest.raises(dsattn.DsattnError) as e:
        dsattn.from_config(str(bad))
    assert str(bad) in str(e.value) or "dim" in str(e.value)
    with pytest.raises(dsattn.DsattnError) as e:
        dsattn.trace(str(tmp_path))
    assert "config.json" in str(e.value)
    m = dsattn.load(V41 + "/weights.safetensors")
    s = m.sequence(4)
    with pytest.raises(dsattn.DsattnError) as e:
        s.forward(99, np.zeros((1, m.dim), np.float32))
    assert e.value.status_name
    with pytest.raises(ValueError):
        s.forward(0, np.zeros((1, m.dim + 1), np.float32))
    with pytest.raises(dsattn.DsattnError):
        s.forward(0, np.zeros((5, m.dim), np.float32))      # more tokens than the capacity
    with pytest.raises(ValueError):
        dsattn.Context(mode="exact")
    with pytest.raises(ValueError):
        dsattn.Context(isa="sse2")
    # every table name the library knows is accepted; one this build or CPU
    # cannot run is the library's UNSUPPORTED, not a crash
    for isa in ("ref", "avx2", "avx512", "neon"):
        try:
            assert dsattn.Context(isa=isa).isa == isa
        except dsattn.DsattnError as e:
            assert e.status_name == "unsupported" and isa in str(e), str(e)
    assert dsattn.Context(isa="ref").isa == "ref"
    with pytest.raises(ValueError):
        dsattn.trace(V41, index_k="stale")


def test_cache_views_alias_library_memory():
    x, P = _input(V41)
    ctx = dsattn.Context(mode="reference")
    m = dsattn.load(V41 + "/weights.safetensors")
    s = m.sequence(64)
    s.stack(x[:P], ctx)
    ring = s.cache(0, 0)
    ckv = s.cache(2, 1)
    assert ring.dtype == np.uint8 and ring.ndim == 2 and not ring.flags.writeable
    assert not ring.flags.owndata
    with pytest.raises(ValueError):
        ring[0, 0] = 1
    # the same bytes, not a copy: a second call returns the same address
    assert s.cache(0, 0).ctypes.data == ring.ctypes.data
    assert s.cache(2, 1).ctypes.data == ckv.ctypes.data
    tr = py_traced(V41)
    # layer 2 compresses every 2 tokens: the prefill wrote P // 2 entries,
    # the same bytes the whole trace ends with in its first rows
    assert ckv.shape == (P // 2, tr["cache.2.compress_kv"].shape[1])
    assert ckv.tobytes() == tr["cache.2.compress_kv"][:P // 2].tobytes()
    # a decode step writes the ring in place: the old view sees it
    before = ring.copy()
    s.stack(x[P:P + 1], ctx)
    assert not np.array_equal(before, ring)
    assert ring.tobytes() == s.cache(0, 0).tobytes()
    # the view keeps the sequence alive; close() refuses while views exist
    with pytest.raises(dsattn.DsattnError):
        s.close()
    del ring, ckv, before
    import gc
    gc.collect()
    s.close()
    v4 = dsattn.load(V4 + "/weights.safetensors")
    s4 = v4.sequence(32)
    x4, P4 = _input(V4)
    s4.stack(x4[:P4], ctx)
    kv = s4.cache(0, 0)
    assert kv.shape[0] > 0 and kv.ctypes.data == s4.cache(0, 0).ctypes.data


def test_view_outlives_its_python_owner():
    x, P = _input(V41)
    s = dsattn.load(V41 + "/weights.safetensors").sequence(64)
    s.stack(x[:P], dsattn.Context(mode="reference"))
    v = s.cache(2, 1)
    want = v.tobytes()
    del s                          # the view still holds the sequence
    import gc
    gc.collect()
    assert v.tobytes() == want


def test_gil_released_during_compute():
    done = threading.Event()
    result = {}

    def work():
        result["t"] = dsattn.trace(V41)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    ticks = 0
    while not done.is_set():
        ticks += 1
    t.join()
    assert "out" in result["t"]
    # with the GIL held for the whole call this loop could not run at all
    assert ticks > 10000, ticks


def _rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def test_no_leak_over_1000_cycles():
    """1,000 cycles of Context, Model (mapped checkpoint), Sequence and a
    cache view created and destroyed, every 10th running a stack step:
    RSS must stay flat (one cycle maps and allocates megabytes)."""
    w = V41 + "/weights.safetensors"
    x = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)

    def cycle(i):
        ctx = dsattn.Context(mode="fast", threads=1)
        m = dsattn.load(w)
        s = m.sequence(64)
        if i % 10 == 0:
            s.stack(x, ctx)
            v = s.cache(2, 1)
            del v
        s.close()
        m.close()
        ctx.close()

    for i in range(50):        # warm up allocator pools
        cycle(i)
    before = _rss_kib()
    for i in range(1000):
        cycle(i)
    grown = _rss_kib() - before
    assert grown < 8 * 1024, f"RSS grew by {grown} KiB over 1000 cycles"


def test_bill_rows_equal_cli(cli):
    rows = dsattn.bill(kv_only=True)
    cfgs = os.path.join(os.path.dirname(GOLDEN), "..", "..", "configs")
    r = subprocess.run([cli, "bill", "--kv-only", "--format", "json", "--quiet",
                        "--configs", cfgs], capture_output=True, text=True, check=True)
    want = json.loads(r.stdout)["rows"]
    strip = lambda rs: [{k: v for k, v in x.items() if k != "seconds"} for x in rs]
    assert strip(rows) == strip(want)
    keys = [x["key"] for x in rows]
    assert keys == ["v1-7b", "v1-67b", "v3", "v3.2", "v4-flash", "v4-pro", "v4.1-flash"]
    assert all(x["status"] == "kv-only" for x in rows)
    v41 = dsattn.bill(kv_only=True, only=["v4.1-flash"])
    assert len(v41) == 1 and v41[0]["global_kv_bytes_per_token"] > 0


def test_sessions_save_load_clone(tmp_path):
    """A saved, loaded and cloned V4.1 sequence continue exactly as the
    original (reference mode); a corrupt session file raises with the
    library's message."""
    x, P = _input(V41)
    ctx = dsattn.Context(mode="reference")
    m = dsattn.load(V41 + "/weights.safetensors")
    s = m.sequence(64)
    s.stack(x[:P], ctx)
    path = tmp_path / "s.session"
    s.save(str(path))
    c = s.clone()
    r = dsattn.Sequence.load(m, str(path))
    rb = dsattn.Sequence.load_bytes(m, path.read_bytes(), max_seq_len=128)
    want = s.stack(x[P:P + 1], ctx)
    for t in (c, r, rb):
        assert t.position == P
        assert t.stack(x[P:P + 1], ctx).tobytes() == want.tobytes()
        assert t.cache(2, 1).tobytes() == s.cache(2, 1).tobytes()
    bad = bytearray(path.read_bytes())
    bad[len(bad) // 2] ^= 0xFF
    (tmp_path / "bad.session").write_bytes(bytes(bad))
    with pytest.raises(dsattn.DsattnError) as e:
        dsattn.Sequence.load(m, str(tmp_path / "bad.session"))
    assert "bad.session" in str(e.value)


def test_session_info(tmp_path, cli):
    """session_info reads back what each generation's sequence saved -
    generation, options, layer subset, position, capacity - as `dsattn info`
    prints it, and raises naming the file on a damaged one."""
    x, P = _input(V41)
    m = dsattn.load(V41 + "/weights.safetensors")
    s = m.sequence(64, index_k="reference")
    s.stack(x[:P], dsattn.Context(mode="reference"))
    cases = [(s, "v41", {"index_k": "reference"}, None, P, 64)]
    mla = dsattn.load(os.path.join(GOLDEN, "v32", "tiny-seed0", "weights.safetensors"))
    cases.append((mla.sequence(32, cache="naive", layers=(1, 2)), "mla",
                  {"cache": "naive"}, (1, 2), 0, 32))
    v4 = dsattn.load(V4 + "/weights.safetensors").sequence(16, empty="zero")
    v4.fill_synthetic(5)
    cases.append((v4, "v4", {"empty": "zero"}, None, 5, 16))
    mha = _mha_model(tmp_path).sequence(8)
    cases.append((mha, "mha", {}, (0, 2), 0, 8))
    for seq, gen, opts, layers, pos, cap in cases:
        path = str(tmp_path / f"{gen}.session")
        seq.save(path)
        i = dsattn.session_info(path)
        assert (i["generation"], i["options"], i["layers"], i["position"], i["capacity"]) == \
            (gen, opts, layers, pos, cap), (gen, i)
        assert i["file_bytes"] == os.path.getsize(path) and i["n_sections"] > 0
        assert i["lib_version"] == dsattn.version()
        out = subprocess.run([cli, "info", path], capture_output=True, text=True, check=True).stdout
        assert f"generation:  {gen} " in out and f"position:    {pos} tokens consumed, " \
            f"capacity {cap}" in out and f"{i['config_hash']:016x}" in out, out
        if gen in ("mla", "v4") and layers:
            assert f", layers {layers[0]}..{layers[0] + layers[1] - 1} only)" in out, out
    bad = bytearray(open(path, "rb").read())
    bad[-3] ^= 0x40
    (tmp_path / "bad.session").write_bytes(bytes(bad))
    with pytest.raises(dsattn.DsattnError, match="bad.session"):
        dsattn.session_info(str(tmp_path / "bad.session"))


def test_structs_match_the_header():
    """Every struct the package passes by value or pointer has the fields of
    include/dsattn.h, in order (a field added in C and not here would let
    the library write past the Python struct)."""
    import re
    from dsattn import _lib
    hdr = open(os.path.join(GOLDEN, "..", "..", "..", "include", "dsattn.h")).read()
    for cname, cls in (("dsattn_ctx_params", _lib.CtxParams), ("dsattn_counters", _lib.Counters),
                       ("dsattn_profile", _lib.Profile), ("dsattn_kv_bill", _lib.KvBill),
                       ("dsattn_trace_params", _lib.TraceParams),
                       ("dsattn_v41_ced_rows", _lib.CedRows),
                       ("dsattn_session_info", _lib.SessionInfo)):
        body = re.search(r"typedef struct \{([^}]*)\} " + cname + ";", hdr).group(1)
        body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        names = [n for d in body.split(";") if d.strip()
                 for n in re.findall(r"(\w+)\s*(?:\[[^]]*\])?\s*(?:,|$)", d.strip())
                 if n not in ("double", "float", "int", "size_t", "uint64_t")]
        assert names == [f[0] for f in cls._fields_], (cname, names)


def _ced_model(tmp_path, seed=7):
    """a random V4.1 plan where CED skips rows: 17 layers, window 8, KV
    sources 2, 4, 6 (6 the last, with the candidate pool), Reuse, Reindex
    and an SWA layer (11) after it"""
    cfg = tmp_path / "ced.json"
    r = [0, 0, 2, 2, 2, 2] + [1] * 5 + [0] + [1] * 5
    cfg.write_text(json.dumps({
        "dim": 128, "n_layers": 17, "n_heads": 4, "head_dim": 64, "rope_head_dim": 16,
        "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 32, "window_size": 8,
        "compress_ratios": r, "kv_source_layers": [2, 4, 6],
        "index_source_layers": [2, 4, 6, 9, 13, 15], "candidate_source_layer": 6,
        "candidate_topk_blocks": 3, "candidate_block_size": 4, "index_n_heads": 4,
        "index_head_dim": 32, "index_topk": 6, "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0, "rope_factor": 16, "original_seq_len": 65536,
        "beta_fast": 32, "beta_slow": 1, "norm_eps": 1e-20, "dtype": "bf16"}))
    return dsattn.random(str(cfg), seed=seed)


def test_ced_plan_and_work(tmp_path):
    m, n, w = _ced_model(tmp_path), 40, 8
    assert (m.ced_plan(n, "off") == 0).all()
    for mode in ("exact", "bounded"):
        p = m.ced_plan(n, mode)
        assert p.shape == (m.n_layers, 2) and p.dtype == np.int64
        # the last KV source (6) and the layers before it take every row;
        # the layers before it output every row too
        assert (p[:7, 0] == 0).all() and (p[:6, 1] == 0).all(), mode
        assert (p[1:, 0] == p[:-1, 1]).all() and (p[:, 0] <= p[:, 1]).all()
        assert p[-1, 1] == n - 1                      # the last layer: the last token only
        assert m.ced_work(n, mode) == (int((n - p[:, 0]).sum()), int((n - p[:, 1]).sum()))
    b = m.ced_plan(n, "bounded")
    assert (b[7:, 0] >= n - w).all()
    assert m.ced_work(n, "off") == (m.n_layers * n, m.n_layers * n)
    with pytest.raises(ValueError, match="mode"):
        m.ced_plan(n, "fast")
    with pytest.raises(dsattn.DsattnError, match="V4.1"):
        dsattn.load(V4 + "/weights.safetensors").ced_plan(n)


def test_ced_forward_rows_equal_the_full_prefill(tmp_path):
    """Each layer over the rows ced_plan gives (exact) outputs the full
    prefill's rows bit for bit in reference mode, and the decode after it is
    the same; the stacked form (prefill) gives the stack's last row."""
    ctx = dsattn.Context(mode="reference")
    m, n = _ced_model(tmp_path), 40
    rng = np.random.default_rng(11)
    X = (rng.standard_normal((m.n_layers, n, m.dim)) * 0.5).astype(np.float32)
    a, b = m.sequence(64), m.sequence(64)
    full = [a.forward(l, X[l], ctx) for l in range(m.n_layers)]
    a.advance(n)
    plan = m.ced_plan(n, "exact")
    for l, (i0, o0) in enumerate(plan):
        got = b.forward_rows(l, X[l][i0:], i0, o0, ctx)
        assert got.tobytes() == full[l][o0:].tobytes(), f"layer {l} rows [{o0}, {n})"
    b.advance(n)
    for step in range(3):
        x1 = (rng.standard_normal((1, m.dim)) * 0.5).astype(np.float32)
        for l in range(m.n_layers):
            assert a.forward(l, x1, ctx).tobytes() == b.forward(l, x1, ctx).tobytes(), (step, l)
        a.advance(1)
        b.advance(1)

    h0 = (rng.standard_normal((n, m.dim))).astype(np.float32)
    s_off, s_ex, s_bd = m.sequence(64), m.sequence(64), m.sequence(64)
    h_off, _, out_off = s_off.stack(h0, ctx, capture=True)
    h_ex, out_ex = s_ex.prefill(h0, "exact", ctx, capture=True)
    assert h_ex[-1].tobytes() == h_off[-1].tobytes()
    for l, (_, o0) in enumerate(plan):
        assert out_ex[l, o0:].tobytes() == out_off[l, o0:].tobytes(), l
        assert not out_ex[l, :o0].any(), l           # the rows the mode skips: 0
    h_bd = s_bd.prefill(h0, "bounded", ctx)
    assert np.isfinite(h_bd[-1]).all() and s_bd.position == s_ex.position == n
    x1 = rng.standard_normal((1, m.dim)).astype(np.float32)
    assert s_ex.stack(x1, ctx).tobytes() == s_off.stack(x1, ctx).tobytes()


def test_ced_errors(tmp_path):
    m, n = _ced_model(tmp_path), 16
    s = m.sequence(32)
    x = np.zeros((n, m.dim), np.float32)
    with pytest.raises(ValueError, match="out_first"):
        s.forward_rows(0, x, 4, 2)
    with pytest.raises(ValueError, match="out_first"):
        s.forward_rows(0, x, 0, n)
    with pytest.raises(ValueError, match="float32"):
        s.forward_rows(0, np.zeros((n, m.dim + 1), np.float32))
    with pytest.raises(dsattn.DsattnError, match="forward_rows"):
        s.forward_rows(2, x[4:], 4)                  # a KV source takes every row
    s.prefill(x, "off")
    assert s.position == n
    with pytest.raises(dsattn.DsattnError, match="prefill"):
        s.prefill(x, "exact")                        # not at position 0
    with pytest.raises(ValueError, match="mode"):
        m.sequence(32).prefill(x, "fast")
    v4 = dsattn.load(V4 + "/weights.safetensors").sequence(16)
    with pytest.raises(dsattn.DsattnError, match="V4.1"):
        v4.forward_rows(0, x[:1])
    with pytest.raises(dsattn.DsattnError, match="V4.1"):
        v4.prefill(x[:1])


def test_bad_arguments_raise_before_the_library_sees_them(tmp_path):
    """What ctypes would pass on silently - a wrapped integer, a path cut at a
    NUL, an object of the wrong kind, a sequence whose model was closed -
    raises in Python; the MLA latent widths come from the model itself."""
    m = dsattn.load(os.path.join(GOLDEN, "v41", "tiny-seed0", "weights.safetensors"))
    s = m.sequence(16)
    x = np.zeros((1, m.dim), np.float32)
    with pytest.raises(ValueError):
        s.advance(2**64 + 1)              # ctypes: 1
    with pytest.raises(ValueError):
        s.forward(2**32 + 1, x)           # ctypes: layer 1
    with pytest.raises(ValueError):
        s.fill_synthetic(-1 + 2**64)
    with pytest.raises(ValueError):
        dsattn.Context(threads=2**32 + 2)  # ctypes: 2
    with pytest.raises(ValueError):
        dsattn.Sequence(m, 2**64 + 16)
    with pytest.raises(ValueError, match="NUL"):
        s.save(str(tmp_path / "a\0b.sess"))
    with pytest.raises(TypeError):
        s.forward(0, x, m)                # a Model as the context
    with pytest.raises(TypeError):
        dsattn.Sequence(s, 16)            # a Sequence as the model
    with pytest.raises(TypeError):
        dsattn.Sequence.load_bytes(s, b"")
    assert s.position == 0
    m.close()
    with pytest.raises(dsattn.DsattnError, match="Model was closed"):
        s.fill_synthetic(4)
    s.close()
    # MLA latent widths: the model's (text_config's), not the file's top level
    cfg = json.load(open(os.path.join(GOLDEN, "v3", "tiny-seed0", "config.json")))
    wrapped = {"kv_lora_rank": 8, "qk_rope_head_dim": 4,
               "text_config": dict(cfg, kv_lora_rank=128, qk_rope_head_dim=32)}
    p = tmp_path / "v3.json"
    p.write_text(json.dumps(wrapped))
    m3 = dsattn.from_config(str(p))
    s3 = m3.sequence(8)
    s3.fill_synthetic(4)
    kv, pe = s3.latent(0, 1)
    assert kv.shape == (128,) and pe.shape == (32,)


def test_default_context_is_per_thread():
    """Calls without ctx in two threads use two contexts (a context's
    scratch is reallocated under a call)."""
    from dsattn import _core
    got = []
    t = threading.Thread(target=lambda: got.append(_core._ctx(None).value))
    t.start()
    t.join()
    here = _core._ctx(None).value
    assert got and got[0] != here and _core._ctx(None).value == here
