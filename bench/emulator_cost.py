"""Cost per launch of the CPU emulator (sim backend).

Kernel: two_barrier_scale from cuda_src/selftest.cu (two __syncthreads per
thread), 64 blocks x 256 threads.  Prints ms per launch, total and per block.

    python bench/emulator_cost.py [--launches 50] [--order forward|reverse|shuffled]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cupyglm.kernels import CUDA_SRC, load_module  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--order", default="forward")
    ns = ap.parse_args(argv)
    mod = load_module("sim", CUDA_SRC / "selftest.cu")
    fn = mod.get_function("two_barrier_scale")
    n = ns.blocks * ns.threads
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = np.zeros_like(x)
    args = (x, y, np.float32(2.0))
    fn(ns.blocks, ns.threads, args, order=ns.order)  # start the worker
    t0 = time.perf_counter()
    for _ in range(ns.launches):
        fn(ns.blocks, ns.threads, args, order=ns.order)
    dt = (time.perf_counter() - t0) / ns.launches
    switches = n * 3 * 2  # 3 resumptions per thread (start + 2 barriers), each a switch in and out
    print(f"{ns.blocks} blocks x {ns.threads} threads, 2 barriers, order={ns.order}: "
          f"{dt * 1e3:.3f} ms/launch ({dt / ns.blocks * 1e6:.1f} us/block, "
          f"{dt / switches * 1e9:.1f} ns per context switch incl. kernel work)")
    mod.close()


if __name__ == "__main__":
    main()
