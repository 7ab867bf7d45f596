"""The row-invariant GEMM: a row's bits never depend on the batch around it (numpy.matmul's do)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cupyglm.backend import lanes as lanes_mod
from cupyglm.backend.lanes import bf16, gemm, lane_sum


def _bf16_rand(rng, shape):
    return bf16(rng.standard_normal(shape).astype(np.float32))


@settings(max_examples=30, deadline=None)
@given(k=st.sampled_from([16, 48, 64, 100, 256]), batch=st.integers(1, 64), where=st.integers(0, 63),
       seed=st.integers(0, 2**31))
def test_gemm_row_is_bit_identical_in_any_batch(k, batch, where, seed):
    rng = np.random.default_rng(seed)
    w = _bf16_rand(rng, (37, k))
    row = _bf16_rand(rng, (1, k))
    others = _bf16_rand(rng, (batch, k))
    where = where % (batch + 1)
    x = np.concatenate([others[:where], row, others[where:]])
    alone = gemm(row, w)[0]
    assert np.array_equal(gemm(x, w)[where].view(np.uint32), alone.view(np.uint32))


def test_gemm_matches_float64_and_follows_lane_order():
    rng = np.random.default_rng(1)
    x, w = _bf16_rand(rng, (5, 256)), _bf16_rand(rng, (9, 256))
    y = gemm(x, w)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.allclose(y, ref, rtol=1e-5, atol=1e-4)
    # the order is exactly lane-16: redo one element by hand
    lanes = np.zeros(16, np.float32)
    for kk in range(256):
        lanes[kk % 16] += np.float32(x[2, kk]) * np.float32(w[3, kk])     # bf16 widened: the product is exact
    for width in (8, 4, 2, 1):
        lanes[:width] = lanes[:width] + lanes[width:2 * width]
    assert y[2, 3] == lanes[0]


def test_gemm_tiles_change_no_bit():
    """Tiles over rows and columns (the cache-sized working set) give the bits of one tile over everything."""
    rng = np.random.default_rng(3)
    x, w = _bf16_rand(rng, (37, 100)), _bf16_rand(rng, (lanes_mod.GEMM_TILE // 16 * 2 + 5, 100))
    xb, wb = (np.pad(lanes_mod.f32(a), ((0, 0), (0, 12))).reshape(a.shape[0], -1, 16) for a in (x, w))
    whole = lanes_mod._gemm_tile(xb, wb)
    assert np.array_equal(gemm(x, w).view(np.uint32), whole.view(np.uint32))


def test_numpy_matmul_is_not_row_invariant_but_gemm_is():
    """Why the project carries its own GEMM: BLAS picks kernels by M, so a row's bits move with the batch."""
    rng = np.random.default_rng(2)
    w = _bf16_rand(rng, (512, 1024))
    x = _bf16_rand(rng, (64, 1024))
    blas_changed = any(not np.array_equal((x[:m] @ w.T)[0], (x[:1] @ w.T)[0]) for m in (2, 3, 8, 16, 33, 64))
    ours = all(np.array_equal(gemm(x[:m], w)[0], gemm(x[:1], w)[0]) for m in (2, 3, 8, 16, 33, 64))
    assert ours
    if not blas_changed:    # BLAS builds differ; record, do not fail on the library's luck
        print("note: this BLAS happened to be row-invariant for these shapes")


def test_lane_sum_pads_with_exact_zeros():
    x = np.arange(1, 20, dtype=np.float32)
    assert lane_sum(x) == np.float32(190)
    assert lane_sum(np.zeros((3, 0), np.float32)).tolist() == [0, 0, 0]


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_bf16_storage_and_its_cuda_bits():
    """bf16() rounds to the numpy storage (nearest even, the top 16 bits of float32 for exact values); to_bits /
    from_bits are exact views between it and the cuda storage (uint16), every pattern round-tripping."""
    from cupyglm.backend.lanes import BF16, BF16_BITS, f32, from_bits, to_bits

    patterns = np.arange(2**16, dtype=np.uint16)
    b = from_bits(patterns)
    assert b.dtype == BF16 and np.array_equal(to_bits(b), patterns)
    assert to_bits(b).dtype == BF16_BITS
    wide = f32(b)                                               # exact widening: bits << 16
    assert np.array_equal(wide.view(np.uint32), patterns.astype(np.uint32) << 16)
    x = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20], np.float32)   # tie to even, tie, above
    assert to_bits(bf16(x)).tolist() == [0x3F80, 0x3F82, 0x3F81]
    assert bf16(x).dtype == BF16
    with pytest.raises(ValueError, match="bfloat16"):
        to_bits(x)
    with pytest.raises(ValueError, match="uint16"):
        from_bits(x)


def test_exp_f32_is_within_one_ulp_of_exp():
    """The shared exp (twin of cuda_src/exp_f32.cuh) against float64 exp rounded to float32."""
    from cupyglm.backend.lanes import exp_f32

    x = np.linspace(-87, 88, 400_001, dtype=np.float32)
    got = exp_f32(x)
    want = np.exp(x.astype(np.float64)).astype(np.float32)
    assert np.max(np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))) <= 1
    edge = exp_f32(np.array([np.nan, np.inf, -np.inf, -200.0, 0.0], np.float32))
    assert np.isnan(edge[0]) and edge[1] == np.inf and edge[2] == 0 and edge[3] == 0 and edge[4] == 1
