"""The prompt rows' GEMM (ops gemm with decode=0: cuda_src/gemm_tc.cu) on the CPU emulator: a row's result does not
depend on how many rows share the call or where the row sits, and equals the reference's tc_rows bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cupyglm.backend.lanes import BF16, bf16
from cupyglm.backend.tc_order import tc_rows, tc_rows_batched
from cupyglm.kernels import ops_gemm
from cupyglm.kernels.ops import Kernels

from bits import bf, bits

K = Kernels("sim", np)


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(7)
    return {kk: bf(rng, (40, kk), kk ** -0.5) for kk in (100, 256)}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 64), where=st.floats(0, 1), kk=st.sampled_from([100, 256]), seed=st.integers(0, 2**16))
def test_row_bits_do_not_depend_on_batch_size_or_position(weights, m, where, kk, seed):
    rng = np.random.default_rng(seed)
    w = weights[kk]
    row = bf(rng, (1, kk), 2.0)
    solo = ops_gemm.gemm(K, row, w)
    batch = bf(rng, (m, kk), 2.0)
    at = min(int(where * m), m - 1)
    batch[at] = row[0]
    y = ops_gemm.gemm(K, batch, w)
    assert np.array_equal(bits(y[at]), bits(solo[0])), f"row {at} of {m} differs from the row alone"
    assert np.array_equal(bits(y), bits(tc_rows(batch, w))), "sim differs from tc_rows"


def test_every_batch_size_1_to_64_for_one_row(weights):
    rng = np.random.default_rng(3)
    w = weights[256]
    big = bf(rng, (64, 256), 2.0)
    want = bits(tc_rows(big[:1], w))[0]
    for m in range(1, 65):
        y = ops_gemm.gemm(K, np.ascontiguousarray(big[:m]), w)
        assert np.array_equal(bits(y[0]), want), f"batch size {m}"
        if m in (1, 8, 9, 17, 64):
            assert np.array_equal(bits(y), bits(tc_rows(big[:m], w)))


def test_long_k_equals_tc_rows():
    """K long enough that the summation order shows in the bits (K = 1000: two slices and a tail)."""
    rng = np.random.default_rng(11)
    x, w = bf(rng, (33, 1000), 3.0), bf(rng, (17, 1000))
    y = ops_gemm.gemm(K, x, w)
    assert np.array_equal(bits(y), bits(tc_rows(x, w)))
    wrong = ops_gemm.gemm(K.variant("CONTROL_TC_REVERSED"), x, w)     # the planted mutant: a reversed k-chain
    assert not np.array_equal(bits(wrong), bits(y))


def test_heads_equal_gemm_batched_and_per_head_gemm():
    rng = np.random.default_rng(5)
    x, w = bf(rng, (3, 9, 70)), bf(rng, (3, 20, 70))
    y = ops_gemm.gemm_heads(K, x, w)
    assert np.array_equal(bits(y), bits(tc_rows_batched(x, w)))
    for h in range(3):
        assert np.array_equal(bits(y[h]), bits(ops_gemm.gemm(K, x[h], w[h])))


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
def test_thread_order_changes_no_bit(order):
    rng = np.random.default_rng(2)
    x, w = bf(rng, (19, 130)), bf(rng, (35, 130))
    y = ops_gemm.gemm(Kernels("sim", np, order=order), x, w)
    assert np.array_equal(bits(y), bits(tc_rows(x, w)))


def test_wrong_calls_name_the_parameter():
    x = np.zeros((2, 8), BF16)
    with pytest.raises(ValueError, match="x must be bfloat16"):
        ops_gemm.gemm(K, x.astype(np.float32), np.zeros((3, 8), BF16))
    with pytest.raises(ValueError, match="parameter w must have shape"):
        ops_gemm.gemm(K, x, np.zeros((3, 9), BF16))
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        ops_gemm.gemm(K, np.zeros((8, 2), BF16).T, np.zeros((3, 8), BF16))
    with pytest.raises(ValueError, match="gemm_heads: parameter w"):
        ops_gemm.gemm_heads(K, np.zeros((2, 2, 8), BF16), np.zeros((3, 2, 8), BF16))


def test_empty_shapes():
    assert ops_gemm.gemm(K, np.zeros((0, 8), BF16), np.zeros((3, 8), BF16)).shape == (0, 3)
    y = ops_gemm.gemm(K, np.ones((2, 0), BF16), np.ones((3, 0), BF16))
    assert y.shape == (2, 3) and not y.any()


def test_bf16_output_is_the_fp32_sum_rounded_once_in_the_epilogue():
    rng = np.random.default_rng(13)
    x, w = bf(rng, (21, 300), 2.0), bf(rng, (37, 300))
    y = ops_gemm.gemm(K, x, w, out="bf16")
    assert y.dtype == BF16
    assert np.array_equal(y.view(np.uint16), bf16(tc_rows(x, w)).view(np.uint16))
    h = ops_gemm.gemm_heads(K, x.reshape(3, 7, 300), w[:36].reshape(3, 12, 300), out="bf16")
    assert h.dtype == BF16
    want = bf16(tc_rows_batched(x.reshape(3, 7, 300), w[:36].reshape(3, 12, 300)))
    assert np.array_equal(h.view(np.uint16), want.view(np.uint16))
    with pytest.raises(ValueError, match="out must be one of"):
        ops_gemm.gemm(K, x, w, out="fp16")


def test_a_float32_operand_is_refused_naming_the_bf16_storage():
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="gemm: parameter x must be bfloat16, got float32"):
        ops_gemm.gemm(K, x, np.zeros((3, 8), BF16))
    with pytest.raises(ValueError, match="gemm: parameter w must be bfloat16, got float32"):
        ops_gemm.gemm(K, x.astype(BF16), np.zeros((3, 8), np.float32))
