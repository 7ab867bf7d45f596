"""backend/tc_quant.py: the quantised decode order's exactness claims and hand cases."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import bf16
from cupyglm.backend.qweight import E2M1, E4M3, QWeight, quantize_fp8, quantize_nvfp4
from cupyglm.backend.tc_order import _PERM, tc_rows
from cupyglm.backend.tc_quant import E4M3_TC, block_perm, nvfp4_bf16, quant_rows


def test_nvfp4_products_exact_in_bf16():
    """Every (e2m1 value, e4m3 scale) pair: the product is a bf16 value (the kernel folds the scale in bf16)."""
    p = E2M1[:, None] * E4M3_TC[None, :]
    assert np.isfinite(p).all() and np.array_equal(bf16(p).astype(np.float32), p)
    assert np.abs(p[p != 0]).min() == 2.0 ** -10 and np.abs(p).max() == 6 * 480


def test_e4m3_exact_in_bf16():
    """The kernel's e4m3 -> bf16 (bits placed as value x 2^-120, times 2^120): every finite code exact."""
    codes = np.arange(256, dtype=np.uint32)
    bits = (codes << 4) + (codes & 0x80) * 240
    placed = (bits << 16).astype(np.uint32).view(np.float32)
    assert np.array_equal(placed.astype(np.float64) * 2.0 ** 120, E4M3_TC.astype(np.float64))
    assert np.array_equal(bf16(E4M3_TC).astype(np.float32), E4M3_TC)
    assert np.array_equal(np.isnan(E4M3), np.abs(E4M3_TC) == 480)


def test_block_perm_one_is_bf16_order():
    assert np.array_equal(block_perm(1), _PERM)
    for c in (1, 2, 4):
        assert sorted(block_perm(c).tolist()) == list(range(32 * c))


def _nvfp4(rng, n, k):
    v, s, s2 = quantize_nvfp4(rng.standard_normal((n, k)).astype(np.float32))
    return QWeight("nvfp4", (n, k), v, s, s2.reshape(1))


def _fp8(rng, n, k, block):
    v, s = quantize_fp8(rng.standard_normal((n, k)).astype(np.float32), block)
    return QWeight("fp8", (n, k), v, s, None, block)


def test_nvfp4_is_scaled_bf16_rows_at_one_load_per_32():
    """A slice's k of one 128-block per lane: with c = 4 the order differs from bf16's, yet a unit tensor scale
    and K of one whole slice give the tensor-core sum of the exact bf16 weights (close to IEEE)."""
    rng = np.random.default_rng(1)
    q = _nvfp4(rng, 24, 1040)
    x = bf16(rng.standard_normal((3, 1040)))
    y = quant_rows(x, q)
    ref = x.astype(np.float64) @ np.asarray(q, dtype=np.float64).T
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-3)
    one = QWeight("nvfp4", q.shape, q.values, q.scale, np.ones(1, np.float32))
    np.testing.assert_array_equal(quant_rows(x, one) * q.scale2[0], y)


def test_nvfp4_short_k_is_tc_rows():
    """K = 16: one group, close to the bf16 order's sum of the same exact weights."""
    rng = np.random.default_rng(2)
    q = _nvfp4(rng, 16, 16)
    x = bf16(rng.standard_normal((2, 16)))
    wb = nvfp4_bf16(q)
    np.testing.assert_allclose(quant_rows(x, q), tc_rows(x, wb) * q.scale2[0], rtol=1e-6)


@pytest.mark.parametrize("block", [(128, 128), (32, 32), (16, 64), (32, 96)])     # 96: a slice starts mid-block
def test_fp8_blocks_scaled_in_order(block):
    rng = np.random.default_rng(3)
    q = _fp8(rng, 40, 1100, block)
    x = bf16(rng.standard_normal((5, 1100)))
    y = quant_rows(x, q)
    np.testing.assert_allclose(y, x.astype(np.float64) @ np.asarray(q, dtype=np.float64).T, rtol=1e-4, atol=1e-3)
    # by hand: one slice's chains, scaled per block, summed in k order
    bn, bk = block
    wb = bf16(E4M3_TC[q.values])
    want = None
    for k0 in range(0, 1100, 512):
        s = None
        for a in sorted({k0, *range(-(-k0 // bk) * bk, min(1100, k0 + 512), bk)}):
            b = min(1100, k0 + 512, (a // bk + 1) * bk)
            part = (tc_rows(x[:, a:b], wb[:, a:b]) * q.scale[np.arange(40) // bn, a // bk]).astype(np.float32)
            s = part if s is None else (s + part).astype(np.float32)
        want = s if want is None else (want + s).astype(np.float32)
    np.testing.assert_array_equal(y, want)


def test_fp8_odd_block_refused():
    rng = np.random.default_rng(4)
    q = _fp8(rng, 8, 64, (8, 16))
    with pytest.raises(ValueError, match="multiple of 32"):
        quant_rows(bf16(np.ones((1, 64))), q)


def test_rows_independent():
    rng = np.random.default_rng(5)
    q = _nvfp4(rng, 8, 256)
    x = bf16(rng.standard_normal((4, 256)))
    y = quant_rows(x, q)
    for r in range(4):
        np.testing.assert_array_equal(quant_rows(x[r:r + 1], q)[0], y[r])
