"""The sorted path of the sampling kernel (cuda_src/sample_sort.cuh) on the emulator, at small vocabularies.

* rows the tile cannot take (top_k between 2048 and V) and flat rows it cannot decide run the sorted path:
  every token equals NumpyOps.sample under forward, reverse and shuffled thread orders, with exact ties and
  values one ulp apart at the top of the order, -0/+0 and -inf entries;
* its S and q[n' - 1] (exact block scans, sample_scan.cuh) are bit-identical to the reference's np.cumsum, and
  the early exit stops a peaked row's sums long before n;
* a radix pass whose digit is the same in every key is skipped;
* each planted control (an unstable scatter, the lowest digit's pass skipped, the exit bound missing the rest
  of a chunk) changes tokens.
"""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import exp_f32
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.kernels import ops_sample
from cupyglm.kernels.ops import Kernels
from test_sample_tile import _ref_s_q

REF = NumpyOps()
KS = {o: Kernels("sim", np, order=o) for o in ("forward", "reverse", "shuffled")}
K = KS["forward"]
F = np.float32

#        temperature, top_k, top_p, min_p
SPECS = [(1.0, 3000, 1.0, 0.0), (0.8, 2500, 0.9, 0.0), (1.0, 4999, 1.0, 0.02), (1.2, 2049, 0.95, 0.0),
         (1.0, 4000, 1.0, 0.0), (0.9, 3500, 0.99, 0.01), (1.0, 2100, 1.0, 0.0), (1.1, 4321, 0.8, 0.0)]


def _rows(rng, v, specs, scale=0.5, lift=6.0):
    """Gaussian rows with a top group `lift` above the maximum: 48 values one ulp apart in a
    shuffled order, then 16 exact ties; -0/+0 and -inf entries."""
    r = len(specs)
    x = (rng.standard_normal((r, v)) * scale).astype(F)
    for i in range(r):
        ids = rng.permutation(v)
        base = F(x[i].max() + lift)
        x[i, ids[:48]] = base + rng.permutation(48).astype(F) * np.spacing(base)
        x[i, ids[48:64]] = base + F(48) * np.spacing(base)
        x[i, ids[-6:-3]] = F(0.0)
        x[i, ids[-3:]] = F(-0.0)
        x[i, ids[-8:-6]] = -np.inf
    cols = [np.array([s[j] for s in specs], dt) for j, dt in enumerate((F, np.int32, F, F))]
    return (x, *cols, rng.integers(0, 2**64, r, dtype=np.uint64), rng.integers(0, 100_000, r).astype(np.int32))


@pytest.mark.parametrize("v", [3001, 5000])
def test_sorted_rows_equal_numpy_in_every_order(v):
    rng = np.random.default_rng(v)
    specs = [(t, min(k, v - 1), tp, mp) for t, k, tp, mp in SPECS]
    args = _rows(rng, v, specs)
    want = REF.sample(*args)
    for o, k in KS.items():
        assert np.array_equal(ops_sample.sample(k, *args), want), o
    st = ops_sample.sample_stats(K, *args)
    assert st["fell_back"].tolist() == [1] * len(specs) and (st["sort_passes"] >= 1).all()
    for i, (t, k, tp, mp) in enumerate(specs):
        S, q = _ref_s_q(args[0][i], t, k, tp, mp)
        assert st["S"][i] == S and st["q"][i] == q, (i, st["S"][i], S, st["q"][i], q)


def test_flat_rows_fall_back_and_peaked_ones_stop_early():
    rng = np.random.default_rng(3)
    flat = [(1.0, 0, 1.0, 0.0), (1.0, 0, 0.9, 0.0), (2.0, 0, 1.0, 0.05)]
    args = _rows(rng, 20001, flat, scale=0.5, lift=0.0)
    st = ops_sample.sample_stats(K, *args)
    assert st["fell_back"].tolist() == [1, 1, 1]
    assert np.array_equal(ops_sample.sample(K, *args), REF.sample(*args))
    peaked = [(1.0, 3000, 1.0, 0.0), (1.0, 4000, 0.9, 0.0)]
    args = _rows(rng, 5000, peaked, lift=20.0)
    st = ops_sample.sample_stats(K, *args)
    # the exit is checked at each window's start: past the top group's last binade crossing, one window more
    assert (st["sort_s_visits"] < 64 + 1024 + 1).all() and (st["sort_q_visits"] < 64 + 1024 + 1).all(), st
    assert (st["sort_windows"] < 24).all(), st["sort_windows"]
    for i, (t, k, tp, mp) in enumerate(peaked):
        assert (st["S"][i], st["q"][i]) == _ref_s_q(args[0][i], t, k, tp, mp)
    assert np.array_equal(ops_sample.sample(K, *args), REF.sample(*args))


def test_a_pass_with_one_digit_everywhere_is_skipped():
    """Values in [1, 2) share their top value byte: that pass changes nothing and is skipped."""
    rng = np.random.default_rng(4)
    x = rng.uniform(1.0, 2.0, (2, 5000)).astype(F)
    args = (x, np.ones(2, F), np.full(2, 3000, np.int32), np.ones(2, F), np.zeros(2, F),
            np.array([5, 6], np.uint64), np.array([7, 8], np.int32))
    st = ops_sample.sample_stats(K, *args)
    assert (st["sort_passes"] < 4).all() and (st["sort_passes"] >= 1).all(), st["sort_passes"]
    assert np.array_equal(ops_sample.sample(K, *args), REF.sample(*args))


@pytest.mark.parametrize("define,lift", [("SAMPLE_CTL_SORT_UNSTABLE", 6.0), ("SAMPLE_CTL_SORT_SKIP_LOW", 6.0),
                                         ("SAMPLE_CTL_SORT_EXIT_EARLY", 20.0)])
def test_planted_sort_controls_change_tokens(define, lift):
    rng = np.random.default_rng(6)
    args = _rows(rng, 5000, SPECS, lift=lift)
    want = REF.sample(*args)
    assert np.array_equal(ops_sample.sample(K, *args), want)
    assert not np.array_equal(ops_sample.sample(K.variant(define), *args), want)


def _halfway_logits() -> np.ndarray:
    """Logits d (s0 = 0) whose e = exp_f32(d) is an odd multiple of 2^-11: half an ulp of a sum in [8192, 16384)."""
    found = []
    for j in range(40, 700):
        t = np.float64(2 * j + 1) * 2.0 ** -11
        d0 = F(np.log(t))
        c = (d0 + np.arange(-8, 9, dtype=F) * np.spacing(d0)).astype(F)
        hit = c[exp_f32(c) == F(t)]
        found.extend(hit[:1].tolist())
    return np.array(found, F)


def test_half_way_terms_round_by_the_running_parity():
    """9,000 ties at the top (S = 9000, ulp 2^-10), then 2,000 terms each exactly half an ulp off the grid: every
    one rounds to the even neighbour of the running sum, so S depends on the parity chain (a half-up sum differs)."""
    d = _halfway_logits()
    assert d.size >= 20
    rng = np.random.default_rng(12)
    v = 12000
    x = np.full((2, v), F(-40.0))
    for i in range(2):
        ids = rng.permutation(v)
        x[i, ids[:9000]] = F(0.0)
        x[i, ids[9000:11000]] = rng.choice(d, 2000)
    args = (x, np.ones(2, F), np.full(2, 11000, np.int32), np.ones(2, F), np.zeros(2, F),
            np.array([1, 2], np.uint64), np.array([3, 4], np.int32))
    st = ops_sample.sample_stats(K, *args)
    for i in range(2):
        S, q = _ref_s_q(x[i], 1.0, 11000, 1.0, 0.0)
        e = np.sort(exp_f32(x[i][x[i] > F(-1.0)]).astype(np.float64))[::-1]
        up = sum(np.floor(e[9000:] / 2.0 ** -10 + 0.5)) * 2.0 ** -10 + 9000.0   # ties always up
        assert up != S                                    # the row does exercise the parity
        assert st["S"][i] == S and st["q"][i] == q, (st["S"][i], S, st["q"][i], q)
    assert np.array_equal(ops_sample.sample(K, *args), REF.sample(*args))
    bad = ops_sample.sample_stats(K.variant("SAMPLE_CTL_SCAN_HALF_UP"), *args)
    assert (bad["S"] != st["S"]).all()
