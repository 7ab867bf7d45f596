"""The candidate-tile path of the sampling kernel (cuda_src/sample_tile.cuh) on the emulator.

* the stop rule (a sum stops at index i once acc + B == acc, B >= every later term) gives the sequential
  float32 sum exactly, half-ulp ties included, where "stop once the next term is at most half an ulp" does not;
* the order-free tail (terms rounded at acc's ulp, summed as integers) is exact when no term is half-way and
  the binade holds, and refuses otherwise; in the kernel a binade change is followed exactly;
* in the kernel: peaked rows are decided by the tile with S and q[n' - 1] bit-identical to the reference's
  np.cumsum, top_k rows never fall back, flat rows fall back to the sorted path (sample_sort.cuh) with S and q[n' - 1]
  bit-identical too, and every token equals
  NumpyOps.sample; the planted early exit changes S.
"""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import exp_f32
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.kernels import ops_sample
from cupyglm.kernels.ops import Kernels

REF = NumpyOps()
K = Kernels("sim", np)
F = np.float32


def _stop_sum(e: np.ndarray, skip: int = 0) -> tuple[np.float32, int]:
    """The kernel's S loop: suffix-max bound b, stop at i when S + b[i + 1 + skip] == S -> (S, terms added)."""
    b = np.maximum.accumulate(np.append(e, F(0))[::-1])[::-1].astype(F)
    s = F(0)
    for i in range(e.shape[0]):
        s = F(s + e[i])
        if F(s + b[min(i + 1 + skip, e.shape[0])]) == s:
            return s, i + 1
    return s, e.shape[0]


def _naive_sum(e: np.ndarray) -> np.float32:
    """A wrong rule: stop once the next term is at most half an ulp of S (ignores round-half-to-even)."""
    s = F(0)
    for i in range(e.shape[0]):
        s = F(s + e[i])
        if i + 1 < e.shape[0] and e[i + 1] <= np.spacing(s) / F(2):
            break
    return s


def _seq(e) -> np.float32:
    return np.cumsum(np.asarray(e, F), dtype=F)[-1]


def test_stop_rule_is_exact_at_half_ulp_ties():
    h = F(2.0 ** -24)                                    # half an ulp of 1 (the ulp above 1 is 2**-23)
    even = np.array([1.0, h, h, h, 0.0], F)              # 1 + h ties to 1 (even): S never moves
    odd = np.array([1.0, 2 * h, h, h, h / 2], F)         # 1 + 2**-23 is odd: + h rounds up to 1 + 2**-22
    for e in (even, odd):
        s, used = _stop_sum(e)
        assert s == _seq(e), (e, s, _seq(e))
    assert _stop_sum(even)[1] == 1                       # stopped right after the first term
    assert _seq(odd) == F(1 + 2.0 ** -22)
    assert _naive_sum(odd) != _seq(odd)                  # the tie needs the hardware's rounding, not a size test
    assert _stop_sum(odd, skip=1)[0] != _seq(odd)         # one term too soon: the rule's bound must see e[i + 1]


def test_stop_rule_on_random_non_increasing_and_jittered_terms():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(2, 400))
        e = np.sort(exp_f32(-np.abs(rng.standard_normal(n) * rng.uniform(1, 30)).astype(F)))[::-1].astype(F)
        if trial % 2:                                    # exp_f32 need not be monotonic: jitter by an ulp
            e = np.nextafter(e, F(np.inf) * rng.choice([-1, 1], n).astype(F)).astype(F)
        s, used = _stop_sum(e)
        assert s == _seq(e) and used <= n


def _tail(acc: np.float32, ys: np.ndarray):
    """The kernel's order-free tail: acc + ulp * sum(rint(y / ulp)) or None when it must give up."""
    ulp = np.spacing(acc)
    m = (ys / ulp).astype(F)
    if np.any(m - np.floor(m) == F(0.5)) or np.any(m >= F(2.0 ** 24)):
        return None
    total = int(acc / ulp) + int(np.rint(m).astype(np.int64).sum())
    return None if total >= 2**24 else F(total * ulp)


def test_order_free_tail_equals_every_sequential_order():
    rng = np.random.default_rng(1)
    decided = 0
    for trial in range(300):
        acc = F(rng.uniform(1, 60))
        ys = (exp_f32(-rng.uniform(8, 25, int(rng.integers(1, 300))).astype(F))).astype(F)
        got = _tail(acc, ys)
        if got is None:
            continue
        decided += 1
        for _ in range(3):
            assert got == _seq(np.concatenate([[acc], rng.permutation(ys)]))
    assert decided > 200
    # a half-way term is refused (its rounding needs the parity of the sum before it)
    assert _tail(F(1.0), np.array([2.0 ** -24], F)) is None


def _rows(rng, v, sigma, specs):
    r = len(specs)
    x = (rng.standard_normal((r, v)) * sigma).astype(F)
    return (x, np.array([s[0] for s in specs], F), np.array([s[1] for s in specs], np.int32),
            np.array([s[2] for s in specs], F), np.array([s[3] for s in specs], F),
            rng.integers(0, 2**64, r, dtype=np.uint64), rng.integers(0, 100_000, r).astype(np.int32))


def _ref_s_q(x, t, k, tp, mp):
    """S and q[n' - 1] of cupyglm.backend.numpy_sample.draw, step for step."""
    xs = (x / F(t)).astype(F)
    order = np.lexsort((np.arange(x.shape[0]), -xs))
    if 0 < k < x.shape[0]:
        order = order[:k]
    s = xs[order]
    e = exp_f32(s - s[0])
    S = np.cumsum(e, dtype=F)[-1]
    p = (e / S).astype(F)
    keep = p.shape[0]
    if tp < 1:
        keep = min(keep, 1 + int(np.count_nonzero(np.cumsum(p, dtype=F)[:-1] < F(tp))))
    if mp > 0:
        keep = min(keep, max(1, int(np.count_nonzero(p[:keep] >= F(mp) * p[0]))))
    return S, np.cumsum(p[:keep], dtype=F)[-1]


def test_peaked_rows_are_decided_by_the_tile_bit_exact():
    rng = np.random.default_rng(7)
    specs = [(0.7, 0, 0.9, 0.0), (0.7, 0, 0.95, 0.02), (0.7, 0, 0.9, 0.05), (1.0, 0, 0.9, 0.0)]
    args = _rows(rng, 154880, 4.0, specs)
    st = ops_sample.sample_stats(K, *args)
    assert st["fell_back"].tolist() == [0] * len(specs), st
    assert (st["tails"] & 1).sum() > 0                    # S needed the order-free tail somewhere
    for i, (t, k, tp, mp) in enumerate(specs):
        S, q = _ref_s_q(args[0][i], t, k, tp, mp)
        assert st["S"][i] == S and st["q"][i] == q, (i, st["S"][i], S, st["q"][i], q)
    assert np.array_equal(ops_sample.sample(K, *args), REF.sample(*args))


def test_a_tail_that_leaves_its_binade_is_followed_exactly():
    """top_p = 1 on peaked rows: q's tile part ends below 1 and the whole sum at or above it, so the tail
    finds the crossing term by a weighted select and starts over at the new ulp."""
    rng = np.random.default_rng(5)
    specs = [(0.7, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 0, 1.0, 0.0)]
    args = _rows(rng, 154880, 4.0, specs)
    st = ops_sample.sample_stats(K, *args)
    assert st["fell_back"].tolist() == [0, 0, 0] and ((st["tails"] & 2) > 0).all()
    for i, (t, k, tp, mp) in enumerate(specs):
        S, q = _ref_s_q(args[0][i], t, k, tp, mp)
        assert st["S"][i] == S and st["q"][i] == q
        assert st["q"][i] >= 1.0                          # the binade [0.5, 1) was left
    assert np.array_equal(ops_sample.sample(K, *args), REF.sample(*args))


def test_top_k_rows_stop_early_and_never_fall_back():
    rng = np.random.default_rng(8)
    specs = [(1.0, 50, 1.0, 0.0), (0.7, 2048, 0.9, 0.0), (1.0, 20, 0.9, 0.05), (1.3, 1, 1.0, 0.0)]
    args = _rows(rng, 20001, 6.0, specs)
    st = ops_sample.sample_stats(K, *args)
    assert st["fell_back"].tolist() == [0] * 4 and st["tails"].tolist() == [0] * 4
    assert st["s_visits"][1] < 2048                       # the sum stopped inside the tile
    for i, (t, k, tp, mp) in enumerate(specs):
        S, q = _ref_s_q(args[0][i], t, k, tp, mp)
        assert st["S"][i] == S and st["q"][i] == q
    assert np.array_equal(ops_sample.sample(K, *args), REF.sample(*args))


def test_flat_rows_fall_back_to_the_sorted_path():
    rng = np.random.default_rng(9)
    specs = [(1.0, 0, 1.0, 0.0), (1.0, 0, 0.9, 0.0), (2.0, 0, 1.0, 0.0)]
    args = _rows(rng, 20001, 0.5, specs)
    st = ops_sample.sample_stats(K, *args)
    assert st["fell_back"].tolist() == [1, 1, 1] and (st["why"] > 0).all()
    for i, (t, k, tp, mp) in enumerate(specs):
        S, q = _ref_s_q(args[0][i], t, k, tp, mp)
        assert st["S"][i] == S and st["q"][i] == q
    assert np.array_equal(ops_sample.sample(K, *args), REF.sample(*args))


@pytest.mark.parametrize("define", ["SAMPLE_CTL_EXIT_EARLY"])
def test_planted_early_exit_changes_s(define):
    """Top id, a second one ln 2 below it (e = 0.5), the rest 40 below: stopping one term early drops e[1]."""
    rng = np.random.default_rng(10)
    x = (rng.standard_normal((2, 3001)) - 40.0).astype(F)
    x[:, 5], x[:, 9] = F(10.0), F(10.0) - F(0.6931471)
    args = (x, np.ones(2, F), np.zeros(2, np.int32), np.ones(2, F), np.zeros(2, F),
            np.array([1, 2], np.uint64), np.array([3, 4], np.int32))
    good = ops_sample.sample_stats(K, *args)
    bad = ops_sample.sample_stats(K.variant(define), *args)
    want = [_ref_s_q(x[i], 1.0, 0, 1.0, 0.0)[0] for i in range(2)]
    assert good["S"].tolist() == want and good["s_visits"].tolist() == [2, 2] and want[0] > 1.49
    assert bad["S"].tolist() == [1.0, 1.0]
