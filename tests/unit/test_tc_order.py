"""The decode GEMV's canonical order (backend/tc_order.py): slices of 512 added in order, each a chain of mma
steps over the interleaved 32-blocks, the same bits whatever the number of rows."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import bf16, gemm
from cupyglm.backend.tc_order import SLICE_K, _PERM, tc_rows
from cupyglm.backend.tensor_core import mma_chain


def _one(k: int, xs: dict, ws=None) -> tuple[np.ndarray, np.ndarray]:
    x = np.zeros((1, k), np.float32)
    for i, v in xs.items():
        x[0, i] = v
    w = np.ones((1, k), np.float32) if ws is None else ws
    return bf16(x), bf16(w)


def test_the_32_block_order_is_a_permutation_feeding_two_steps():
    assert sorted(_PERM.tolist()) == list(range(32))
    assert sorted(_PERM[:16].tolist()) == [8 * t + i for t in range(4) for i in range(4)]


def test_a_step_cuts_small_terms_the_lane16_order_keeps():
    x, w = _one(16, {0: 1.0, **{i: 2.0 ** -26 for i in range(1, 16)}})
    assert tc_rows(x, w)[0, 0] == np.float32(1.0)
    assert gemm(x, w)[0, 0] > np.float32(1.0)                      # lane-16: every add rounded to nearest


def test_steps_take_interleaved_k_not_contiguous_k():
    x, w = _one(32, {16: 1.0, **{i: 2.0 ** -26 for i in range(8)}})
    assert tc_rows(x, w)[0, 0] == np.float32(1.0)                 # k 0..3 meet 1.0 in step 0, k 4..7 in step 1
    assert mma_chain(x, w.T)[0, 0] == np.float32(1.0 + 2.0 ** -23)  # contiguous steps: k 0..7 summed alone first


def test_slices_are_added_in_fp32_not_chained():
    x, w = _one(2 * SLICE_K, {0: 1.0, SLICE_K: 3 * 2.0 ** -24})
    assert tc_rows(x, w)[0, 0] == np.float32(1.0 + 2.0 ** -22)    # 1 + 1.5 ulp rounded to even
    assert mma_chain(x, w.T)[0, 0] == np.float32(1.0 + 2.0 ** -23)  # one chain truncates instead


def test_a_short_tail_is_zero_padded():
    x, w = _one(40, {0: 1.0, 39: 0.5})
    assert tc_rows(x, w)[0, 0] == np.float32(1.5)
    assert tc_rows(bf16(np.zeros((2, 0))), bf16(np.zeros((3, 0)))).shape == (2, 3)


@pytest.mark.parametrize("k", [16, 48, 512, 1040])
def test_a_row_is_the_same_whatever_the_rows_beside_it(k):
    rng = np.random.default_rng(k)
    x = bf16(rng.standard_normal((16, k)) * np.exp2(rng.integers(-8, 8, (16, k))))
    w = bf16(rng.standard_normal((24, k)))
    full = tc_rows(x, w)
    for m in (1, 3, 9, 16):
        np.testing.assert_array_equal(tc_rows(x[:m], w).view(np.uint32), full[:m].view(np.uint32))
    np.testing.assert_array_equal(tc_rows(x[5:6], w).view(np.uint32), full[5:6].view(np.uint32))
    np.testing.assert_array_equal(tc_rows(x, w[7:9]).view(np.uint32), full[:, 7:9].view(np.uint32))


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="tc_rows"):
        tc_rows(bf16(np.zeros((2, 16))), bf16(np.zeros((3, 32))))
