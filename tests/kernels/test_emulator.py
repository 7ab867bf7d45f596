"""Self-tests of the CPU emulator (sim backend) on cuda_src/selftest.cu: what kernels compute (reductions, warp
operations, atomics, bf16, shared memory, indices) in every thread order. Its errors: test_emulator_errors.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cupyglm.kernels import CUDA_SRC, load_module

ORDERS = [("forward", 0), ("reverse", 0), ("shuffled", 1), ("shuffled", 2)]
i32, u32, f32 = np.int32, np.uint32, np.float32


@pytest.fixture(scope="module")
def st():
    return load_module("sim", CUDA_SRC / "selftest.cu")


# ---------------------------------------------------------------------------
# reductions, warp operations
# ---------------------------------------------------------------------------
def tree_sum_ref(x: np.ndarray, block: int) -> np.ndarray:
    s = x.reshape(-1, block).copy()
    stride = block // 2
    while stride:
        s[:, :stride] = s[:, :stride] + s[:, stride : 2 * stride]
        stride //= 2
    return s[:, 0]


@pytest.mark.parametrize("order,seed", ORDERS)
def test_block_reduction_matches_numpy_in_every_order(st, order, seed):
    rng = np.random.default_rng(0)
    block, grid = 256, 6
    x = rng.standard_normal(block * grid).astype(f32)
    out = np.full(grid, np.nan, f32)
    st.get_function("block_reduce_sum")(grid, block, (x, out, i32(x.size)), order=order, seed=seed)
    np.testing.assert_array_equal(out, tree_sum_ref(x, block))
    np.testing.assert_allclose(out, x.reshape(grid, block).sum(1, dtype=np.float64), rtol=1e-5, atol=1e-4)


def test_block_reduction_partial_last_block(st):
    x = np.arange(1000, dtype=f32)
    out = np.zeros(4, f32)
    st.get_function("block_reduce_sum")(4, 256, (x, out, i32(1000)))
    np.testing.assert_array_equal(out, tree_sum_ref(np.concatenate([x, np.zeros(24, f32)]), 256))


def butterfly_ref(v: np.ndarray) -> np.ndarray:
    v = v.reshape(-1, 32).copy()
    lanes = np.arange(32)
    for off in (16, 8, 4, 2, 1):
        v = v + v[:, lanes ^ off]
    return v.reshape(-1)


def test_warp_reduce_xor_and_down(st):
    rng = np.random.default_rng(1)
    n = 4 * 128
    x = rng.standard_normal(n).astype(f32)
    out_xor = np.zeros(n, f32)
    out_down = np.zeros(n // 32, f32)
    for order, seed in ORDERS:
        st.get_function("warp_reduce")(4, 128, (x, out_xor, out_down), order=order, seed=seed)
        np.testing.assert_array_equal(out_xor, butterfly_ref(x))
        d = x.reshape(-1, 32).copy()
        lanes = np.arange(32)
        for off in (16, 8, 4, 2, 1):
            src = np.where(lanes + off < 32, lanes + off, lanes)
            d = d + d[:, src]
        np.testing.assert_array_equal(out_down, d[:, 0])


def shfl_ref(vals: np.ndarray, mode: str, width: int, param: int) -> np.ndarray:
    out = np.empty_like(vals)
    for w0 in range(0, vals.size, 32):
        for lane in range(32):
            base = lane & ~(width - 1)
            top = base + width - 1
            b = param & 31
            if mode == "idx":
                j, ok = base | (b & (width - 1)), True
            elif mode == "up":
                j = lane - b
                ok = j >= base
            elif mode == "down":
                j = lane + b
                ok = j <= top
            else:
                j = lane ^ b
                ok = j <= top
            out[w0 + lane] = vals[w0 + (j if ok else lane)]
    return out


@pytest.mark.parametrize("width", [1, 2, 4, 8, 16, 32])
def test_shuffle_width_semantics(st, width):
    n = 64
    vals = (np.arange(n, dtype=i32) * 7 + 3).astype(i32)
    out = np.zeros((4, n), i32)
    for param in (0, 1, 2, 3, 5, 8, 16, 17, 31):
        st.get_function("shfl_modes")(2, 32, (vals, out, i32(width), i32(param)))
        for k, mode in enumerate(("idx", "up", "down", "xor")):
            np.testing.assert_array_equal(out[k], shfl_ref(vals, mode, width, param), err_msg=f"{mode} w={width} p={param}")


def test_shuffle_of_64bit_and_bf16(st):
    d = np.arange(32, dtype=np.float64) + 0.25
    h = (np.arange(32, dtype=f32) * 0.5).astype(ml_dtypes.bfloat16)
    d_out = np.zeros(32, np.float64)
    h_out = np.zeros(32, ml_dtypes.bfloat16)
    st.get_function("shfl_types")(1, 32, (d, h, d_out, h_out))
    np.testing.assert_array_equal(d_out, d[::-1])
    np.testing.assert_array_equal(h_out.view(np.uint16), h.view(np.uint16)[np.arange(32) ^ 1])


@pytest.mark.parametrize("block", [64, 48])
def test_votes_and_syncthreads_reductions(st, block):
    rng = np.random.default_rng(block)
    grid = 3
    n = grid * block
    pred = (rng.random(n) < 0.5).astype(i32)
    pred[:block] = 1  # block 0: all true
    pred[block : block + 32] = 0  # block 1: first warp all false
    ballot = np.zeros(n, u32)
    any_all = np.zeros((2, n), i32)
    counts = np.zeros(3 * grid, i32)
    st.get_function("votes")(grid, block, (pred, ballot, any_all, counts))
    for b in range(grid):
        for w0 in range(0, block, 32):
            lanes = pred[b * block + w0 : b * block + min(w0 + 32, block)]
            exp = sum(1 << i for i, p in enumerate(lanes) if p)
            sl = slice(b * block + w0, b * block + w0 + len(lanes))
            assert (ballot[sl] == exp).all()
            assert (any_all[0, sl] == int(lanes.any())).all()
            assert (any_all[1, sl] == int(lanes.all())).all()
        bp = pred[b * block : (b + 1) * block]
        assert list(counts[3 * b : 3 * b + 3]) == [bp.sum(), int(bp.all()), int(bp.any())]


def test_partial_mask_shuffle(st):
    x = np.arange(32, dtype=f32) + 1
    out = np.zeros(32, f32)
    st.get_function("half_warp_sum")(1, 32, (x, out))
    v = x[:16].copy()
    for off in (8, 4, 2, 1):
        v = v + v[np.arange(16) ^ off]
    np.testing.assert_array_equal(out[:16], v)
    np.testing.assert_array_equal(out[16:], x[16:])


# ---------------------------------------------------------------------------
# atomics
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("order,seed", ORDERS)
def test_atomic_slot_allocator(st, order, seed):
    n = 1000
    counter = np.zeros(1, i32)
    slots = np.full(n, -1, i32)
    st.get_function("atomic_slots")(4, 256, (counter, slots, i32(n)), order=order, seed=seed)
    assert counter[0] == n
    assert sorted(slots.tolist()) == list(range(n))
    if order == "forward":
        np.testing.assert_array_equal(slots, np.arange(n))
    elif order == "reverse":
        np.testing.assert_array_equal(slots, np.arange(n)[::-1])
    else:
        assert not np.array_equal(slots, np.arange(n))


@pytest.mark.parametrize("order,seed", ORDERS)
def test_atomic_misc(st, order, seed):
    n = 2 * 256
    ints = np.array([np.iinfo(i32).min, np.iinfo(i32).max, -1, -5], i32)
    uor = np.zeros(1, u32)
    fsum = np.zeros(1, f32)
    usum = np.zeros(1, np.uint64)
    seen = np.zeros(n, i32)
    st.get_function("atomic_misc")(2, 256, (ints, uor, fsum, usum, seen), order=order, seed=seed)
    i = np.arange(n)
    assert ints[0] == (i * 7 % 1000).max()
    assert ints[1] == (1000 - i).min()
    assert 0 <= ints[2] < n
    assert sorted(seen.tolist() + [int(ints[3])]) == [-5] + list(range(n))
    assert uor[0] == 0xFFFFFFFF
    assert fsum[0] == n
    assert usum[0] == n * (n - 1) // 2


# ---------------------------------------------------------------------------
# bf16
# ---------------------------------------------------------------------------
EDGE_BITS = [
    0x00000000, 0x80000000, 0x3F800000, 0xBF800000,
    0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0xBF808000, 0xBF818000,  # ties both ways
    0x00000001, 0x00008000, 0x00018000, 0x00010000, 0x007FFFFF, 0x80000001, 0x807F8000,  # subnormals
    0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7E8000, 0xFF7FFFFF,  # max finite / overflow
    0x7F800000, 0xFF800000,  # +-inf
    0x7FC00000, 0x7F800001, 0xFFC00000, 0x7FFFFFFF, 0xFF800001, 0x7FA12345,  # NaNs
]


@pytest.mark.parametrize("extra_random", [0, 20000])
def test_bf16_conversion_matches_cuda(st, extra_random):
    rng = np.random.default_rng(7)
    bits = np.array(EDGE_BITS, np.uint32)
    if extra_random:
        bits = np.concatenate([bits, rng.integers(0, 2**32, extra_random, dtype=np.uint64).astype(np.uint32)])
    x = bits.view(f32)
    n = x.size
    rn = np.zeros(n, np.uint16)
    back = np.zeros(n, f32)
    st.get_function("bf16_convert")((n + 255) // 256, 256, (x, rn, back, i32(n)))
    with np.errstate(all="ignore"):
        expect = x.astype(ml_dtypes.bfloat16).view(np.uint16).copy()
    expect[np.isnan(x)] = 0x7FFF  # CUDA: every NaN becomes the canonical quiet NaN
    np.testing.assert_array_equal(rn, expect)
    np.testing.assert_array_equal(back.view(np.uint32), rn.astype(np.uint32) << 16)
    # spot checks of the documented behaviour
    d = dict(zip(EDGE_BITS, rn[: len(EDGE_BITS)].tolist()))
    assert d[0x3F808000] == 0x3F80 and d[0x3F818000] == 0x3F82  # ties to even
    assert d[0x7F7FFFFF] == 0x7F80 and d[0x7F7F7FFF] == 0x7F7F  # overflow to inf / max finite
    assert d[0x00000001] == 0x0000 and d[0x00018000] == 0x0002  # subnormals kept, RNE
    assert d[0xFFC00000] == 0x7FFF and d[0x7FA12345] == 0x7FFF


def test_bf16_arithmetic_matches_float_then_round(st):
    rng = np.random.default_rng(3)
    n = 4096
    a = rng.integers(0, 2**16, n, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
    b = rng.integers(0, 2**16, n, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
    a[:4] = np.array([1.0, 3.0, 0.0, np.inf], f32).astype(ml_dtypes.bfloat16)
    b[:4] = np.array([2.0**-8, 2.0**-9, 0.0, np.inf], f32).astype(ml_dtypes.bfloat16)
    out = np.zeros((4, n), ml_dtypes.bfloat16)
    st.get_function("bf16_arith")((n + 255) // 256, 256, (a, b, out, i32(n)))
    af, bf = a.astype(f32), b.astype(f32)
    with np.errstate(all="ignore"):
        for k, r in enumerate((af + bf, af - bf, af * bf, af / bf)):
            exp = r.astype(ml_dtypes.bfloat16).view(np.uint16).copy()
            exp[np.isnan(r)] = 0x7FFF
            np.testing.assert_array_equal(out[k].view(np.uint16), exp, err_msg=["add", "sub", "mul", "div"][k])


# ---------------------------------------------------------------------------
# shared memory, indices
# ---------------------------------------------------------------------------
def test_dynamic_shared_memory(st):
    block, grid = 128, 3
    x = np.arange(block * grid, dtype=f32)
    y = np.zeros_like(x)
    poison = np.zeros(block * grid, u32)
    st.get_function("dyn_smem_reverse")(grid, block, (x, y, poison), shared_mem=2 * block * 4)
    np.testing.assert_array_equal(y, x.reshape(grid, block)[:, ::-1].reshape(-1))
    assert (poison == 0xFFFFFFFF).all()


def test_static_shared_memory_is_poisoned_every_block(st):
    out = np.zeros(2 * 64, u32)
    bytes_ = np.zeros(2 * 64, np.uint8)
    fn = st.get_function("read_uninit_shared")
    for b in range(2):
        fn(2, 64, (out[b * 64 : (b + 1) * 64], bytes_[b * 64 : (b + 1) * 64]))
    assert (out == 0xFFFFFFFF).all() and (bytes_ == 0xFF).all()


@pytest.mark.parametrize("grid,block", [((3, 2, 2), (4, 3, 2)), ((2, 3), (8, 4)), (5, 33), ((1, 1, 3), (2, 2, 8))])
def test_block_and_grid_indices(st, grid, block):
    g = tuple(grid) + (1,) * (3 - len(grid)) if isinstance(grid, tuple) else (grid, 1, 1)
    b = tuple(block) + (1,) * (3 - len(block)) if isinstance(block, tuple) else (block, 1, 1)
    nt, nb = int(np.prod(b)), int(np.prod(g))
    out = np.full((nb * nt, 8), -1, i32)
    for order, seed in ORDERS[:3]:
        st.get_function("index_3d")(grid, block, (out,), order=order, seed=seed)
        bz, by, bx = np.meshgrid(range(g[2]), range(g[1]), range(g[0]), indexing="ij")
        tz, ty, tx = np.meshgrid(range(b[2]), range(b[1]), range(b[0]), indexing="ij")
        exp = np.zeros((nb, nt, 8), i32)
        exp[:, :, 0] = bx.reshape(-1, 1)
        exp[:, :, 1] = by.reshape(-1, 1)
        exp[:, :, 2] = bz.reshape(-1, 1)
        exp[:, :, 3] = tx.reshape(1, -1)
        exp[:, :, 4] = ty.reshape(1, -1)
        exp[:, :, 5] = tz.reshape(1, -1)
        exp[:, :, 6] = g[0] * 10000 + g[1] * 100 + g[2]
        exp[:, :, 7] = b[0] * 10000 + b[1] * 100 + b[2]
        np.testing.assert_array_equal(out, exp.reshape(-1, 8))

