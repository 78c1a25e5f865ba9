#!/usr/bin/env python3
"""torch-mla-attention.py - PyTorch's time for the absorbed MLA decode attention of
one DeepSeek-V3 layer, the yardstick `dsattn bench mla --model v3` is compared with.

What it times (fp32, the machine's PyTorch and BLAS, --threads threads): for one
decode token over a cache of --depth tokens, with the V3 dims (128 heads, a
512-wide latent, 64 rope dims):

    scores = (q_lat @ C^T + q_pe @ K_pe^T) * scale      [128 x depth]
    p      = softmax(scores)
    o_lat  = p @ C                                      [128 x 512]

i.e. the attention alone: no projections, no absorption products, no cache
decode (C and K_pe are fp32 tensors already in memory).  It prints the median and
the range of --reps timed runs after one warm-up, in milliseconds.

Needs Debian's python3-torch (run it with /usr/bin/python3); it is not a test and
not part of the build.

    /usr/bin/python3 scripts/torch-mla-attention.py --depth 32768 --threads 2
"""
import argparse
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depth", type=int, default=32768)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    H, R, P = 128, 512, 64
    C = torch.randn(a.depth, R) * 0.1
    K_pe = torch.randn(a.depth, P) * 0.1
    q_lat = torch.randn(H, R) * 0.1
    q_pe = torch.randn(H, P) * 0.1
    scale = (128 + 64) ** -0.5

    def step():
        s = (q_lat @ C.T + q_pe @ K_pe.T) * scale
        return torch.softmax(s, dim=-1) @ C

    with torch.inference_mode():
        step()
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            step()
            ts.append((time.perf_counter() - t0) * 1e3)
    print(f"torch {torch.__version__}, {a.threads} threads, depth {a.depth}: "
          f"absorbed MLA attention {statistics.median(ts):.1f} ms "
          f"(min {min(ts):.1f}, max {max(ts):.1f}, {a.reps} runs)")


if __name__ == "__main__":
    main()
