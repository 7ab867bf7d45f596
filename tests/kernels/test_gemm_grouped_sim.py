"""The grouped expert GEMM's prompt rows (cuda_src/gemm_tc.cu gemm_tc_grouped) on the CPU emulator: equals the numpy
backend's gemm_grouped bit for bit (itself row m = tc_rows(x[m], w[group[m]])), under every thread order,
and a row's result does not depend on which other rows or experts share the call."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cupyglm.backend.lanes import BF16, bf16
from cupyglm.backend.tc_order import tc_rows
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.kernels import ops_gemm
from cupyglm.kernels.ops import Kernels

from bits import bf, bits

K = Kernels("sim", np)
REF = NumpyOps()


def _case(seed, m, e, n, k, used=None, sort=False):
    rng = np.random.default_rng(seed)
    used = e if used is None else used
    x, w = bf(rng, (m, k), 2.0), bf(rng, (e, n, k), k ** -0.5)
    group = rng.integers(0, used, m).astype(np.int32)
    if sort:
        group = np.sort(group)
    w[np.setdiff1d(np.arange(e), group)] = np.nan        # experts no row uses: NaN, must not be read
    return x, w, group


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
@pytest.mark.parametrize("m,e,n,k,used,sort", [
    (1, 8, 64, 256, 8, False),        # decode: one (token, slot) pair
    (16, 4, 96, 256, 4, True),        # 16 rows over 4 experts, sorted as the MoE sends them
    (100, 8, 40, 160, 5, False),      # 100 rows, experts 5..7 absent, unsorted
    (23, 6, 33, 100, 3, True),        # K % 32 = 4, N % 64 = 33
    (9, 3, 17, 1000, 3, False),       # long K: the order shows in the bits
])
def test_equals_numpy_reference(order, m, e, n, k, used, sort):
    x, w, group = _case(m * 1000 + k, m, e, n, k, used, sort)
    y = ops_gemm.gemm_grouped(Kernels("sim", np, order=order), x, w, group)
    want = REF.gemm_grouped(x, w, group)
    assert not np.isnan(want).any()
    assert np.array_equal(bits(y), bits(want))


def test_reference_is_per_row_gemm_and_sort_free():
    x, w, group = _case(1, 40, 5, 24, 130)
    want = np.concatenate([tc_rows(x[i:i + 1], w[group[i]]) for i in range(40)])
    got = REF.gemm_grouped(x, w, group)
    assert np.array_equal(bits(got), bits(want))
    perm = np.argsort(group, kind="stable")                   # the sorted fast path gives the same rows
    assert np.array_equal(bits(REF.gemm_grouped(x[perm], w, group[perm])), bits(want[perm]))


def test_long_k_wrong_order_variant_differs():
    x, w, group = _case(4, 12, 3, 20, 1000)
    y = ops_gemm.gemm_grouped(K, x, w, group)
    bad = ops_gemm.gemm_grouped(K.variant("CONTROL_TC_REVERSED"), x, w, group)
    assert not np.array_equal(bits(bad), bits(y))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 40), e=st.integers(1, 6), where=st.floats(0, 1), kk=st.sampled_from([100, 256]),
       seed=st.integers(0, 2**16))
def test_row_bits_do_not_depend_on_other_rows_or_experts(m, e, where, kk, seed):
    rng = np.random.default_rng(seed)
    w = bf(rng, (e, 24, kk), kk ** -0.5)
    ex = int(rng.integers(0, e))
    row = bf(rng, (1, kk), 2.0)
    solo = ops_gemm.gemm_grouped(K, row, w, np.array([ex], np.int32))
    assert np.array_equal(bits(solo), bits(tc_rows(row, w[ex])))
    batch = bf(rng, (m, kk), 2.0)
    group = rng.integers(0, e, m).astype(np.int32)
    at = min(int(where * m), m - 1)
    batch[at], group[at] = row[0], ex
    y = ops_gemm.gemm_grouped(K, batch, w, group)
    assert np.array_equal(bits(y[at]), bits(solo[0])), f"row {at} of {m} differs from the row alone"
    assert np.array_equal(bits(y), bits(REF.gemm_grouped(batch, w, group)))


def test_every_batch_size_and_neighbour_expert():
    """One row at position 0 of 1..24 rows, the others on every other expert: its bits never move."""
    rng = np.random.default_rng(9)
    w = bf(rng, (4, 40, 256), 1 / 16)
    big = bf(rng, (24, 256), 2.0)
    want = bits(tc_rows(big[:1], w[2]))[0]
    for m in range(1, 25):
        for other in range(4):
            group = np.full(m, other, np.int32)
            group[0] = 2
            y = ops_gemm.gemm_grouped(K, np.ascontiguousarray(big[:m]), w, group)
            assert np.array_equal(bits(y[0]), want), f"batch {m}, neighbours on expert {other}"


def test_wrong_calls_name_the_parameter():
    x, w, g = np.zeros((2, 8), BF16), np.zeros((3, 4, 8), BF16), np.zeros(2, np.int32)
    with pytest.raises(ValueError, match="x must be bfloat16"):
        ops_gemm.gemm_grouped(K, x.astype(np.float32), w, g)
    with pytest.raises(ValueError, match="parameter w must have shape"):
        ops_gemm.gemm_grouped(K, x, np.zeros((3, 4, 9), BF16), g)
    with pytest.raises(ValueError, match="parameter w must have shape"):
        ops_gemm.gemm_grouped(K, x, np.zeros((4, 8), BF16), g)
    with pytest.raises(ValueError, match="parameter group must be int32"):
        ops_gemm.gemm_grouped(K, x, w, g.astype(np.int64))
    with pytest.raises(ValueError, match="parameter group must have shape"):
        ops_gemm.gemm_grouped(K, x, w, np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        ops_gemm.gemm_grouped(K, np.zeros((8, 2), BF16).T, w, g)
    for bad in (3, -1):
        with pytest.raises(ValueError, match="parameter group holds expert ids outside"):
            ops_gemm.gemm_grouped(K, x, w, np.array([0, bad], np.int32))
        with pytest.raises(ValueError, match="group holds expert ids outside"):
            REF.gemm_grouped(x, w, np.array([0, bad], np.int32))


def test_empty_shapes():
    w = np.zeros((3, 4, 8), BF16)
    assert ops_gemm.gemm_grouped(K, np.zeros((0, 8), BF16), w, np.zeros(0, np.int32)).shape == (0, 4)
    y = ops_gemm.gemm_grouped(K, np.ones((2, 0), BF16), np.ones((3, 4, 0), BF16),
                              np.array([2, 0], np.int32))
    assert y.shape == (2, 4) and not y.any()
    assert REF.gemm_grouped(np.ones((2, 0), BF16), np.ones((3, 4, 0), BF16),
                            np.array([2, 0], np.int32)).shape == (2, 4)


def test_bf16_output_is_each_rows_sum_rounded_once():
    x, w, group = _case(6, 30, 4, 33, 100)
    y = ops_gemm.gemm_grouped(K, x, w, group, out="bf16")
    assert y.dtype == BF16
    assert np.array_equal(y.view(np.uint16), bf16(REF.gemm_grouped(x, w, group)).view(np.uint16))
    assert np.array_equal(y.view(np.uint16), REF.gemm_grouped(x, w, group, out="bf16").view(np.uint16))
