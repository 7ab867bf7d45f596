"""The tensor-core model (cupyglm/backend/tensor_core.py) on hand-worked cases from the published model's
description (alignment cut, extra bits, cancellation, round toward zero, subnormals, the accumulator's exponent,
inf/NaN), and against a slow exact-fraction restatement of the same rules on random and adversarial inputs."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from cupyglm.backend import tensor_core as tc
from cupyglm.backend.lanes import bf16

SM90, SM80 = tc.MODELS["sm_90"], tc.MODELS["sm_80"]


def one(products, c=0.0, model=SM90):
    """dot16 of 16 (a, b) pairs given as a list of (a, b) floats (padded with zeros) and c."""
    pairs = list(products) + [(0.0, 0.0)] * (16 - len(products))
    a = bf16(np.array([p[0] for p in pairs], np.float32))
    b = bf16(np.array([p[1] for p in pairs], np.float32))
    assert np.array_equal(a.astype(np.float64), [p[0] for p in pairs]), "inputs must be bf16 values"
    return float(tc.dot16(a, b, np.float32(c), model))


E = 2.0 ** -23                       # fp32 ulp at 1


def test_each_term_is_cut_to_the_alignment_unit():
    # 15 terms of 1.5 * 2^-25 next to 1: each is cut to 2^-25 (2 extra bits below fp32's 23), so the sum is
    # 1 + 15 * 2^-25 = 1 + 3.75 ulp, truncated to 1 + 3 ulp (exact sum: 1 + 5.625 ulp)
    assert one([(1.0, 1.0)] + [(1.5 * 2 ** -13, 2.0 ** -12)] * 15) == 1 + 3 * E


def test_two_extra_bits_and_no_more():
    assert one([(1.0, 1.0)] + [(2.0 ** -13, 2.0 ** -12)] * 15) == 1 + 3 * E      # 2^-25 survives
    assert one([(1.0, 1.0)] + [(2.0 ** -13, 2.0 ** -13)] * 15) == 1.0            # 2^-26 is cut away


def test_a_product_of_significand_two_or_more_keeps_the_unit_of_its_exponents():
    # 1.5 * 1.5 = 2.25 has exponents 0 + 0: the unit stays 2^-25, so fifteen 2^-25 terms add 1.875 ulp(2)
    assert one([(1.5, 1.5)] + [(2.0 ** -13, 2.0 ** -12)] * 15) == 2.25 + 2.0 ** -22


def test_cancellation_loses_what_was_cut():
    assert one([(1.0, 1.0), (-1.0, 1.0), (2.0 ** -15, 2.0 ** -15)]) == 0.0      # exact: 2^-30
    assert one([(1.0, 1.0), (2.0 ** -15, 2.0 ** -15)], c=-1.0) == 0.0
    assert math.copysign(1, one([(1.0, 1.0), (-1.0, 1.0)])) == 1.0              # an exact zero is +0


def test_round_toward_zero_both_signs():
    assert one([(1.0, 1.0), (1.5, 2.0 ** -23)]) == 1 + E                         # 1 + 1.5 ulp; RN would give 2
    assert one([(-1.0, 1.0), (-1.5, 2.0 ** -23)]) == -(1 + E)


def test_the_accumulator_exponent_sets_the_unit():
    # c = 2^24: unit 2^-1, each 0.75 is cut to 0.5; the same products with c = 0 add exactly to 12
    assert one([(0.75, 1.0)] * 16, c=2.0 ** 24) == 2.0 ** 24 + 8
    assert one([(0.75, 1.0)] * 16) == 12.0
    # c far below the products is cut away entirely
    assert one([(1.0, 1.0)], c=2.0 ** -30) == 1.0


def test_subnormals_are_kept():
    assert one([(2.0 ** -130, 1.0)]) == 2.0 ** -130                 # a bf16 subnormal times one
    assert one([], c=2.0 ** -140) == 2.0 ** -140                    # an fp32 subnormal accumulator
    assert one([(2.0 ** -126, 1.5 * 2 ** -23)]) == 2.0 ** -149      # 1.5 * 2^-149 truncated (RN: 2^-148)
    assert one([(2.0 ** -126, 0.75 * 2 ** -23)]) == 0.0


def test_inf_and_nan():
    nan_bits = np.float32(one([(np.inf, 0.0)])).view(np.uint32)
    assert nan_bits == 0x7FFFFFFF
    assert one([(np.inf, 1.0), (1.0, 1.0)]) == np.inf
    assert one([(np.inf, -1.0)], c=1.0) == -np.inf
    assert math.isnan(one([(np.inf, 1.0), (-np.inf, 1.0)]))
    assert math.isnan(one([(1.0, 1.0)], c=float("nan")))
    assert one([(1.0, 1.0)], c=np.inf) == np.inf
    assert math.isnan(one([(-np.inf, 1.0)], c=np.inf))
    assert one([(2.0 ** 127, 2.0)] * 2) == np.inf                  # 2^129 overflows


def test_sm80_is_two_chained_blocks_of_eight():
    rng = np.random.default_rng(3)
    a = bf16(rng.standard_normal((64, 16)).astype(np.float32) * np.exp2(rng.integers(-8, 8, (64, 16))))
    b = bf16(rng.standard_normal((64, 16)).astype(np.float32))
    c = rng.standard_normal(64).astype(np.float32)
    half = tc.block_fma(a[:, :8], b[:, :8], c, SM80)
    want = tc.block_fma(a[:, 8:], b[:, 8:], half, SM80)
    assert np.array_equal(tc.dot16(a, b, c, SM80).view(np.uint32), want.view(np.uint32))
    assert not np.array_equal(tc.dot16(a, b, c, SM80), tc.dot16(a, b, c, SM90))


# ---- a slow restatement of the rules in exact fractions ----------------------------------------------------

def _exp(x: float) -> int:
    return max(math.frexp(abs(x))[1] - 1, -126)


def _slow(a, b, c: float, model) -> float:
    acc = c
    for k0 in range(0, 16, model.group):
        terms, tops = [], []
        for x, y in zip(a[k0:k0 + model.group], b[k0:k0 + model.group]):
            if x * y != 0:
                terms.append(Fraction(x) * Fraction(y))
                tops.append(_exp(x) + _exp(y))
        if acc != 0:
            terms.append(Fraction(acc))
            tops.append(_exp(acc))
        if not terms:
            acc = 0.0
            continue
        unit = Fraction(2) ** (max(tops) - 23 - model.extra_bits)
        s = sum((t / unit).__trunc__() * unit for t in terms)
        acc = _rz32(s)
    return acc


def _rz32(s: Fraction) -> float:
    if s == 0:
        return 0.0
    m = abs(s)
    e = math.floor(math.log2(m))
    while Fraction(2) ** e > m:
        e -= 1
    while Fraction(2) ** (e + 1) <= m:
        e += 1
    ulp = Fraction(2) ** (max(e, -126) - 23)
    v = (m / ulp).__trunc__() * ulp
    out = math.inf if v >= 2 ** 128 else float(v)
    return out if s > 0 else -out


@pytest.mark.parametrize("model", [SM90, SM80], ids=lambda m: m.arch)
def test_matches_exact_fractions_on_random_and_adversarial_inputs(model):
    rng = np.random.default_rng(11)
    n = 300
    scale = np.exp2(rng.integers(-20, 20, (n, 16))).astype(np.float32)
    a = bf16(rng.standard_normal((n, 16)).astype(np.float32) * scale)
    b = bf16(rng.standard_normal((n, 16)).astype(np.float32))
    b[: n // 3] = bf16(-(a[: n // 3].astype(np.float32)) * np.float32(1.0))             # cancellation
    b[: n // 3, 0] = bf16(np.float32(1.0))
    a[n // 3: n // 2] = bf16(np.exp2(rng.integers(-133, -120, (n // 2 - n // 3, 16))).astype(np.float32))
    c = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    c[::7] = 0
    got = tc.dot16(a, b, c, model)
    for i in range(n):
        want = _slow([float(x) for x in a[i].astype(np.float64)], [float(x) for x in b[i].astype(np.float64)],
                     float(c[i]), model)
        assert got[i] == np.float32(want), (i, got[i], want)


def test_tile_and_chain_shapes_and_order():
    rng = np.random.default_rng(5)
    A = bf16(rng.standard_normal((16, 48)).astype(np.float32))
    B = bf16(rng.standard_normal((48, 8)).astype(np.float32))
    D = tc.mma_chain(A, B)
    step = np.zeros((16, 8), np.float32)
    for k0 in range(0, 48, 16):
        step = tc.mma_m16n8k16(A[:, k0:k0 + 16], B[k0:k0 + 16], step)
    assert np.array_equal(D.view(np.uint32), step.view(np.uint32))
    # a row's bits do not depend on the other rows in the call
    assert np.array_equal(tc.mma_chain(A[3:4], B).view(np.uint32), D[3:4].view(np.uint32))
    with pytest.raises(ValueError, match="multiple of 16"):
        tc.mma_chain(A[:, :40], B[:40])
    with pytest.raises(ValueError, match="no model"):
        tc.mma_chain(A, B, arch="sm_75")
