"""The DSA pick's time a layer on an H200, by a latency/issue/bandwidth estimate: before (one 128-thread block a
row over all its pools) against after (cuda_src/pick.cu: dsa_pick, one 256-thread block a part of 4,096 pools,
then dsa_pick_merge, one block a row over the parts' candidates), for decode rows at given windows.

    python bench/pick_cost.py [--tokens 4096 131072 1048576] [--rows 1 16] [--npools 512] [--kpool 4] [--seed 0]

The estimate, in cycles at CLOCK: a block's time is the sum of its dependent latencies (a global load LAT_HBM on
a row's first read, LAT_L2 after; a barrier BAR; a shuffle or shared load LAT_SH), its issued warp instructions
over an SM's 4 schedulers, and its shared atomics' serialisation (per warp instruction, the most lanes hitting one
bin, counted on the scores).  Loads in flight: before, one a thread (its loops load, then wait); after, 16 a
thread in dsa_pick (keys in registers), 8 in dsa_pick_merge (unrolled).  Blocks run in waves of SMS x the blocks
an SM holds (registers from ptxas -v on sm_90: 80 and 40 a thread); a kernel takes at least its HBM bytes over
HBM; each launch adds LAUNCH_US.  Scores: standard normal, one row's drawn for every row.
"""
from __future__ import annotations

import argparse

import numpy as np

SMS, CLOCK, HBM, SCHED = 132, 1.98e9, 4.3e12, 4          # H200: SMs, boost clock, HBM bytes/s, schedulers an SM
LAT_HBM, LAT_L2, LAT_SH, BAR = 600, 300, 30, 30          # cycles
LAUNCH_US = 2.0
SCAN = 6 * LAT_SH + 2 * BAR                              # a block scan: 5 dependent shuffles, the warp totals
PART, KEEP_MAX = 4096, 4096                              # ops_pick.PART pools a dsa_pick block
REGS = 65536


def _keys(s: np.ndarray) -> np.ndarray:
    b = np.where(s == 0, np.float32(0), s).astype(np.float32).view(np.uint32)
    return np.where(b & 0x80000000, ~b, b | 0x80000000).astype(np.uint32)


def _select(keys: np.ndarray, npools: int) -> tuple[list, int]:
    """The radix select's 4 passes: per pass (mask of keys counted, their digits); and T."""
    prefix, mask, need, passes = 0, 0, npools, []
    for shift in (24, 16, 8, 0):
        m = (keys & np.uint32(mask)) == prefix
        d = ((keys >> np.uint32(shift)) & np.uint32(255)).astype(np.int64)
        passes.append((m, d))
        hist = np.bincount(d[m], minlength=256)
        above = np.cumsum(hist[::-1])[::-1] - hist                     # keys in bins above each digit
        dig = int(np.flatnonzero((above < need) & (above + hist >= need)).max())
        prefix |= dig << shift
        mask |= 255 << shift
        need -= int(above[dig])
    return passes, prefix


def _atomics(passes: list) -> int:
    """Serialisation cycles of the histogram atomics: warp instructions are 32 consecutive list entries."""
    total = 0
    for m, d in passes:
        g = np.arange(d.size) // 32
        c = np.bincount(g * 256 + d, weights=m, minlength=(g[-1] + 1) * 256).reshape(-1, 256)
        total += int(c.max(axis=1).sum())
    return total


def before_us(s: np.ndarray, npools: int, rows: int) -> tuple[float, int]:
    """One 128-thread block a row (4 warps): 5 passes of one dependent load a thread an iteration, 2 block scans a
    128-pool tile, the digit found by a serial walk over 256 bins a pass."""
    v = s.size
    passes, _ = _select(_keys(s), npools)
    it = -(-v // 128)
    chain = it * LAT_HBM + 4 * it * LAT_L2 + 2 * it * SCAN + 4 * 256 * LAT_SH + 12 * BAR
    issue = 5 * (v // 32) * 8 // SCHED
    waves = -(-rows // SMS)
    cyc = waves * (chain + issue + _atomics(passes))
    return max(cyc / CLOCK, rows * v * 4 / HBM) * 1e6 + LAUNCH_US, 1


def _part_cycles(keys: np.ndarray, npools: int) -> tuple[int, np.ndarray]:
    """dsa_pick's block over one part (8 warps, 16 keys a thread in registers) and its kept keys."""
    n = keys.size
    select = n > npools
    passes, T = _select(keys, npools) if select else ([], 0)
    chain = LAT_HBM + (4 * (4 * BAR + SCAN) if select else 0) + 2 * BAR + 8 * LAT_SH
    issue = 8 * 16 * (6 + (28 if select else 0) + 24) // SCHED
    if not select:
        kept = keys
    else:
        order = np.lexsort((np.arange(n), -keys.astype(np.int64)))[:npools]
        kept = keys[np.sort(order)]
    return chain + issue + _atomics(passes), kept


def _merge_cycles(cand: np.ndarray, npools: int) -> int:
    """dsa_pick_merge's block over n candidates (8 warps): 4 passes from L2 (8 loads in flight a thread), then two
    ballot passes over each warp's run (8 in flight)."""
    n = cand.size
    passes, _ = _select(cand, npools)
    per_pass = -(-(-(-n // 256)) // 8) * LAT_L2 + 4 * BAR + SCAN
    steps = -(-n // 256)
    number = 2 * -(-steps // 8) * LAT_L2 + 2 * BAR + 8 * LAT_SH + LAT_L2
    issue = (4 * (n // 32) * 8 + 8 * steps * 2 * 14) // SCHED
    return 4 * per_pass + number + issue + _atomics(passes)


def after_us(s: np.ndarray, npools: int, rows: int) -> tuple[float, int]:
    keys, v = _keys(s), s.size
    parts = [_part_cycles(keys[lo:lo + PART], npools) for lo in range(0, v, PART)]
    waves = -(-rows * len(parts) // (SMS * (REGS // (80 * 256))))
    pick = max(waves * max(c for c, _ in parts) / CLOCK, rows * v * 4 / HBM) * 1e6 + LAUNCH_US
    if len(parts) == 1:
        return pick, 1
    cand = np.concatenate([k for _, k in parts])
    merge = -(-rows // (SMS * (REGS // (40 * 256)))) * _merge_cycles(cand, npools) / CLOCK * 1e6 + LAUNCH_US
    return pick + merge, 2


def _blocks(v: int) -> str:
    n = -(-v // PART)
    return f"{n} block{'s' if n > 1 else ''}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 131072, 1048576], help="window (tokens)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16], help="decode rows a call")
    ap.add_argument("--npools", type=int, default=512, help="pools picked (glm-5.3-flash: 2048 / 4)")
    ap.add_argument("--kpool", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    print(f"estimate: H200 {SMS} SMs at {CLOCK / 1e9:.2f} GHz, HBM {HBM / 1e12:.1f} TB/s; latencies HBM {LAT_HBM}, "
          f"L2 {LAT_L2}, shared/shuffle {LAT_SH}, barrier {BAR} cycles; {LAUNCH_US:.0f} us a launch")
    for tokens in a.tokens:
        v = tokens // a.kpool
        s = rng.standard_normal(v).astype(np.float32)
        for rows in a.rows:
            b, nb = before_us(s, a.npools, rows)
            f, nf = after_us(s, a.npools, rows)
            print(f"window {tokens:>9,} tokens ({v:>7,} pools), {rows:>2} rows: before {b:9.1f} us ({nb} launch), "
                  f"after {f:7.1f} us ({nf} launch{'es' if nf > 1 else ''}, {_blocks(v)} a row); "
                  f"{b / f:5.1f}x a DSA layer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
