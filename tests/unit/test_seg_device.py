"""model/seg_device.CallMaps: the call's row maps built on the host equal kv/store.py's rows, in one array."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.numpy_ops import NumpyOps, paged_rows
from cupyglm.kv.host_attend import token_rows
from cupyglm.model import seg_device
from cupyglm.model.batch import segments


class _KV:
    """The parts of KVStore the maps read (its rows arithmetic)."""
    def __init__(self, cfg, page_tokens):
        from cupyglm.kv.store import KVStore
        self.cfg, self.page_tokens = cfg, page_tokens
        self.rows = lambda pages, pos: KVStore.rows(self, pages, pos)
        self.pool_rows = lambda pages, pools: KVStore.pool_rows(self, pages, pools)
        self.tails = _Tails()


class _Tails:
    """The index tails' slot of each state (kv/index_tails.py): the next free one, in order of first ask."""
    def __init__(self):
        self.of = {}

    def slot(self, st) -> int:
        return self.of.setdefault(id(st), len(self.of))


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
    # every segment's page table once, zero padded to the width bucket of the most pages (4); each row names its
    # segment's table row
    assert maps.table.shape == (3, 4) and maps.table.dtype == np.int32
    assert maps.table.tolist() == [[5, 2, 9, 0], [7, 0, 0, 0], [1, 3, 4, 0]]
    # every segment's pooled-key rows: its sequence's pools 0..V-1 (V: the segment's last row's), then its pool 0;
    # the width is the bucket of the call's largest V (13 -> 16), rows through the same segment index
    assert maps.pool_table.shape == (3, 16) and maps.pool_table.dtype == np.int32
    assert maps.seg.dtype == np.int32 and maps.seg.tolist() == [0, 1, 1, 2, 2, 2, 2]
    for j, (s, v) in enumerate(zip(segs, [10, 1, 13])):
        want = kv.pool_rows(s.state.pages, np.arange(v)).tolist()
        want += kv.pool_rows(s.state.pages, np.zeros(16 - v, np.int64)).tolist()
        assert maps.pool_table[j].tolist() == want
    tokens = np.full((7, 6), -1, np.int32)
    tokens[0, :3] = [0, 17, 40]
    tokens[6, :2] = [63, 49]
    rows = token_rows(maps, np, tokens)
    assert rows[0, :4].tolist() == kv.rows([5, 2, 9], np.array([0, 17, 40, -1])).tolist()
    assert rows[6, :2].tolist() == kv.rows([1, 3, 4, 0], np.array([63, 49])).tolist()
    assert np.array_equal(rows, paged_rows(tokens, maps.table, maps.seg, 16))


def test_width_buckets():
    assert [seg_device.width_bucket(n) for n in (0, 1, 2, 3, 4, 5, 16, 17, 1000)] == [1, 1, 2, 4, 4, 8, 16, 32, 1024]
    kv = _KV(_Cfg(), 16)
    segs = segments([_State([5, 2, 9, 1, 6]), _State([7])], [70, 2], [1, 1], [True, True])
    maps = seg_device.call_maps(segs, kv, np)
    assert maps.table.shape == (2, 8) and maps.table[0].tolist() == [5, 2, 9, 1, 6, 0, 0, 0]
    assert maps.pool_table.shape == (2, 32) and maps.seg.tolist() == [0, 1]           # 17 visible pools -> 32
    assert maps.pool_table[1].tolist() == [kv.pool_rows([7], [0])[0]] * 32                 # no pool visible yet


def test_a_prompt_chunk_uploads_one_table_row_of_each():
    # one decode row and 64 prompt rows from position 64: the one upload holds each segment's page table and pool
    # table once (S * width and S * Pw entries), never a copy per row (T * width)
    kv = _KV(_Cfg(), 16)
    segs = segments([_State([9]), _State(list(range(8)))], [5, 64], [1, 64], [True, False])
    maps = seg_device.call_maps(segs, kv, np)
    t, s, width, pw = 65, 2, 8, 32                                          # 32 visible pools -> 32
    assert maps.table.shape == (s, width) and maps.pool_table.shape == (s, pw)
    assert maps.seg.tolist() == [0] + [1] * 64
    upload = maps.latent.base                                               # the one device array of the call
    assert all(a.base is upload for a in (maps.positions, maps.seg, maps.table, maps.pool_table, maps.tail_seg))
    done = 32 - 16                                                          # the chunk completes pools 16..31
    assert upload.size == 3 * t + s * width + s * pw + done + s * 5 < 3 * t + t * width


def test_call_maps_refuse_a_shared_latent_row():
    kv = _KV(_Cfg(), 16)
    segs = segments([_State([3]), _State([3])], [0, 0], [1, 1], [True, True])
    with pytest.raises(ValueError, match="one latent row"):
        seg_device.call_maps(segs, kv, np)


def test_attention_paged_equals_attention_through_rows():
    rng = np.random.default_rng(0)
    ops = NumpyOps()
    table = np.array([[2, 0], [1, 3]], np.int32)                        # [S, width] two segments' page tables
    seg = np.array([1, 0, 1], np.int32)                                 # rows 0 and 2 share segment 1's
    tokens = np.array([[0, 5, 20, -1], [3, 17, -1, -1], [16, 1, -1, -1]], np.int32)
    counts = np.array([3, 2, 2], np.int32)
    assert paged_rows(tokens, table, seg, 16).tolist() == [[16, 21, 52, -1], [35, 1, -1, -1], [48, 17, -1, -1]]
    store = ops.bf16_full((64, 8), 0.0)
    store[:] = rng.standard_normal((64, 8)).astype(np.float32)
    qa = ops.bf16_full((3, 2, 8), 0.0)
    qa[:] = rng.standard_normal((3, 2, 8)).astype(np.float32)
    got = ops.attention_paged(qa, store, tokens, table, seg, 16, counts, 0.3, 2, decode=3)   # decode rows
    want = ops.attention(qa, store, paged_rows(tokens, table, seg, 16), counts, 0.3, 2, decode=3)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    with pytest.raises(ValueError, match="seg"):
        paged_rows(tokens, table, seg[:2], 16)


def test_attention_paged_prompt_rows_run_the_tensor_core_model():
    """Rows past `decode` are prompt rows: backend/tc_attention.py over the same store rows; the decode row as
    attention's list order."""
    from cupyglm.backend import tc_attention

    rng = np.random.default_rng(1)
    ops = NumpyOps()
    table = np.array([[2, 0, 5], [1, 3, 4]], np.int32)
    seg = np.array([0, 1, 1], np.int32)
    tokens = np.array([[0, 5, 20, 33], [3, 17, 40, -1], [0, 1, 2, -1]], np.int32)
    counts = np.array([4, 3, 3], np.int32)
    store = ops.bf16_full((96, 16), 0.0)
    store[:] = rng.standard_normal((96, 16)).astype(np.float32)
    qa = ops.bf16_full((3, 5, 16), 0.0)
    qa[:] = rng.standard_normal((3, 5, 16)).astype(np.float32)
    rows = paged_rows(tokens, table, seg, 16)
    got = ops.attention_paged(qa, store, tokens, table, seg, 16, counts, 0.3, 2, decode=1)
    head = ops.attention(qa[:1], store, rows[:1], counts[:1], 0.3, 2, decode=1)
    tail = tc_attention.attention_tc(qa[1:], store, tokens[1:], rows[1:], counts[1:], 0.3)
    assert np.array_equal(got.view(np.uint16), np.concatenate([head, tail]).view(np.uint16))
