"""The quantised prompt-row GEMM on the tensor core (cuda_src/gemm_tc_q.cu) on the CPU emulator: a prompt row's bits
are the decode row's (the quantised GEMV, gemv_q.cu) for the same x and weight, dense and grouped, fp32 and bf16; a
row's bits do not depend on the rows beside it or their experts; unaligned x takes element loads with the same
bits; the launchers refuse bad input."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import bf16
from cupyglm.backend.qweight import QWeight, stack
from cupyglm.backend.tc_quant import quant_rows
from cupyglm.contract.cases_gemm_q import qweight
from cupyglm.kernels import ops_gemm, ops_gemm_tc_q
from cupyglm.kernels.ops import Kernels

K = Kernels("sim", np)
FMTS = ("fp8", "nvfp4")


def _x(rng, m, k):
    return bf16(rng.standard_normal((m, k)).astype(np.float32))


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype.itemsize == 2 else np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("out", ["f32", "bf16"])
@pytest.mark.parametrize("fmt", FMTS)
def test_prompt_rows_equal_decode_rows_bits(fmt, out):
    """Every row a decode row (gemv_q.cu) and every row a prompt row on the tensor core: the same bits."""
    rng = np.random.default_rng(3)
    m, n, k = 19, 40, 1040
    x, w = _x(rng, m, k), qweight(rng, fmt, n, k)
    decode = ops_gemm.gemm(K, x, w, out=out, decode=m)
    assert np.array_equal(_bits(ops_gemm_tc_q.gemm_tc_q(K, x, w, out=out)), _bits(decode))


@pytest.mark.parametrize("fmt", FMTS)
def test_grouped_prompt_rows_equal_decode_rows_bits(fmt):
    rng = np.random.default_rng(4)
    m, e, n, k = 21, 4, 24, 512
    x = _x(rng, m, k)
    w = stack([qweight(rng, fmt, n, k) for _ in range(e)])
    group = rng.integers(0, e, m).astype(np.int32)
    decode = ops_gemm.gemm_grouped(K, x, w, group, decode=m)
    assert np.array_equal(_bits(ops_gemm_tc_q.gemm_tc_grouped_q(K, x, w, group)), _bits(decode))


@pytest.mark.parametrize("fmt", FMTS)
def test_row_bits_do_not_depend_on_the_rows_beside_it(fmt):
    rng = np.random.default_rng(9)
    n, k, e = 70, 640, 3
    w = stack([qweight(rng, fmt, n, k) for _ in range(e)])
    row = _x(rng, 1, k)
    solo = quant_rows(row, w[1])
    for m, at in ((2, 1), (40, 33), (70, 64)):
        batch = _x(rng, m, k)
        batch[at] = row[0]
        group = rng.integers(0, e, m).astype(np.int32)
        group[at] = 1
        assert np.array_equal(_bits(ops_gemm_tc_q.gemm_tc_q(K, batch, w[1])[at]), _bits(solo[0])), f"{m}, {at}"
        y = ops_gemm_tc_q.gemm_tc_grouped_q(K, batch, w, group)
        assert np.array_equal(_bits(y[at]), _bits(solo[0])), f"grouped {m}, {at}"


@pytest.mark.parametrize("fmt", FMTS)
def test_unaligned_x_takes_element_loads_with_the_same_bits(fmt):
    rng = np.random.default_rng(13)
    m, n, k = 9, 70, 512
    x, w = _x(rng, m, k), qweight(rng, fmt, n, k)
    buf = np.empty(m * k + 8, dtype=x.dtype)
    off = next(i for i in range(8) if (buf[i:].ctypes.data % 16) == 2)
    xu = buf[off:off + m * k].reshape(m, k)
    xu[...] = x
    assert xu.ctypes.data % 16 and xu.flags.c_contiguous
    assert np.array_equal(_bits(ops_gemm_tc_q.gemm_tc_q(K, xu, w)), _bits(quant_rows(x, w)))


def test_empty_rows_are_empty():
    w = qweight(np.random.default_rng(1), "fp8", 8, 64)
    assert ops_gemm_tc_q.gemm_tc_q(K, bf16(np.zeros((0, 64), np.float32)), w).shape == (0, 8)


def _fp8_bk48(rng):
    w = qweight(rng, "fp8", 8, 96, (32, 48))
    return QWeight("fp8", w.shape, w.values, w.scale, None, (32, 48))


@pytest.mark.parametrize("what,says", [
    ("x dtype", "parameter x must be bfloat16"),
    ("x ndim", "must be [M, K]"),
    ("k", "x has K=32 but the weight has K=64"),
    ("out", "out must be one of"),
    ("stack", "weight must be a 2-d QWeight"),
    ("bk", "not a multiple of 32"),
    ("plain", "weight must be a QWeight"),
])
def test_dense_launcher_refuses_bad_input(what, says):
    rng = np.random.default_rng(2)
    x, w, out = _x(rng, 3, 64), qweight(rng, "fp8", 8, 64), "f32"
    if what == "x dtype":
        x = np.zeros((3, 64), np.float32)
    elif what == "x ndim":
        x = bf16(np.zeros(64, np.float32))
    elif what == "k":
        x = _x(rng, 3, 32)
    elif what == "out":
        out = "f16"
    elif what == "stack":
        w = stack([w, w])
    elif what == "bk":
        x, w = _x(rng, 3, 96), _fp8_bk48(rng)
    elif what == "plain":
        w = bf16(np.zeros((8, 64), np.float32))
    with pytest.raises(ValueError) as e:
        ops_gemm_tc_q.gemm_tc_q(K, x, w, out=out)
    assert says in str(e.value)


@pytest.mark.parametrize("ids,says", [
    (np.array([0, 2, 1], np.int32), "expert ids outside [0, 2)"),
    (np.array([0, -1, 1], np.int32), "expert ids outside [0, 2)"),
    (np.array([0, 1, 1], np.int64), "parameter group must be int32"),
    (np.array([0, 1], np.int32), "parameter group must have shape"),
])
def test_grouped_launcher_refuses_bad_ids(ids, says):
    rng = np.random.default_rng(5)
    x, w = _x(rng, 3, 64), stack([qweight(rng, "nvfp4", 8, 64) for _ in range(2)])
    with pytest.raises(ValueError) as e:
        ops_gemm_tc_q.gemm_tc_grouped_q(K, x, w, ids)
    assert says in str(e.value)


def test_grid_puts_rows_on_x_and_refuses_more_column_blocks_than_grid_y_takes():
    assert ops_gemm_tc_q.grid("gemm_tc_fp8", 129, 129) == (2, 2, 1)
    assert ops_gemm_tc_q.grid("gemm_tc_fp8", 129, 129, ops_gemm_tc_q.SMALL_TILE_M) == (3, 2, 1)
    with pytest.raises(ValueError, match="65,535"):
        ops_gemm_tc_q.grid("gemm_tc_fp8", 32, 65536 * 128)
