"""The vectorised tensor-core model (backend/tensor_core.py over backend/tc_block.py) equals its int64 statement
(tests/tc_oracle.py) bit for bit, both architectures: k-chains and single blocks on random and adversarial
inputs (cancellation, wide exponent spread, the fast path's range edges, subnormals, inf/NaN, all-zero, overflow
inside a chain, the largest block sums), with tiles small enough that every input set spans several."""
from __future__ import annotations

import numpy as np
import pytest
import tc_oracle

from cupyglm.backend import tensor_core as tc
from cupyglm.backend.lanes import bf16
from cupyglm.contract.cases_mma import adversarial

ARCHS = ("sm_90", "sm_80")
M, N, K = 12, 20, 64


def _norm(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _pow2(rng, lo, hi, shape):
    return np.exp2(rng.integers(lo, hi, shape)).astype(np.float32) * rng.choice([-1, 1], shape).astype(np.float32)


def _sig(rng, *shape):
    """Significands in [1, 2) of random sign: bf16 values that stay finite beside any bf16 exponent."""
    return (rng.uniform(1, 2, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


def _specials(rng, x, rate):
    x = x.copy()
    pick = rng.random(x.shape) < rate
    x[pick] = rng.choice(np.array([np.inf, -np.inf, np.nan, 0.0], np.float32), int(pick.sum()))
    return x


def _sets(rng):
    """name -> (a [M,K] f32, b [K,N] f32, c [M,N] f32), a and b rounded to bf16 by the caller."""
    s = {"random": (_norm(rng, M, K), _norm(rng, K, N), _norm(rng, M, N))}
    a, b, c = adversarial(rng, M, N, K)
    s["cancellation"] = (a.astype(np.float32), b.astype(np.float32), c)
    s["spread"] = (_norm(rng, M, K) * _pow2(rng, -60, 60, (M, K)), _norm(rng, K, N), _norm(rng, M, N) * 2 ** 40)
    s["extremes"] = (_sig(rng, M, K) * _pow2(rng, -133, 127, (M, K)), _sig(rng, K, N) * _pow2(rng, -133, 0, (K, N)),
                     _sig(rng, M, N) * _pow2(rng, -149, 100, (M, N)))
    # X near the fast path's edges (-101 and 125): products at 2^-105..2^-97 and 2^121..2^129, c beside them
    s["low edge"] = (_norm(rng, M, K) * _pow2(rng, -53, -48, (M, K)), _norm(rng, K, N) * _pow2(rng, -53, -48, (K, N)),
                     _norm(rng, M, N) * 2.0 ** -100)
    s["high edge"] = (_norm(rng, M, K) * _pow2(rng, 57, 63, (M, K)), _norm(rng, K, N) * _pow2(rng, 57, 63, (K, N)),
                      _norm(rng, M, N) * 2.0 ** 122)
    s["overflow in fast blocks"] = (np.abs(_sig(rng, M, K)) * 2.0 ** 62, np.abs(_sig(rng, K, N)) * 2.0 ** 61,
                                    np.zeros((M, N), np.float32))
    s["subnormal"] = (_pow2(rng, -133, -118, (M, K)), _norm(rng, K, N),
                      _norm(rng, M, N) * np.float32(2.0 ** -135))
    s["subnormal out"] = (_pow2(rng, -133, -126, (M, K)), _norm(rng, K, N) * 2.0 ** -10, np.zeros((M, N), np.float32))
    s["inf nan"] = (_specials(rng, _norm(rng, M, K), 0.01), _specials(rng, _norm(rng, K, N), 0.01),
                    _specials(rng, _norm(rng, M, N), 0.02))
    s["zero"] = (np.zeros((M, K), np.float32), _norm(rng, K, N), np.zeros((M, N), np.float32))
    zero_rows = _norm(rng, M, K)
    zero_rows[::2] = 0
    s["zero rows"] = (zero_rows, np.where(rng.random((K, N)) < 0.5, 0, _norm(rng, K, N)), np.zeros((M, N), np.float32))
    s["subnormal c"] = (zero_rows, _norm(rng, K, N), _norm(rng, M, N) * np.float32(2.0 ** -140))
    s["overflow"] = (_norm(rng, M, K) * 2.0 ** 64, np.abs(_norm(rng, K, N)) * 2.0 ** 63, _norm(rng, M, N))
    # the largest block sums: 16 products 1.9921875^2 * 2^X of one sign beside c just under 2^(X + 1)
    sign = np.where(np.arange(M) % 2, -1, 1).astype(np.float32)[:, None]
    big = np.full((M, K), 1.9921875 * 2.0 ** 10, np.float32) * sign
    s["largest sums"] = (big, np.full((K, N), 1.9921875, np.float32), np.full((M, N), 2.0 ** 11 * 0.99999994,
                                                                              np.float32) * sign)
    ta = rng.choice(np.array([1.0, 2.0 ** -12, -(2.0 ** -12), 1.5 * 2.0 ** -12], np.float32), (M, K))
    tb = rng.choice(np.array([1.0, 2.0 ** -12, 2.0 ** -13], np.float32), (K, N))
    s["ties"] = (ta, tb, np.ones((M, N), np.float32))
    return s


def _same(got, want):
    assert got.shape == want.shape and got.dtype == np.float32
    bad = got.view(np.uint32) != want.view(np.uint32)
    return int(bad.sum())


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(tc, "TILE", 48)
    monkeypatch.setattr(tc, "TILE_ROWS", 5)


@pytest.mark.parametrize("arch", ARCHS)
def test_chains_equal_the_oracle(arch, small_tiles):
    rng = np.random.default_rng(7)
    for name, (a, b, c) in _sets(rng).items():
        a, b = bf16(a), bf16(b)
        for cc in (c, None):
            got, want = tc.mma_chain(a, b, cc, arch=arch), tc_oracle.mma_chain(a, b, cc, arch=arch)
            assert _same(got, want) == 0, (name, cc is None)


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_rows_in_one_call(arch, small_tiles):
    # every kind of row beside the others: a tile's fast blocks, general blocks and special elements together
    rng = np.random.default_rng(8)
    sets = list(_sets(rng).values())
    a = np.concatenate([s[0][:2] for s in sets])
    c = np.concatenate([s[2][:2] for s in sets])
    b = sets[0][1]
    for got_b in (b, sets[1][1], sets[7][1]):
        got = tc.mma_chain(bf16(a), bf16(got_b), c, arch=arch)
        want = tc_oracle.mma_chain(bf16(a), bf16(got_b), c, arch=arch)
        assert _same(got, want) == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_blocks_and_tiles_equal_the_oracle(arch):
    rng = np.random.default_rng(9)
    model = tc.MODELS[arch]
    for name, (a, b, c) in _sets(rng).items():
        a16, b16 = bf16(a[:, :16]), bf16(b[:16].T)          # [M, 16], [N, 16]: M x N pairs of rows
        pa, pb, pc = a16[:, None, :], b16[None, :, :], c[:, :N]
        assert _same(tc.dot16(pa, pb, pc, model), tc_oracle.dot16(pa, pb, pc, model)) == 0, name
        g = model.group
        got = tc.block_fma(pa[..., :g], pb[..., :g], pc, model)
        assert _same(got, tc_oracle.block_fma(pa[..., :g], pb[..., :g], pc, model)) == 0, name
        tile_a, tile_b, tile_c = bf16(np.resize(a, (16, 16))), bf16(b[:16, :8]), np.resize(c, (16, 8))
        got = tc.mma_m16n8k16(tile_a, tile_b, tile_c, arch=arch)
        assert _same(got, tc_oracle.mma_m16n8k16(tile_a, tile_b, tile_c, arch=arch)) == 0, name


def test_scalar_and_empty_shapes():
    model = tc.MODELS["sm_90"]
    a = bf16(np.arange(16, dtype=np.float32))
    got, want = tc.dot16(a, a, np.float32(0.5), model), tc_oracle.dot16(a, a, np.float32(0.5), model)
    assert got.shape == () and _same(np.asarray(got), np.asarray(want)) == 0
    assert tc.mma_chain(bf16(np.zeros((0, 32), np.float32)), bf16(np.zeros((32, 8), np.float32))).shape == (0, 8)
    assert np.array_equal(tc.mma_chain(bf16(np.zeros((3, 0), np.float32)), bf16(np.zeros((0, 2), np.float32)),
                                       np.ones((3, 2), np.float32)), np.ones((3, 2), np.float32))
