"""The sampling kernel (cuda_src/sample.cu: sample_rows, op `sample`) on the CPU emulator.

* mixed batches (greedy rows and sampled rows with every filter) equal NumpyOps.sample (the one NumPy
  definition, cupyglm.backend.numpy_sample.draw) token for token, under forward, reverse and shuffled thread orders,
  at vocabularies inside one sort tile, across tiles (global passes) and at the full model's 154,880;
* a row's token depends on that row alone: not on the other rows of the batch, nor on its index in it;
* greedy ties go to the lower id; a NaN row gives -1 (the engine refuses it) and leaves the others alone;
* the launcher refuses wrong dtypes and shapes, naming the kernel and parameter.
"""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.sim_ops import SimOps
from cupyglm.engine.sampling import SamplingParams, sample
from cupyglm.kernels import ops_sample
from cupyglm.kernels.ops import Kernels

REF = NumpyOps()
ORDERS = ("forward", "reverse", "shuffled")
KS = {o: Kernels("sim", np, order=o) for o in ORDERS}
K = KS["forward"]

#         temperature, top_k, top_p, min_p
SPECS = [(0.0, 0, 1.0, 0.0), (0.7, 0, 1.0, 0.0), (1.0, 40, 1.0, 0.0), (1.0, 0, 0.9, 0.0),
         (0.8, 0, 1.0, 0.05), (1.3, 25, 0.85, 0.01), (0.0, 3, 0.5, 0.3), (1.0, 1, 1.0, 0.0),
         (2.0, 0, 0.99, 0.0), (0.5, 7, 1.0, 0.2), (1.0, 0, 1.0, 0.0), (0.9, 5000, 0.95, 0.0)]


def _batch(rng, v, specs=SPECS, scale=2.0):
    r = len(specs)
    x = (rng.standard_normal((r, v)) * scale).astype(np.float32)
    for i in range(r):                                     # ties at the top and a run of equal values
        top = rng.choice(v, 4, replace=False)
        x[i, top] = x[i].max() + np.float32(0.5)
        x[i, rng.choice(v, 20, replace=False)] = x[i, top[0]] - np.float32(1.0)
        x[i, rng.choice(v, 3, replace=False)] = -np.inf
    return (x,
            np.array([s[0] for s in specs], np.float32), np.array([s[1] for s in specs], np.int32),
            np.array([s[2] for s in specs], np.float32), np.array([s[3] for s in specs], np.float32),
            rng.integers(0, 2**64, r, dtype=np.uint64), rng.integers(0, 100_000, r).astype(np.int32))


def _rows(args, idx):
    return tuple(np.ascontiguousarray(a[idx]) for a in args)


@pytest.mark.parametrize("v", [512, 1000, 3001])
def test_mixed_batch_equals_numpy_in_every_order(v):
    rng = np.random.default_rng(v)
    for trial in range(3):
        args = _batch(rng, v)
        want = REF.sample(*args)
        assert want.dtype == np.int32 and want.shape == (len(SPECS),)
        for o in ORDERS:
            got = ops_sample.sample(KS[o], *args)
            assert np.array_equal(got, want), (v, trial, o, got, want)


def test_full_vocabulary():
    rng = np.random.default_rng(154880)
    specs = [(0.0, 0, 1.0, 0.0), (1.0, 0, 0.95, 0.0), (0.8, 50, 1.0, 0.02)]
    args = _batch(rng, 154880, specs)
    assert np.array_equal(ops_sample.sample(KS["shuffled"], *args), REF.sample(*args))


def test_sampled_rows_do_vary_and_follow_the_seed():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((1, 512)) * 0.5).astype(np.float32)
    n = 24
    args = (np.repeat(x, n, 0), np.ones(n, np.float32), np.zeros(n, np.int32), np.ones(n, np.float32),
            np.zeros(n, np.float32), np.full(n, 99, np.uint64), np.arange(n, dtype=np.int32) + 1000)
    got = ops_sample.sample(K, *args)
    assert np.array_equal(got, REF.sample(*args))
    assert len(set(got.tolist())) > n // 2                 # the position drives the RNG
    # the per-request function gives the same tokens
    p = SamplingParams(temperature=1.0)
    assert got.tolist() == [sample(x[0], p, 99, 1000 + i) for i in range(n)]


def test_a_row_does_not_depend_on_its_batch():
    rng = np.random.default_rng(11)
    args = _batch(rng, 1000)
    r = len(SPECS)
    batch = ops_sample.sample(K, *args)
    alone = np.array([ops_sample.sample(K, *_rows(args, slice(i, i + 1)))[0] for i in range(r)])
    assert np.array_equal(batch, alone)
    perm = rng.permutation(r)
    assert np.array_equal(ops_sample.sample(KS["shuffled"], *_rows(args, perm)), batch[perm])
    # other rows changed (new logits, params, seeds): row 0..3's tokens stay
    other = _batch(np.random.default_rng(12), 1000)
    mixed = tuple(np.concatenate([a[:4], b[4:]]) for a, b in zip(args, other))
    assert np.array_equal(ops_sample.sample(K, *mixed)[:4], batch[:4])


def test_greedy_ties_go_to_the_lower_id():
    v = 1000
    x = np.zeros((4, v), np.float32)
    x[0, [700, 3, 999]] = 5.0                  # -> 3
    x[1, [998, 999]] = 1.0                     # -> 998
    x[2] = -np.inf                             # all -inf -> 0
    x[3, [10, 11]] = -0.0                      # zeros of both signs, everything else 0 -> 0
    z = np.zeros(4, np.float32)
    args = (x, z, np.zeros(4, np.int32), np.ones(4, np.float32), z, np.arange(4, dtype=np.uint64),
            np.zeros(4, np.int32))
    for o in ORDERS:
        assert ops_sample.sample(KS[o], *args).tolist() == [3, 998, 0, 0]
    assert REF.sample(*args).tolist() == [3, 998, 0, 0]
    # top_k = 1 on a sampled row: the same tie rule through the sort
    args1 = (x[:2].copy(), np.ones(2, np.float32), np.ones(2, np.int32), np.ones(2, np.float32),
             np.zeros(2, np.float32), np.arange(2, dtype=np.uint64), np.zeros(2, np.int32))
    assert ops_sample.sample(K, *args1).tolist() == [3, 998] == REF.sample(*args1).tolist()


def test_nan_row_gives_minus_one_and_leaves_the_others():
    rng = np.random.default_rng(5)
    args = _batch(rng, 512)
    x = args[0].copy()
    x[2, 17] = np.nan
    x[6, 0] = np.nan                           # a greedy row too
    args = (x,) + args[1:]
    got = ops_sample.sample(K, *args)
    want = REF.sample(*args)
    assert np.array_equal(got, want)
    assert got[2] == -1 and got[6] == -1 and (np.delete(got, [2, 6]) >= 0).all()


def test_sim_ops_binds_the_kernel():
    ops = SimOps()
    assert "sample" in ops.kernel_ops
    args = _batch(np.random.default_rng(9), 512)
    assert np.array_equal(ops.sample(*args), REF.sample(*args))


@pytest.mark.parametrize("i,bad,what", [
    (1, np.zeros(12, np.float64), "temperature"),
    (2, np.zeros(12, np.int64), "top_k"),
    (5, np.zeros(12, np.int64), "seed"),
    (6, np.zeros(11, np.int32), "position"),
    (0, np.zeros((12, 512), np.float64), "logits"),
])
def test_launcher_refuses_bad_arguments(i, bad, what):
    args = list(_batch(np.random.default_rng(1), 512))
    args[i] = bad
    with pytest.raises(ValueError, match=f"sample_rows: parameter {what}"):
        ops_sample.sample(K, *args)
