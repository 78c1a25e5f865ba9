#!/usr/bin/env python3
"""avx2-targets.py - the AVX2 kernel table against its speed targets, in one run.

Runs the benchmarks with the AVX2 table forced (DSATTN_ISA=avx2, DSATTN_AMX=0:
on a CPU without AVX-512 that is what runs anyway), --runs times, 2 threads,
and prints one markdown table: each target, what every run measured, and
whether the worst run meets it.  Every figure is a ratio the benchmark
measured against limits it measured in the same run (read probe, FMA peak,
byte bound); this script only reads the CSV and compares.

    target                                            from
    FP8 GEMV  >= 85 % of read bandwidth (each shape)  bench kernels --isa avx2
    FP4 GEMV  >= 80 % of read bandwidth (each shape)  bench kernels --isa avx2
    V4.1 decode @4K <= 1.3 x its byte bound           bench v41 --depth 4096,1M
    V4.1 t(1M) / t(4K) <= 1.4                         bench v41 --depth 4096,1M
    V4.1 prefill projections >= 60 % of FMA peak      bench v41 --prefill 128
    FP8 Linear, 128-token chunk >= 60 % of FMA peak   bench kernels --isa avx2
    V3 MLA layer @32K: attention >= 60 % of FMA peak  bench mla --model v3
    V3 MLA layer @32K >= 1.5x faster than PyTorch's   bench mla, alternated with
      absorbed attention alone                        scripts/torch-mla-attention.py
    DeepSeek-LLM-7B MHA @64K >= 85 % of read BW       bench mha --depth 64K
    DeepSeek-LLM-67B GQA @64K >= 70 % of read BW      bench mha --depth 64K

The PyTorch comparison needs Debian's python3-torch; without it that row
says so.  The machine should be otherwise idle: the ranges are only as good
as the host is quiet.  Takes about 5 minutes a run on a 2-core machine.

    /usr/bin/python3 scripts/avx2-targets.py [--build build] [--runs 2]
"""
import argparse
import csv
import io
import os
import re
import subprocess
import sys


def bench(dsattn, args, env, need):
    """the CSV rows of `dsattn bench ARGS`; exits naming the column when one
    this script reads is missing (the bench's columns were renamed)"""
    out = subprocess.run([dsattn, "bench", *args, "--format", "csv"], env=env, check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    for col in need:
        if not rows or col not in rows[0]:
            sys.exit(f"avx2-targets: `dsattn bench {' '.join(args)}` printed no column {col!r}"
                     f"{'' if rows else ' (no rows at all)'}: update scripts/avx2-targets.py")
    return rows


def pct(s):
    """a fraction (0.85) or a percentage ("85%") as a fraction"""
    s = s.strip()
    return float(s[:-1]) / 100 if s.endswith("%") else float(s)


def torch_ms(root, depth):
    script = os.path.join(root, "scripts", "torch-mla-attention.py")
    r = subprocess.run(["/usr/bin/python3", script, "--depth", str(depth), "--threads", "2"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    m = re.search(r"attention ([0-9.]+) ms", r.stdout)
    return float(m.group(1)) if r.returncode == 0 and m else None


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(root, "build"))
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    dsattn = os.path.join(a.build, "dsattn")
    if not os.access(dsattn, os.X_OK):
        sys.exit(f"avx2-targets: no {dsattn}: build first (README)")
    env = dict(os.environ, DSATTN_ISA="avx2", DSATTN_AMX="0")

    # target -> (kind, threshold, [measured value per run and shape])
    rows = {}
    limits = []                          # (read GB/s, FMA GFLOP/s) of each run's bench mha
    def add(name, kind, thr, v):
        rows.setdefault(name, (kind, thr, []))[2].append(v)

    for run in range(a.runs):
        print(f"avx2-targets: run {run + 1} of {a.runs}", file=sys.stderr)
        for r in bench(dsattn, ["kernels", "--isa", "avx2", "--threads", "2"], env,
                       ("kernel", "frac_bw", "frac_peak")):
            k = r["kernel"]
            if k.startswith("gemv_fp8 ") or k.startswith("gemv_fp8_finite "):
                add("FP8 GEMV, % of read BW", ">=", 0.85, pct(r["frac_bw"]))
            elif k == "gemv_fp4":
                add("FP4 GEMV, % of read BW", ">=", 0.80, pct(r["frac_bw"]))
            elif k.startswith("linear fp8 x128"):
                add("FP8 Linear of a 128-token chunk, % of FMA peak", ">=", 0.60,
                    pct(r["frac_peak"]))
        v41 = bench(dsattn, ["v41", "--depth", "4096,1M", "--threads", "2", "--prefill", "128"],
                    env, ("variant", "depth", "t_over_bound", "t_over_first",
                          "proj_frac_fma_peak"))
        for r in v41:
            if "decode" in r["variant"] and r["depth"] == "4096":
                add("V4.1 decode @4K, t / byte bound", "<=", 1.3, float(r["t_over_bound"]))
            elif "decode" in r["variant"] and r["depth"] == "1048576":
                add("V4.1 decode, t(1M) / t(4K)", "<=", 1.4, float(r["t_over_first"]))
            elif "prefill" in r["variant"]:
                add("V4.1 prefill projections, % of FMA peak", ">=", 0.60,
                    pct(r["proj_frac_fma_peak"]))
        mha = bench(dsattn, ["mha", "--depth", "64K", "--threads", "2"], env,
                    ("model", "frac_read_bw", "read_bw_gb_s", "fma_peak_gflop_s"))
        limits.append((float(mha[0]["read_bw_gb_s"]), float(mha[0]["fma_peak_gflop_s"])))
        for r in mha:
            if r["model"] == "DeepSeek-LLM-7B":
                add("7B MHA @64K, % of read BW", ">=", 0.85, pct(r["frac_read_bw"]))
            elif r["model"] == "DeepSeek-LLM-67B":
                add("67B GQA @64K, % of read BW", ">=", 0.70, pct(r["frac_read_bw"]))
        tms = torch_ms(root, 32768)          # alternated with the dsattn layer
        for r in bench(dsattn, ["mla", "--model", "v3", "--depth", "32K", "--threads", "2"], env,
                       ("attention_frac_fma_peak", "ms_mean")):
            add("V3 MLA @32K, attention % of FMA peak", ">=", 0.60,
                pct(r["attention_frac_fma_peak"]))
            add("V3 MLA @32K, PyTorch's attention / the dsattn layer", ">=", 1.5,
                tms / float(r["ms_mean"]) if tms else None)

    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    print(f"AVX2 table (DSATTN_ISA=avx2 DSATTN_AMX=0), 2 threads, {a.runs} run(s), "
          f"CPU \"{cpu}\"\n")
    print("| target | measured (every run and shape) | met by the worst |")
    print("|---|---|---|")
    for name, (kind, thr, vals) in rows.items():
        got = [v for v in vals if v is not None]
        frac = "%" in name
        fmt = (lambda v: f"{v * 100:.0f} %") if frac else (lambda v: f"{v:.2f}")
        if not got:
            print(f"| {name} {kind} {fmt(thr)} | not measured (python3-torch missing?) | - |")
            continue
        worst = min(got) if kind == ">=" else max(got)
        met = worst >= thr if kind == ">=" else worst <= thr
        shown = ", ".join(fmt(v) for v in got)
        print(f"| {name} {kind} {fmt(thr)} | {shown} | {'yes' if met else 'no'} |")
    print("\nThe limits `bench mha` measured in each run (every bench measures its own): read "
          + ", ".join(f"{rb:.1f}" for rb, _ in limits) + " GB/s; FMA peak "
          + ", ".join(f"{fp:.0f}" for _, fp in limits) + " GFLOP/s.")


if __name__ == "__main__":
    main()
