"""index_tail_pool: a sequence fed in any split leaves the pooled keys of one index_pool over all its positions
and, in the tail's leading slots, its incomplete pool's members; on numpy and on the emulator."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps

KP, I, N = 4, 24, 23


def _feed(ops, splits, ik, ig, ape, pool_rows, slot=2):
    xp = ops.xp
    tails = [xp.zeros((4, KP, I), dtype=ik.dtype) for _ in range(2)]      # the sequence in slot `slot` of 4
    pooled = xp.zeros((N // KP + 2, I), dtype=ik.dtype)
    start = 0
    for n in splits:
        rows = lambda a: np.concatenate([a[:1] * 0, a[start:start + n]])   # noqa: E731  the segment at row 1
        done = pool_rows[start // KP:(start + n) // KP]
        seg = np.array([[1, n, start, slot, 0]], dtype=np.int32)
        ops.index_tail_pool(tails[0], tails[1], rows(ik), rows(ig), ape, pooled, seg, done)
        start += n
    assert not np.asarray(tails[0])[np.arange(4) != slot].any()          # the other slots untouched
    return [np.asarray(t[slot]) for t in tails], np.asarray(pooled)


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_any_split_is_one_pool_pass(backend):
    rng = np.random.default_rng(3)
    ik = bf16(rng.standard_normal((N, I)).astype(np.float32))
    ig = bf16(rng.standard_normal((N, I)).astype(np.float32) * 2)
    ape = bf16(rng.standard_normal((KP, I)).astype(np.float32) * 0.5)
    pool_rows = rng.permutation(N // KP + 2)[:N // KP].astype(np.int32)
    ref = NumpyOps()
    c = N // KP
    want = ref.index_pool(ik[:c * KP].reshape(c, KP, I), ig[:c * KP].reshape(c, KP, I), ape)
    if backend == "sim":
        from cupyglm.backend.sim_ops import SimOps
        ops = SimOps()
    else:
        ops = ref
    for splits in ([N], [1] * N, [3, 2, 7, 1, 10], [5, 16, 2]):
        tail, pooled = _feed(ops, splits, ik, ig, ape, pool_rows)
        assert np.array_equal(pooled[pool_rows], want), splits
        fill = N % KP
        assert np.array_equal(tail[0][:fill], ik[c * KP:]) and np.array_equal(tail[1][:fill], ig[c * KP:]), splits
