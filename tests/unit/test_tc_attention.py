"""The tensor-core prefill attention model (backend/tc_attention.py): a row's bits do not depend on where its
prompt chunk began or on the rows beside it, key blocks sit on the absolute grid, and the result agrees with
float64 attention to bf16 tolerance."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend import tc_attention as ta
from cupyglm.backend.lanes import bf16

H, R = 16, 32


def _inputs(rng, n: int, t: int):
    store = bf16(rng.standard_normal((n, R)).astype(np.float32))
    qa = bf16(rng.standard_normal((t, H, R)).astype(np.float32) * 0.5)
    return qa, store


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint16)


def _dense(qa, store, start: int):
    tokens, counts = ta.dense_tokens(start, qa.shape[0])
    return ta.attention_tc(qa, store, tokens, tokens, counts, 0.25)


def test_chunk_start_does_not_change_a_rows_bits():
    qa, store = _inputs(np.random.default_rng(0), 150, 150)
    whole = _dense(qa, store, 0)
    for cuts in ((0, 37, 150), (0, 64, 100, 150), (0, 1, 129, 150)):
        parts = [_dense(qa[a:b], store, a) for a, b in zip(cuts, cuts[1:])]
        assert np.array_equal(_bits(np.concatenate(parts)), _bits(whole))


def test_row_bits_do_not_depend_on_the_rows_beside_it():
    rng = np.random.default_rng(1)
    qa, store = _inputs(rng, 200, 12)
    tokens = np.full((12, 200), -1, np.int32)
    counts = rng.integers(1, 200, 12).astype(np.int32)
    for i, c in enumerate(counts):
        tokens[i, :c] = np.sort(rng.choice(200, c, replace=False))
    rows = np.where(tokens >= 0, 199 - tokens, -1).astype(np.int32)
    full = ta.attention_tc(qa, store, tokens, rows, counts, 0.3)
    for i in (0, 5, 11):
        one = ta.attention_tc(qa[i:i + 1], store, tokens[i:i + 1, :counts[i]], rows[i:i + 1, :counts[i]],
                              counts[i:i + 1], 0.3)
        assert np.array_equal(_bits(one[0]), _bits(full[i]))


def test_blocks_sit_on_the_absolute_grid():
    assert [(b, list(i)) for b, i in ta.blocks_of(np.array([3, 63, 64, 200]))] == [(0, [0, 1]), (1, [2]), (3, [3])]
    with pytest.raises(ValueError, match="ascending"):
        ta.blocks_of(np.array([5, 5]))
    # a list whose 64 entries straddle two blocks merges twice: not the bits of one 64-key block
    qa, store = _inputs(np.random.default_rng(2), 200, 1)
    pos = np.arange(40, 104, dtype=np.int32)[None]
    grid = ta.attention_tc(qa, store, pos, pos, np.array([64], np.int32), 1.0)
    shifted = ta.attention_tc(qa, store, pos - 40, pos, np.array([64], np.int32), 1.0)
    assert not np.array_equal(_bits(grid), _bits(shifted))


def test_agrees_with_float64_to_bf16_tolerance():
    rng = np.random.default_rng(3)
    qa, store = _inputs(rng, 300, 40)
    tokens, counts = ta.dense_tokens(260, 40)
    got = ta.attention_tc(qa, store, tokens, tokens, counts, 0.2).astype(np.float32)
    want = ta.reference_f64(qa, store, tokens, tokens, counts, 0.2)
    # P in bf16 (8 bits) bounds the error by a few bf16 ulps of the outputs' scale, not of each (cancelled) value
    assert np.abs(got - want).max() < 2 ** -7 * np.abs(want).max()


def test_refuses_what_it_cannot_do():
    qa, store = _inputs(np.random.default_rng(4), 10, 1)
    t, c = ta.dense_tokens(0, 1)
    with pytest.raises(ValueError, match="bfloat16"):
        ta.attention_tc(qa.astype(np.float32), store, t, t, c, 1.0)
    with pytest.raises(ValueError, match="multiple of 16"):
        ta.attention_tc(qa[..., :8], store[:, :8], t, t, c, 1.0)
    with pytest.raises(ValueError, match="counts"):
        ta.attention_tc(qa, store, t, t, np.array([1, 1], np.int32), 1.0)
