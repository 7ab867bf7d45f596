"""The prompt-row GEMM on the tensor core (cuda_src/gemm_tc.cu) on the CPU emulator: its bits are tc_order.tc_rows'
(the numpy reference of the decode order), a prompt row's bits are the decode GEMV's for the same row (fp32 and
bf16, plain and per head), a row's bits do not depend on the rows beside it, and the launcher refuses bad input."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import BF16, bf16
from cupyglm.backend.tc_order import tc_rows, tc_rows_batched
from cupyglm.kernels import ops_gemm, ops_gemm_tc
from cupyglm.kernels.ops import Kernels

from bits import bf, bits

K = Kernels("sim", np)


@pytest.mark.parametrize("m,n,k", [(1, 8, 32), (5, 70, 600), (32, 64, 512), (33, 65, 1100), (40, 130, 1040),
                                   (7, 9, 100), (66, 129, 8), (3, 5, 5), (65, 20, 1600), (140, 300, 1056)])
def test_sim_equals_tc_rowsbits(m, n, k):
    rng = np.random.default_rng(m * 1000 + k)
    x, w = bf(rng, (m, k), 2.0), bf(rng, (n, k), k ** -0.5)
    want = tc_rows(x, w)
    assert np.array_equal(bits(ops_gemm_tc.gemm_tc(K, x, w)), bits(want))
    assert np.array_equal(bits(ops_gemm_tc.gemm_tc(K, x, w, out="bf16")), bits(bf16(want)))


@pytest.mark.parametrize("out", ["f32", "bf16"])
@pytest.mark.parametrize("m,n,k", [(3, 40, 1100), (20, 33, 256), (9, 17, 4640)])
def test_prompt_row_equals_decode_rowbits(m, n, k, out):
    """The decode GEMV (gemv.cu, every row a decode row) and gemm_tc give every row the same bits."""
    rng = np.random.default_rng(k + m)
    x, w = bf(rng, (m, k)), bf(rng, (n, k), k ** -0.5)
    decode = ops_gemm.gemm(K, x, w, out=out, decode=m)
    assert np.array_equal(bits(ops_gemm_tc.gemm_tc(K, x, w, out=out)), bits(decode))


@pytest.mark.parametrize("out", ["f32", "bf16"])
@pytest.mark.parametrize("k", [100, 640])
def test_per_head_prompt_rows_equal_decode_rows_and_tc_rows_batched(out, k):
    rng = np.random.default_rng(5)
    h, m, n = 3, 9, 20
    x, w = bf(rng, (h, m, k)), bf(rng, (h, n, k), k ** -0.5)
    y = ops_gemm_tc.gemm_tc(K, x, w, out=out)
    want = tc_rows_batched(x, w)
    assert y.shape == (h, m, n)
    assert np.array_equal(bits(y), bits(bf16(want) if out == "bf16" else want))
    assert np.array_equal(bits(y), bits(ops_gemm.gemm_heads(K, x, w, out=out, decode=m)))


def test_row_bits_do_not_depend_on_the_rows_beside_it():
    rng = np.random.default_rng(9)
    k, n = 600, 70
    w = bf(rng, (n, k), k ** -0.5)
    row = bf(rng, (1, k), 2.0)
    solo = ops_gemm_tc.gemm_tc(K, row, w)
    for m, at in ((2, 1), (31, 17), (33, 32), (70, 40)):
        batch = bf(rng, (m, k), 2.0)
        batch[at] = row[0]
        y = ops_gemm_tc.gemm_tc(K, batch, w)
        assert np.array_equal(bits(y[at]), bits(solo[0])), f"row {at} of {m}"


def test_unaligned_x_takes_element_loads_with_the_samebits():
    """K % 8 == 0 but x 2 bytes off a 16-byte boundary: the kernel's element loads, the aligned call's bits."""
    rng = np.random.default_rng(13)
    m, n, k = 9, 70, 640
    x, w = bf(rng, (m, k)), bf(rng, (n, k), k ** -0.5)
    buf = np.empty(m * k + 8, dtype=x.dtype)
    off = next(i for i in range(8) if (buf[i:].ctypes.data % 16) == 2)
    xu = buf[off:off + m * k].reshape(m, k)
    xu[...] = x
    assert xu.ctypes.data % 16 and xu.flags.c_contiguous
    assert np.array_equal(bits(ops_gemm_tc.gemm_tc(K, xu, w)), bits(ops_gemm_tc.gemm_tc(K, x, w)))
    assert np.array_equal(bits(ops_gemm_tc.gemm_tc(K, xu, w)), bits(tc_rows(x, w)))


def test_empty_k_is_zero_and_empty_rows_are_empty():
    x, w = bf16(np.zeros((3, 0), np.float32)), bf16(np.zeros((5, 0), np.float32))
    assert np.array_equal(bits(ops_gemm_tc.gemm_tc(K, x, w)), np.zeros((3, 5), np.uint32))
    assert np.array_equal(bits(ops_gemm_tc.gemm_tc(K, x, w, out="bf16")), np.zeros((3, 5), np.uint16))
    assert ops_gemm_tc.gemm_tc(K, bf16(np.zeros((0, 8), np.float32)), bf16(np.ones((4, 8), np.float32))).shape == (0, 4)


@pytest.mark.parametrize("x,w,out,says", [
    (np.zeros((2, 8), np.float32), None, "f32", "parameter x must be bfloat16"),
    (None, np.zeros((4, 9)), "f32", "parameter w must"),
    (None, None, "fp16", "out must be one of"),
    (np.zeros(8), None, "f32", "must be [M, K] or [H, M, K]"),
])
def test_launcher_refuses_bad_input(x, w, out, says):
    x = bf16(np.zeros((2, 8), np.float32)) if x is None else x
    w = bf16(np.zeros((4, 8), np.float32)) if w is None else w
    with pytest.raises(ValueError) as e:
        ops_gemm_tc.gemm_tc(K, x, w, out=out)
    assert says in str(e.value)


def test_launcher_refuses_k_past_the_tiles_32_bit_offsets():
    x = np.zeros((1, ops_gemm_tc.MAX_K + 1), BF16)      # [1, MAX_K + 1] bf16
    with pytest.raises(ValueError, match="K="):
        ops_gemm_tc.gemm_tc(K, x, x)


def test_grid_puts_rows_on_x_and_refuses_more_column_blocks_than_grid_y_takes():
    assert ops_gemm_tc.grid(33, 65, 2, 32, 64) == (2, 2, 2)
    assert ops_gemm_tc.grid(129, 257, 1) == (2, 2, 1)
    with pytest.raises(ValueError, match="65,535"):
        ops_gemm_tc.grid(32, 65536 * 256)
