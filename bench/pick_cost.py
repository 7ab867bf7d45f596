"""The DSA pick's cost per row, as an operation count: the rank-by-counting kernel this replaced against the
radix select of cuda_src/pick.cu, at given visible pools (the full model's npools = index_topk / kpool).

    python bench/pick_cost.py [--pools 4096 32768 131072] [--npools 512] [--seed 0]

old: score reads of the O(v^2) count (pool p scans j = 0.. until npools pools beat it; a picked pool scans all
v), counted exactly for random distinct scores with a Fenwick tree (the npools-th smallest index among p's
beaters), and its worst case v^2. new: score reads of the 4 histogram passes and the output pass (5 v),
histogram atomics (keys that match the digits fixed so far, exact for the same scores), the serial bin scans
(4 x 256) and the block scans (2 per tile of 128 pools).
"""
from __future__ import annotations

import argparse

import numpy as np

THREADS, BINS = 128, 256


def _keys(s: np.ndarray) -> np.ndarray:
    b = np.where(s == 0, np.float32(0), s).astype(np.float32).view(np.uint32)
    return np.where(b & 0x80000000, ~b, b | 0x80000000).astype(np.uint32)


def old_reads(s: np.ndarray, npools: int) -> int:
    v = s.size
    order = np.lexsort((np.arange(v), -s.astype(np.float64)))       # best first: score desc, index asc
    tree = [0] * (v + 1)
    log = 1 << (v.bit_length() - 1)
    total = 0
    for r, p in enumerate(order.tolist()):                            # the r pools before p all beat it
        if r < npools:
            total += v                                                # picked: the scan runs to the end
        else:                                                         # stops at the npools-th beater's index
            pos, k, step = 0, npools, log
            while step:
                if pos + step <= v and tree[pos + step] < k:
                    pos += step
                    k -= tree[pos]
                step >>= 1
            total += pos + 1
        i = p + 1
        while i <= v:
            tree[i] += 1
            i += i & -i
    return total


def new_ops(s: np.ndarray, npools: int) -> dict:
    keys = _keys(s)
    prefix, mask, need, atomics = 0, 0, npools, 0
    for shift in (24, 16, 8, 0):
        m = keys[(keys & mask) == prefix]
        atomics += m.size
        hist = np.bincount((m >> shift) & 255, minlength=BINS)
        acc, d = 0, BINS - 1
        while d > 0 and acc + hist[d] < need:
            acc += hist[d]
            d -= 1
        prefix |= d << shift
        mask |= 255 << shift
        need -= acc
    tiles = -(-s.size // THREADS)
    return {"reads": 5 * s.size, "atomics": atomics, "bin_steps": 4 * BINS, "scans": 2 * tiles}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", type=int, nargs="+", default=[4096, 32768, 131072])
    ap.add_argument("--npools", type=int, default=512, help="pools picked (glm-5.3-flash: 2048 / 4)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    for v in a.pools:
        s = rng.standard_normal(v).astype(np.float32)
        old = old_reads(s, a.npools)
        new = new_ops(s, a.npools)
        print(f"pools {v:>7,} ({4 * v:>7,} tokens): old reads {old:>14,} (worst {v * v:>15,}); new reads "
              f"{new['reads']:>9,} + atomics {new['atomics']:>9,} + bin steps {new['bin_steps']} + block scans "
              f"{new['scans']:,}; old/new reads {old / new['reads']:.0f}x (worst {v * v / new['reads']:.0f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
