"""model/seg_device.CallMaps: the call's row maps built on the host equal kv/store.py's rows, in one array."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.numpy_ops import NumpyOps, paged_rows
from cupyglm.model import seg_device
from cupyglm.model.batch import segments


class _KV:
    """The parts of KVStore the maps read (its rows arithmetic)."""
    def __init__(self, cfg, page_tokens):
        from cupyglm.kv.store import KVStore
        self.cfg, self.page_tokens = cfg, page_tokens
        self.rows = lambda pages, pos: KVStore.rows(self, pages, pos)
        self.pool_rows = lambda pages, pools: KVStore.pool_rows(self, pages, pools)


class _Cfg:
    index_kpool, index_pools = 4, 8


class _State:
    def __init__(self, pages):
        self.pages = pages


def test_call_maps_equal_the_store_rows():
    kv = _KV(_Cfg(), 16)
    states = [_State([5, 2, 9]), _State([7]), _State([1, 3, 4, 0])]
    segs = segments(states, [40, 3, 50], [1, 2, 4], [True, True, False])
    maps = seg_device.call_maps(segs, kv, np)
    assert seg_device.call_maps(segs, kv, np) is maps                       # built once per call
    for s in segs:
        assert maps.latent_of(s).tolist() == kv.rows(s.state.pages, s.positions).tolist()
        assert maps.positions_of(s).tolist() == s.positions.tolist()
    assert maps.table.shape == (7, 4) and maps.table[0, :3].tolist() == [5, 2, 9] and maps.table[1, 1] == 0
    assert set(maps.pools) == {0, 3}                                           # visible pools > 8: sparse segments
    assert maps.pools_of(segs[2]).tolist() == kv.pool_rows([1, 3, 4, 0], np.arange(13)).tolist()
    tokens = np.full((7, 6), -1, np.int32)
    tokens[0, :3] = [0, 17, 40]
    tokens[6, :2] = [63, 49]
    rows = seg_device.token_rows(maps, np, tokens)
    assert rows[0, :4].tolist() == kv.rows([5, 2, 9], np.array([0, 17, 40, -1])).tolist()
    assert rows[6, :2].tolist() == kv.rows([1, 3, 4, 0], np.array([63, 49])).tolist()
    assert np.array_equal(rows, paged_rows(tokens, maps.table, 16))


def test_call_maps_refuse_a_shared_latent_row():
    kv = _KV(_Cfg(), 16)
    segs = segments([_State([3]), _State([3])], [0, 0], [1, 1], [True, True])
    with pytest.raises(ValueError, match="one latent row"):
        seg_device.call_maps(segs, kv, np)


def test_attention_paged_equals_attention_through_rows():
    rng = np.random.default_rng(0)
    ops = NumpyOps()
    table = np.array([[2, 0], [1, 3]], np.int32)
    tokens = np.array([[0, 5, 20, -1], [3, 17, -1, -1]], np.int32)
    counts = np.array([3, 2], np.int32)
    store = ops.bf16_full((64, 8), 0.0)
    store[:] = rng.standard_normal((64, 8)).astype(np.float32)
    qa = ops.bf16_full((2, 2, 8), 0.0)
    qa[:] = rng.standard_normal((2, 2, 8)).astype(np.float32)
    got = ops.attention_paged(qa, store, tokens, table, 16, counts, 0.3, 2)
    want = ops.attention(qa, store, paged_rows(tokens, table, 16), counts, 0.3, 2)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
