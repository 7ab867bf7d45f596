"""The grouped expert GEMM on the tensor core (cuda_src/gemm_tc.cu's gemm_tc_grouped) on the CPU emulator: row m's
bits are gemm_tc(x[m:m+1], w[group[m]])'s and the decode path's grouped GEMV's, whatever order the rows come in;
the launcher refuses ids outside [0, E), and the kernel itself gives such a row NaN without reading past w."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import bf16
from cupyglm.kernels import ops_gemm, ops_gemm_tc
from cupyglm.kernels.ops import Kernels, i32

from bits import bf, bits

K = Kernels("sim", np)


@pytest.mark.parametrize("out", ["f32", "bf16"])
@pytest.mark.parametrize("m,e,n,k", [(37, 4, 70, 600), (20, 3, 33, 1100), (5, 6, 9, 100)])
def test_every_row_equals_its_experts_dense_call_and_the_decode_rows(m, e, n, k, out):
    rng = np.random.default_rng(m + k)
    x, w = bf(rng, (m, k)), bf(rng, (e, n, k), k ** -0.5)
    group = rng.integers(0, e, m).astype(np.int32)
    y = ops_gemm_tc.gemm_tc_grouped(K, x, w, group, out=out)
    for r in range(m):
        assert np.array_equal(bits(y[r]), bits(ops_gemm_tc.gemm_tc(K, x[r:r + 1], w[group[r]], out=out)[0])), r
    assert np.array_equal(bits(y), bits(ops_gemm.gemm_grouped(K, x, w, group, out=out, decode=m)))


def test_row_order_changes_no_bit():
    rng = np.random.default_rng(3)
    m, e, n, k = 48, 5, 40, 300
    x, w = bf(rng, (m, k)), bf(rng, (e, n, k), k ** -0.5)
    group = rng.integers(0, e, m).astype(np.int32)
    order = np.argsort(group, kind="stable")
    y = ops_gemm_tc.gemm_tc_grouped(K, x, w, group)
    ys = ops_gemm_tc.gemm_tc_grouped(K, np.ascontiguousarray(x[order]), w, np.ascontiguousarray(group[order]))
    assert np.array_equal(bits(ys), bits(y[order]))


def test_launcher_refuses_ids_out_of_range_and_bad_shapes():
    x, w = bf16(np.zeros((3, 8), np.float32)), bf16(np.zeros((2, 4, 8), np.float32))
    with pytest.raises(ValueError, match=r"expert ids outside \[0, 2\)"):
        ops_gemm_tc.gemm_tc_grouped(K, x, w, np.array([0, 2, 1], np.int32))
    with pytest.raises(ValueError, match="parameter group"):
        ops_gemm_tc.gemm_tc_grouped(K, x, w, np.array([0, 1], np.int32))
    with pytest.raises(ValueError, match="parameter w"):
        ops_gemm_tc.gemm_tc_grouped(K, x, w[:, :, :4], np.array([0, 1, 1], np.int32))


def test_kernel_gives_a_bad_id_nan_without_reading_out_of_bounds():
    """Launched directly (past the launcher's check): ids -1 and E read nothing (the emulator's guard pages would
    report a read past w) and their rows are NaN; the other rows keep their bits."""
    rng = np.random.default_rng(8)
    m, e, n, k = 6, 2, 10, 64
    x, w = bf(rng, (m, k)), bf(rng, (e, n, k), k ** -0.5)
    group = np.array([0, -1, 1, 2, 1, 0], np.int32)
    y = np.zeros((m, n), np.float32)
    K.launch("gemm_tc.cu", "gemm_tc_grouped", ops_gemm_tc.grid(m, n), ops_gemm_tc.DENSE_THREADS,
             (x, w, group, y, i32(m), i32(n), i32(k), i32(e)), shared_mem=ops_gemm_tc.DENSE_SHARED)
    bad = np.array([False, True, False, True, False, False])
    assert np.isnan(y[bad]).all()
    ok = ~bad
    want = ops_gemm_tc.gemm_tc_grouped(K, x[ok], w, group[ok])
    assert np.array_equal(bits(y[ok]), bits(want))


def test_empty_k_is_zero_and_empty_rows_are_empty():
    x, w = bf16(np.zeros((3, 0), np.float32)), bf16(np.zeros((2, 5, 0), np.float32))
    g = np.array([1, 0, 1], np.int32)
    assert np.array_equal(bits(ops_gemm_tc.gemm_tc_grouped(K, x, w, g)), np.zeros((3, 5), np.uint32))
    assert np.array_equal(bits(ops_gemm_tc.gemm_tc_grouped(K, x, w, g, out="bf16")), np.zeros((3, 5), np.uint16))
    x0 = bf16(np.zeros((0, 8), np.float32))
    assert ops_gemm_tc.gemm_tc_grouped(K, x0, bf16(np.ones((2, 4, 8), np.float32)), g[:0]).shape == (0, 4)
