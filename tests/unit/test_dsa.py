"""DSA: pooled keys and the pick rule against direct references; sparse = dense when every pool is picked."""
import numpy as np
import pytest

from cupyglm.backend.lanes import BF16, bf16, exp_f32
from cupyglm.backend.numpy_ops import NumpyOps, expand_pools

ops = NumpyOps()


def test_pooled_keys_follow_the_formula():
    rng = np.random.default_rng(0)
    ik = bf16(rng.standard_normal((5, 4, 16)).astype(np.float32))
    ig = bf16(rng.standard_normal((5, 4, 16)).astype(np.float32))
    ape = bf16(rng.standard_normal((4, 16)).astype(np.float32))
    pk = ops.index_pool(ik, ig, ape)
    for p in range(5):
        for d in range(16):
            l = [np.float32(ig[p, j, d]) + np.float32(ape[j, d]) for j in range(4)]     # bf16 widened
            e = [exp_f32(np.float32(x - max(l)))[()] for x in l]
            s = np.float32(np.float32(np.float32(e[0] + e[1]) + e[2]) + e[3])
            t = [np.float32(bf16(np.float32(bf16(np.float32(e[j] / s))) * np.float32(ik[p, j, d])))
                 for j in range(4)]
            want = bf16(np.float32(np.float32(np.float32(t[0] + t[1]) + t[2]) + t[3]))
            assert pk.dtype == want.dtype
            assert pk[p, d] == want


def _pick_reference(scores, q, npools, kpool):
    visible = (q + 1) // kpool
    if visible <= npools:
        return list(range(q + 1))
    ranked = sorted(range(visible), key=lambda p: (-float(scores[p]), p))[:npools]
    toks = [p * kpool + j for p in sorted(ranked) for j in range(kpool)]
    return toks + list(range(visible * kpool, q + 1))


@pytest.mark.parametrize("q", [0, 3, 34, 35, 36, 37, 38, 39, 63, 100, 131])
def test_pick_rule_against_direct_reference(q):
    rng = np.random.default_rng(q)
    # coarse scores force ties, which must go to the lower pool
    scores = rng.integers(0, 4, size=(1, 40)).astype(np.float32)
    toks, counts = ops.pick(scores, np.array([q]), npools=8, kpool=4, width=35)
    want = _pick_reference(scores[0], q, 8, 4)
    assert counts[0] == len(want)
    assert toks[0, :counts[0]].tolist() == want
    assert (toks[0, counts[0]:] == -1).all()
    if q >= 35:
        assert counts[0] == 32 + (q + 1) % 4      # 8 pools of 4, plus the tail


def test_first_sparse_position():
    scores = np.zeros((2, 9), np.float32)
    _, counts = ops.pick(scores, np.array([34, 35]), npools=8, kpool=4, width=35)
    assert counts.tolist() == [35, 32]


def _naive_attention(qa, kv, scale):
    s = (qa.astype(np.float64) @ kv.astype(np.float64).T) * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p @ kv.astype(np.float64)) / p.sum(axis=1, keepdims=True)


def test_sparse_equals_dense_when_every_pool_is_picked():
    rng = np.random.default_rng(5)
    q, h, r = 70, 3, 32
    store = np.full((200, r), np.nan, BF16)                       # [rows, R] bf16; unused rows poisoned
    rows_of_pos = rng.permutation(np.arange(200))[:q + 1].astype(np.int32)
    store[rows_of_pos] = bf16(rng.standard_normal((q + 1, r)).astype(np.float32))
    qa = bf16(rng.standard_normal((1, h, r)).astype(np.float32))
    dense_tokens, dense_n = ops.pick(np.zeros((1, 20), np.float32), np.array([q]), npools=100, kpool=4, width=80)
    sparse_list = expand_pools(np.arange((q + 1) // 4), q, 4)      # the sparse rule with every pool picked
    assert sparse_list.tolist() == dense_tokens[0, :dense_n[0]].tolist() == list(range(q + 1))

    def rows_of(tokens):
        return np.where(tokens >= 0, rows_of_pos[np.maximum(tokens, 0)], -1).astype(np.int32)

    sparse_tokens = np.full((1, 80), -1, np.int32)
    sparse_tokens[0, :sparse_list.size] = sparse_list
    for chunk in (16, 32, 512):
        dense = ops.attention(qa, store, rows_of(dense_tokens), dense_n, 0.125, chunk)
        sparse = ops.attention(qa, store, rows_of(sparse_tokens), np.array([sparse_list.size], np.int32), 0.125, chunk)
        assert np.array_equal(dense, sparse)
        assert not np.isnan(dense).any()
        ref = _naive_attention(qa[0], store[rows_of_pos], 0.125)
        assert dense.dtype == BF16 and np.allclose(dense[0].astype(np.float64), ref, atol=2e-2, rtol=2e-2)


def test_attention_row_is_independent_of_its_batch():
    rng = np.random.default_rng(6)
    store = bf16(rng.standard_normal((100, 32)).astype(np.float32))
    qa = bf16(rng.standard_normal((3, 2, 32)).astype(np.float32))
    rows = np.full((3, 60), -1, np.int32)
    counts = np.array([60, 5, 33], np.int32)
    for i, n in enumerate(counts):
        rows[i, :n] = rng.permutation(100)[:n]
    both = ops.attention(qa, store, rows, counts, 0.2, 16)
    for i in range(3):
        alone = ops.attention(qa[i:i + 1], store, rows[i:i + 1, :counts[i]], counts[i:i + 1], 0.2, 16)
        assert np.array_equal(both[i], alone[0])


def test_scores_through_segment_tables_are_index_scores_row_by_row():
    rng = np.random.default_rng(7)
    t, hi, i, pw, r = 5, 20, 24, 9, 30
    qi = bf16(rng.standard_normal((t, hi, i)).astype(np.float32))
    hw = rng.standard_normal((t, hi)).astype(np.float32)
    pooled = bf16(rng.standard_normal((r, i)).astype(np.float32))
    tables = rng.integers(0, r, (4, pw)).astype(np.int32)           # [S, Pw] int32 four segments' tables
    tables[1, 4], tables[2, 0] = -1, r                             # outside the store: a zero key
    seg = np.array([2, 1, 1, 0, 3], np.int32)                      # rows 1 and 2 share segment 1's table
    hscale = np.float32(hi ** -0.5)
    got = ops.index_scores_rows(qi, hw, hscale, pooled, tables, seg)
    keys = np.where(((tables >= 0) & (tables < r))[..., None], pooled[np.clip(tables, 0, r - 1)].astype(np.float32),
                    0)
    for row in range(t):
        want = ops.index_scores(qi[row:row + 1], hw[row:row + 1] * hscale, keys[seg[row]])[0]
        assert np.array_equal(got[row].view(np.uint32), want.view(np.uint32)), row
    assert np.array_equal(got[1, 4], ops.index_scores(qi[1:2], hw[1:2] * hscale, np.zeros((1, i), np.float32))[0, 0])
    seg[4] = 4                                                     # past the tables: every key zero
    zero = ops.index_scores(qi[4:5], hw[4:5] * hscale, np.zeros((pw, i), np.float32))[0]
    assert np.array_equal(ops.index_scores_rows(qi, hw, hscale, pooled, tables, seg)[4], zero)
