"""Contract cases of cuda_src/sample.cu (op sample: one token per row; reference NumpyOps.sample, i.e.
cupyglm.backend.numpy_sample.draw on every row). Token ids must be identical (integer output: 0 ULPs).

Inputs plant exact ties: greedy rows share their maximum among three ids (the lowest must win); sampled rows
hold tie groups across the top-k cut and at the top, -0.0 next to +0.0, and some -inf entries (what the
engine's min_tokens bans leave). Batches of decode (1, 4, 8 rows) and verify (16 rows) sizes, vocabularies of
512 (the tiny model) and 1000 (odd: the sort pads to 1024).

The candidate-tile path (cuda_src/sample_tile.cuh) decides most sampled rows; its cases: the full
vocabulary and odd large ones (20,001, 154,880) with peaked rows the tile decides (top_p 1: the q tail
leaves its binade) and flat rows that fall back to the sorted path, top_k at the tile (2048, 2049) with a tie group across the cut, a peaked row whose
second id carries a third of the mass (a sum that stops one term early drops it), a NaN row among sampled ones.
The sorted path (cuda_src/sample_sort.cuh: a stable radix sort of all V keys) takes top_k between 2048 and V and
the flat rows; its cases put 48 values one ulp apart (shuffled) and 16 exact ties at the top of the order.

Controls: ties broken to the higher id (the kernel run on the reversed vocabulary, ids mapped back); the RNG
keyed by the row's index in the batch instead of its position; every cumulative sum taken right to left (the
kernel compiled with -DSAMPLE_CTL_REVERSED_SUMS); the tile's select breaking ties to the higher id
(-DSAMPLE_CTL_SELECT_TIES_HIGH); a sum stopping one term too soon (-DSAMPLE_CTL_EXIT_EARLY); the fallback
disabled, an undecided row keeping the tile's partial answer (-DSAMPLE_CTL_NO_FALLBACK); the sorted path's
scatter taking each segment last to first, so equal values go to the higher id first (-DSAMPLE_CTL_SORT_UNSTABLE);
its lowest digit's pass skipped, a sort pass out of order (-DSAMPLE_CTL_SORT_SKIP_LOW); its exit bound leaving
out the rest of the current chunk (-DSAMPLE_CTL_SORT_EXIT_EARLY); its block scans resuming one term late after
a binade change (-DSAMPLE_CTL_SCAN_RESUME_LATE).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_sample

REF = NumpyOps()
KEYS = ("logits", "temperature", "top_k", "top_p", "min_p", "seed", "position")

GREEDY = (0.0, 0, 1.0, 0.0)                 # (temperature, top_k, top_p, min_p)


def _make(v: int, rows: list[tuple], scale: float = 2.0):
    def make(rng):
        r = len(rows)
        x = (rng.standard_normal((r, v)) * scale).astype(np.float32)
        for i, (t, k, _, _) in enumerate(rows):
            ids = rng.permutation(v)
            if t == 0.0:                                   # greedy: a three-way tie at the maximum
                x[i, ids[:3]] = x[i].max() + np.float32(1.0)
                continue
            order = np.lexsort((np.arange(v), -x[i]))
            cut = k if 0 < k < v else 8
            lo, hi = max(cut - 2, 0), min(cut + 2, v)     # a tie group across the top-k cut
            x[i, order[lo:hi]] = x[i, order[cut - 1]]
            x[i, order[1:3]] = x[i, order[0]]             # and one at the top
            x[i, ids[-6:-3]] = np.float32(0.0)
            x[i, ids[-3:]] = np.float32(-0.0)
            x[i, ids[-8:-6]] = -np.inf
        return {
            "logits": x,
            "temperature": np.array([p[0] for p in rows], np.float32),
            "top_k": np.array([p[1] for p in rows], np.int32),
            "top_p": np.array([p[2] for p in rows], np.float32),
            "min_p": np.array([p[3] for p in rows], np.float32),
            "seed": rng.integers(0, 2**64, r, dtype=np.uint64),
            "position": rng.integers(0, 200_000, r).astype(np.int32),
        }
    return make


def _run(k, d):
    return {"tokens": ops_sample.sample(k, *(d[n] for n in KEYS))}


def _replay(d):
    return {"tokens": REF.sample(*(d[n] for n in KEYS))}


def _ctl_ties_high(k, d):
    """Ties to the higher id: the kernel on the reversed vocabulary, ids mapped back."""
    xp = k.xp
    v = d["logits"].shape[1]
    args = [xp.ascontiguousarray(d["logits"][:, ::-1])] + [d[n] for n in KEYS[1:]]
    return {"tokens": (v - 1 - ops_sample.sample(k, *args)).astype(np.int32)}


def _ctl_rng_row(k, d):
    """The RNG keyed by the row's index in the batch instead of the token's position."""
    r = d["logits"].shape[0]
    args = [d[n] for n in KEYS[:-1]] + [k.xp.arange(r, dtype=np.int32)]
    return {"tokens": ops_sample.sample(k, *args)}


def _ctl_reversed_sums(k, d):
    """Every cumulative sum (S, top-p's c, the draw's q) right to left."""
    return {"tokens": ops_sample.sample(k.variant("SAMPLE_CTL_REVERSED_SUMS"), *(d[n] for n in KEYS))}


def _variant(define: str):
    def ctl(k, d):
        return {"tokens": ops_sample.sample(k.variant(define), *(d[n] for n in KEYS))}
    ctl.__doc__ = f"The kernel compiled with -D{define}."
    return ctl


CONTROLS = {"ties_high": _ctl_ties_high, "rng_row": _ctl_rng_row, "reversed_sums": _ctl_reversed_sums,
            "select_ties_high": _variant("SAMPLE_CTL_SELECT_TIES_HIGH"),
            "exit_early": _variant("SAMPLE_CTL_EXIT_EARLY"), "no_fallback": _variant("SAMPLE_CTL_NO_FALLBACK"),
            "sort_unstable": _variant("SAMPLE_CTL_SORT_UNSTABLE"),
            "sort_skip_low": _variant("SAMPLE_CTL_SORT_SKIP_LOW"),
            "sort_exit_early": _variant("SAMPLE_CTL_SORT_EXIT_EARLY"),
            "scan_resume_late": _variant("SAMPLE_CTL_SCAN_RESUME_LATE")}


def _params(rows: list[tuple], rng) -> dict:
    r = len(rows)
    return {"temperature": np.array([p[0] for p in rows], np.float32),
            "top_k": np.array([p[1] for p in rows], np.int32),
            "top_p": np.array([p[2] for p in rows], np.float32),
            "min_p": np.array([p[3] for p in rows], np.float32),
            "seed": rng.integers(0, 2**64, r, dtype=np.uint64),
            "position": rng.integers(0, 200_000, r).astype(np.int32)}


def _make_spread(v: int, rows: list[tuple], scales: list[float], nan_row: int = -1):
    """Gaussian rows of the given spreads (peaked: the tile decides; flat: the sorted path), -0/+0 and -inf
    entries, a tie group at the top; row nan_row holds one NaN."""
    def make(rng):
        x = np.stack([(rng.standard_normal(v) * s).astype(np.float32) for s in scales])
        for i in range(len(rows)):
            ids = rng.permutation(v)
            x[i, ids[:3]] = x[i].max()
            x[i, ids[-6:-3]] = np.float32(0.0)
            x[i, ids[-3:]] = np.float32(-0.0)
            x[i, ids[-8:-6]] = -np.inf
        if nan_row >= 0:
            x[nan_row, rng.integers(v)] = np.nan
        return {"logits": x, **_params(rows, rng)}
    return make


def _make_cut(v: int, rows: list[tuple]):
    """A tie group across each row's top-k cut (the tile's select must take the lower ids); for k < 8 the
    group starts at the top, so the ids at the cut carry most of the mass."""
    def make(rng):
        x = (rng.standard_normal((len(rows), v)) * 0.5).astype(np.float32)
        for i, (_, k, _, _) in enumerate(rows):
            order = np.lexsort((np.arange(v), -x[i]))
            lo = k - 4 if k >= 8 else 0
            x[i, order[lo:k + 4]] = x[i, order[lo]] + (np.float32(3.0) if lo == 0 else np.float32(0.0))
        return {"logits": x, **_params(rows, rng)}
    return make


def _make_second(v: int, rows: list[tuple]):
    """Peaked rows: the top id, a second one exp(-ln 2) below it (a third of the mass), the rest 40 below."""
    def make(rng):
        x = (rng.standard_normal((len(rows), v)) - 40.0).astype(np.float32)
        for i in range(len(rows)):
            a, b = rng.choice(v, 2, replace=False)
            x[i, a], x[i, b] = np.float32(10.0), np.float32(10.0) - np.float32(0.6931471)
        return {"logits": x, **_params(rows, rng)}
    return make


def _make_sorted(v: int, rows: list[tuple], lift: float):
    """Rows for the sorted path: Gaussian (spread 0.5) with a top group `lift` above the maximum, 48 values one
    ulp apart in a shuffled order, then 16 exact ties; -0/+0 and -inf entries."""
    def make(rng):
        x = (rng.standard_normal((len(rows), v)) * 0.5).astype(np.float32)
        for i in range(len(rows)):
            ids = rng.permutation(v)
            base = np.float32(x[i].max() + np.float32(lift))
            x[i, ids[:48]] = base + rng.permutation(48).astype(np.float32) * np.spacing(base)
            x[i, ids[48:64]] = base + np.float32(48) * np.spacing(base)
            x[i, ids[-6:-3]] = np.float32(0.0)
            x[i, ids[-3:]] = np.float32(-0.0)
            x[i, ids[-8:-6]] = -np.inf
        return {"logits": x, **_params(rows, rng)}
    return make


def _custom(label: str, make, control: str) -> None:
    case(Case(f"sample[{label}]", ("sample_rows",), make, _run, _replay, CONTROLS[control]))


def _sample(label: str, v: int, rows: list[tuple], control: str) -> None:
    case(Case(f"sample[{label}]", ("sample_rows",), _make(v, rows), _run, _replay, CONTROLS[control]))


_TEMPS = [(t, 0, 1.0, 0.0) for t in (0.7, 1.0, 1.3, 2.0)]
_TOPK = [(t, k, 1.0, 0.0) for t, k in zip((1.0, 0.8, 1.2, 1.0, 0.9, 1.5, 1.0, 1.1) * 2,
                                          (1, 2, 5, 20, 50, 999, 1000, 5000, 3, 7, 100, 400, 10, 30, 64, 128))]
_TOPP = [(1.0, 0, p, 0.0) for p in (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)]
_MINP = [(1.0, 0, 1.0, m) for m in (0.001, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)]
_MIXED = [GREEDY, (0.7, 0, 0.9, 0.0), (1.0, 20, 1.0, 0.0), (0.7, 0, 1.0, 0.1),
          GREEDY, (1.2, 0, 1.0, 0.0), (0.9, 50, 0.95, 0.02), (1.0, 0, 1.0, 0.0),
          (1.5, 20, 0.8, 0.05), GREEDY, (0.6, 5, 1.0, 0.0), (1.0, 0, 0.5, 0.0),
          (2.0, 0, 0.99, 0.001), (0.8, 1, 1.0, 0.0), GREEDY, (1.1, 200, 0.9, 0.01)]

#        label                       V     rows                      control
_sample("greedy,decode1,v512",       512,  [GREEDY],                 "ties_high")
_sample("greedy,verify16,v1000",     1000, [GREEDY] * 16,            "ties_high")
_sample("temperature,decode4,v512",  512,  _TEMPS,                   "rng_row")
_sample("top_k,verify16,v1000",      1000, _TOPK,                    "reversed_sums")
_sample("top_p,decode8,v1000",       1000, _TOPP,                    "reversed_sums")
_sample("min_p,decode8,v512",        512,  _MINP,                    "rng_row")
_sample("mixed,decode4,v512",        512,  _MIXED[:4],               "reversed_sums")
_sample("mixed,verify16,v1000",      1000, _MIXED,                   "ties_high")
_sample("mixed,verify16,v512",       512,  _MIXED[::-1],             "rng_row")

_PEAK = [(0.7, 0, 0.9, 0.0), (1.0, 0, 0.95, 0.02), (0.8, 50, 1.0, 0.0), (1.0, 0, 1.0, 0.05)]
_FLAT = [(1.0, 0, 1.0, 0.0), (1.3, 0, 0.99, 0.0), (1.0, 0, 1.0, 0.0), (2.0, 0, 1.0, 0.0)]
_SECOND = [(1.0, 0, 1.0, 0.0)] * 8 + [(1.0, 0, 0.9, 0.0)] * 4 + [(0.9, 20, 1.0, 0.0)] * 4
_CUT = [(1.0, k, 1.0, 0.0) for k in (2048, 2049, 2047, 50, 3, 2, 5, 1)] * 2

_custom("tile,peaked,v154880", _make_spread(154880, _PEAK, [4.0, 4.0, 2.0, 3.0]), "rng_row")
_custom("tile,crossing,v154880", _make_spread(154880, [(0.7, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0)] * 2,
                                             [4.0, 4.0, 5.0, 4.5]), "rng_row")
_custom("fallback,flat,v20001", _make_spread(20001, _FLAT, [0.5, 1.0, 2.0, 0.3]), "no_fallback")
_custom("fallback,nan,v154880", _make_spread(154880, _FLAT[:3], [1.0, 4.0, 2.0], nan_row=1), "no_fallback")
_custom("top_k_cut,v5000", _make_cut(5000, _CUT), "select_ties_high")
_custom("second,decode16,v3001", _make_second(3001, _SECOND), "exit_early")

_SORTED = [(1.0, 3000, 1.0, 0.0), (0.8, 2500, 0.9, 0.0), (1.0, 4999, 1.0, 0.02), (1.2, 2049, 0.95, 0.0),
           (1.0, 0, 1.0, 0.0), (0.9, 4000, 0.99, 0.01), GREEDY, (1.1, 4321, 0.8, 0.0)]
_custom("sorted,ties,v5000", _make_sorted(5000, _SORTED, 6.0), "sort_unstable")
_custom("sorted,near_ties,v5000", _make_sorted(5000, _SORTED[::-1], 6.0), "sort_skip_low")
_custom("sorted,peaked,v3001", _make_sorted(3001, [(t, min(k, 3000), tp, mp) for t, k, tp, mp in _SORTED], 20.0),
        "sort_exit_early")
_custom("sorted,flat,v3001", _make_sorted(3001, [(t, min(k, 3000), tp, mp) for t, k, tp, mp in _SORTED], 0.0),
        "scan_resume_late")
