"""The tensor core's CPU model (backend/tensor_core.py mma_chain) against the plain lane-16 GEMM (backend/lanes.py
gemm) on the same bf16 operands: x [M, K] times a weight w [N, K], for each M, on this machine's CPU.

    python bench/tc_model_speed.py [--m 1 4 16 64 256] [--n 2048] [--k 2048] [--arch sm_90] [--repeat 3]

Each time is the best of --repeat runs. Prints one line per M with both times and their ratio (model / lanes),
then `RESULT tc_model_speed <arch> N=<n> K=<k>: ratio <r1> .. <rn> at M = <m1> .. <mn>`.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from cupyglm.backend import lanes
from cupyglm.backend import tensor_core as tc


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--arch", default=tc.DEFAULT_ARCH)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.k % tc.K_STEP or min(args.m + [args.n, args.k, args.repeat]) < 1:
        p.error(f"--k must be a positive multiple of {tc.K_STEP}; --m, --n and --repeat positive")
    rng = np.random.default_rng(args.seed)
    w = lanes.bf16(rng.standard_normal((args.n, args.k)).astype(np.float32) * np.float32(0.02))
    ratios = []
    for m in args.m:
        x = lanes.bf16(rng.standard_normal((m, args.k)).astype(np.float32))
        t_lanes = best(lambda: lanes.gemm(x, w), args.repeat)
        t_model = best(lambda: tc.mma_chain(x, w.T, arch=args.arch), args.repeat)
        ratios.append(t_model / t_lanes)
        print(f"M={m:<4d} lanes gemm {t_lanes * 1e3:9.1f} ms   tensor-core model {t_model * 1e3:9.1f} ms   "
              f"ratio {ratios[-1]:5.2f}", flush=True)
    print(f"RESULT tc_model_speed {args.arch} N={args.n} K={args.k}: ratio "
          f"{' '.join(f'{r:.2f}' for r in ratios)} at M = {' '.join(str(m) for m in args.m)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
