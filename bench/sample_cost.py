"""What the sampling kernel (cuda_src/sample.cu) does per sampled row at the full vocabulary, on the emulator:
the tile path's counters (ids the sequential part visits, radix-select passes, exact tail passes, how often a
row falls back to the sorted path) and the sorted path's (radix passes, ids its sums visit), against a full
bitonic sort's work (the kernel's fallback before the sorted path), for Gaussian logits of a few spreads.

    python bench/sample_cost.py [--rows 8] [--v 154880] [--time]

Operation counts (element visits): full sort = the bitonic network's compare-exchanges (Vp/2 per stage,
log2(Vp)(log2(Vp)+1)/2 stages) + its sequential sums over the kept ids (S over n, c up to the top-p cut, the
min-p count over keep, q twice); tile path = (select passes + 1 gather + tail passes) x V parallel visits +
the tile sort's compare-exchanges + the sequential visits it counted, plus the sorted path's cost on the rows
that fall back: the keys (V), per radix pass a count (V + 256 x 1024 zeroed counters) and, unless skipped, a scan
(2 x 256 x 1024) and a scatter (V), then e, chunk maxima, p and the min-p count (n each), its exact block
scans of S, c and q (1024 slots a window; SCAN_STEPS steps of the critical path each), the top-p and draw
searches over the prefixes they kept. The critical path counts the same work as steps of
one thread of the 1024: parallel visits divided over the block (one step per stage of a sort, a segment of
ceil(V / 1024) keys per thread and pass), the sequential sums whole. Every token is checked against
NumpyOps.sample. --time also times the kernel on sim against the sorted path alone (-DSAMPLE_FULL_SORT).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend import numpy_sample as sampling
from cupyglm.kernels import ops_sample
from cupyglm.kernels.ops import Kernels

TILE = 2048                     # SAMPLE_TILE in cuda_src/sample.cu


THREADS = ops_sample.THREADS
BINS = ops_sample.BINS
DIGIT_PASSES = 4                # 8-bit digits of the keys' 32 value bits
CHUNK = 256                     # the sorted path's bound chunk at V <= 2048 x 256 (SMP_CHUNKS in sample_sort.cuh)
SCAN_STEPS = 24                 # one scan window: 2 x 5 warp compose steps, 5 over the warps, 4 barriers, the cut


def _bitonic(vp: int) -> int:
    lg = vp.bit_length() - 1
    return (vp // 2) * lg * (lg + 1) // 2


def _bitonic_steps(vp: int) -> int:
    """Stages of the network x compare-exchanges per thread and stage."""
    lg = vp.bit_length() - 1
    return -(-(vp // 2) // THREADS) * lg * (lg + 1) // 2


def _full_seq(x, t, k, tp, mp) -> int:
    """The full sort's sequential visits for one row (S, c, the min-p count, q twice), from the reference."""
    v = x.shape[0]
    n = k if 0 < k < v else v
    s = np.sort((x / np.float32(t)).astype(np.float32))[::-1][:n]
    e = sampling.exp_f32(s - s[0])
    p = (e / np.cumsum(e, dtype=np.float32)[-1]).astype(np.float32)
    keep, visits = n, n
    if tp < 1:
        c = np.cumsum(p[:-1], dtype=np.float32)
        miss = np.nonzero(~(c < np.float32(tp)))[0]
        visits += int(miss[0]) + 1 if miss.size else n - 1
        keep = min(keep, 1 + int(np.count_nonzero(c < np.float32(tp))))
    if mp > 0:
        visits += keep
        keep = min(keep, max(1, int(np.count_nonzero(p[:keep] >= np.float32(mp) * p[0]))))
    return visits + 2 * keep


def _sorted(st, v, n):
    """The sorted path's (ops, critical path) per row from its counters (numpy arrays over the rows)."""
    run, win = st["sort_passes"], st["sort_windows"]
    seg = -(-v // THREADS)
    ops = (v + DIGIT_PASSES * (v + BINS * THREADS) + run * (2 * BINS * THREADS + v) + 4 * n + win * THREADS
           + st["sort_c_visits"].clip(0) + st["sort_q_visits"])
    per_n = -(-n // THREADS)
    nc = -(-n // CHUNK)
    cp = (seg + DIGIT_PASSES * (seg + BINS) + run * (2 * BINS + 10 + seg) + 3 * per_n + CHUNK
          + nc.bit_length() + win * SCAN_STEPS + -(-st["sort_c_visits"].clip(0) // THREADS)
          + -(-st["sort_q_visits"] // THREADS))
    return ops, cp


def _rows(rng, r, v, sigma, t, k, tp, mp):
    return ((rng.standard_normal((r, v)) * sigma).astype(np.float32), np.full(r, t, np.float32),
            np.full(r, k, np.int32), np.full(r, tp, np.float32), np.full(r, mp, np.float32),
            rng.integers(0, 2**64, r, dtype=np.uint64), rng.integers(0, 100_000, r).astype(np.int32))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--v", type=int, default=154880)
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--time-only", action="store_true", help="only the sim timings")
    a = ap.parse_args()
    k = Kernels("sim", np)
    ref = NumpyOps()
    v, vp = a.v, 1 << max(0, (a.v - 1).bit_length())   # the bitonic baseline's width
    mp2 = 1 << max(0, (min(v, TILE) - 1).bit_length())
    configs = [(sg, t, kk, tp, 0.0) for sg in (2.0, 3.0, 4.0) for t in (0.7, 1.0) for kk in (0, 50)
               for tp in (0.9, 1.0)] + [(3.0, 1.0, 0, 1.0, 0.05), (3.0, 0.7, 0, 0.95, 0.02)]
    rng = np.random.default_rng(15)
    tot_old = tot_new = cp_tot_old = cp_tot_new = 0
    fell_all = rows_all = 0
    for sg, t, kk, tp, mp in ([] if a.time_only else configs):
        args = _rows(rng, a.rows, v, sg, t, kk, tp, mp)
        got = ops_sample.sample(k, *args)
        want = ref.sample(*args)
        if not np.array_equal(got, want):
            raise SystemExit(f"MISMATCH sigma {sg} t {t} top_k {kk} top_p {tp}: {got} != {want}")
        st = ops_sample.sample_stats(k, *args)
        seq = st["s_visits"] + st["c_visits"] + st["min_p_visits"] + st["q_visits"]
        tails = st["tail_passes"]
        fell = st["fell_back"].astype(bool)
        why = np.bitwise_or.reduce(st["why"])
        m = min(kk if 0 < kk < v else v, TILE)
        mp_t = 1 << max(0, (m - 1).bit_length())
        old = np.array([_bitonic(vp) + _full_seq(args[0][i], t, kk, tp, mp) for i in range(a.rows)])
        n = kk if 0 < kk < v else v
        s_ops, s_cp = _sorted(st, v, n)
        tiled = n <= TILE or n == v                  # the rows the tile path runs on
        new = (np.where(tiled, (st["select_passes"] + 1 + tails) * v + _bitonic(mp_t) + seq, 0)
               + np.where(fell, s_ops, 0))
        seq_old = old - _bitonic(vp)
        per = -(-v // THREADS)
        cp_old = _bitonic_steps(vp) + 2 * per + seq_old
        cp_new = (np.where(tiled, (st["select_passes"] + 1 + tails) * per + _bitonic_steps(mp_t) + (m + 1).bit_length()
                           + seq, 0) + np.where(fell, s_cp, 0))
        swin = np.where(fell, st["sort_windows"], 0)
        cp_tot_old += int(cp_old.sum())
        cp_tot_new += int(cp_new.sum())
        tot_old += int(old.sum())
        tot_new += int(new.sum())
        fell_all += int(fell.sum())
        rows_all += a.rows
        print(f"SUMMARY sample_cost sigma {sg} t {t} top_k {kk} top_p {tp} min_p {mp}: "
              f"sequential visits mean {seq.mean():.0f} max {seq.max()} (full sort {np.mean(old - _bitonic(vp)):.0f}), "
              f"select passes {st['select_passes'].mean():.1f}, tail passes {tails.mean():.2f}, "
              f"fallback {int(fell.sum())}/{a.rows} (why {why}; its scans' windows mean "
              f"{swin.sum() / max(1, int(fell.sum())):.0f}, radix passes {st['sort_passes'].max()}), "
              f"ops/row {new.mean():,.0f} vs {old.mean():,.0f} "
              f"({old.mean() / new.mean():.1f}x), critical path {cp_new.mean():,.0f} vs {cp_old.mean():,.0f} "
              f"({cp_old.mean() / cp_new.mean():.1f}x), tokens = numpy", flush=True)
    if rows_all:
        print(f"SUMMARY sample_cost all: V {v}, {rows_all} rows, fallback {fell_all}/{rows_all}, "
              f"ops {tot_new:,} vs full sort {tot_old:,} ({tot_old / tot_new:.1f}x), critical path {cp_tot_new:,} vs "
              f"{cp_tot_old:,} ({cp_tot_old / cp_tot_new:.1f}x); tile sort {mp2} keys")
    if a.time or a.time_only:
        for sg, t, kk, tp in ((4.0, 0.7, 0, 0.9), (3.0, 1.0, 50, 1.0), (2.0, 1.0, 0, 1.0)):
            args = _rows(np.random.default_rng(1), 2, v, sg, t, kk, tp, 0.0)
            ms = {}
            for name, kern in (("tile", k), ("sorted", k.variant("SAMPLE_FULL_SORT"))):
                ops_sample.sample(kern, *args)
                t0 = time.perf_counter()
                ops_sample.sample(kern, *args)
                ms[name] = (time.perf_counter() - t0) / 2 * 1e3
            fell = int(ops_sample.sample_stats(k, *args)["fell_back"].sum())
            print(f"SUMMARY sample_cost sim time sigma {sg} t {t} top_k {kk} top_p {tp}: {ms['tile']:.0f} ms/row vs "
                  f"sorted path alone {ms['sorted']:.0f} ms/row ({ms['sorted'] / ms['tile']:.1f}x; fallback {fell}/2; "
                  f"V {v})", flush=True)


if __name__ == "__main__":
    main()
