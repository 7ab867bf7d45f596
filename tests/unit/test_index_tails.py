"""The KV store's index tails (kv/index_tails.py) on numpy: exact slot ids as sequences take, release and drop
their slots, a full store refused by name, a state's tails as views of its slot, and the verify rollback and the
kept-state restore writing into those views in place."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.config import preset
from cupyglm.engine.verify import restore, snapshot
from cupyglm.kv.copy_hooks import address_of
from cupyglm.kv.index_tails import OutOfTailSlots
from cupyglm.kv.kept import KeptStore
from cupyglm.kv.state import SeqState, new_index_tail
from cupyglm.kv.store import KVStore
from cupyglm.memory import alloc, index_tail_array, kda_state_arrays, storage_of, total_bytes

CFG = preset("tiny")
OPS = NumpyOps()
LAYER = CFG.dsa_layers[0]


def _store(slots: int) -> KVStore:
    return KVStore(CFG, OPS, 4, CFG.page_tokens, tail_slots=slots, mtp=False)


def _kda(st: SeqState) -> SeqState:
    """A state's KDA arrays (zeros), as GLMModel.new_state gives them: the kept walk copies them too."""
    for layer in CFG.kda_layers:
        spec = kda_state_arrays(CFG, 1, layer)
        st.kda_state[layer], st.kda_conv[layer] = (alloc(np, a, storage_of(OPS)) for a in spec)
    return st


def test_slots_taken_lowest_first_released_and_refused_when_full():
    kv = _store(3)
    t = kv.tails
    assert t.all.nbytes == total_bytes([index_tail_array(CFG, 3, CFG.dsa_layers)], storage_of(OPS))
    a, b, c, d = SeqState(), SeqState(), SeqState(), SeqState()
    assert [t.slot(a), t.slot(b), t.slot(c)] == [0, 1, 2] and t.slot(a) == 0 and t.free_count == 0
    with pytest.raises(OutOfTailSlots, match="all 3 slots"):
        t.slot(d)
    pair = t.of(b, LAYER)
    assert address_of(pair[0]) == address_of(t.ik[LAYER][1]) and address_of(pair[1]) == address_of(t.ig[LAYER][1])
    pair[0][...] = 5                                    # b's rows written in place
    t.release(b)                                        # no copy; b drops its views
    assert LAYER not in b.index_tail and b.tail_slot is None and t.free_count == 1
    assert t.slot(d) == 1 and not t.ik[LAYER][1].any()  # the freed slot, zeroed for its next owner
    del c
    gc.collect()                                        # a dropped state frees its slot (finalizer)
    assert t.free_count == 1 and t.slot(SeqState()) == 2
    t.release(SeqState())                               # a state without a slot: nothing to do


def test_a_pair_from_outside_is_copied_into_the_slot():
    kv = _store(2)
    st = SeqState()
    st.index_tail[LAYER] = new_index_tail(np, CFG, storage_of(OPS).bf16)
    st.index_tail[LAYER][1][...] = 3
    got = kv.tails.of(st, LAYER)
    assert st.tail_slot == 0 and got is st.index_tail[LAYER]
    assert address_of(got[1]) == address_of(kv.tails.ig[LAYER][0]) and (kv.tails.ig[LAYER][0] == 3).all()


def test_rollback_and_kept_restore_write_the_slot_in_place():
    kv = _store(4)
    t = kv.tails
    st = SeqState(length=6)
    views = t.of(st, LAYER)
    views[0][...] = 2
    snap = snapshot(st, np)
    views[0][1] = 9                                     # a verify row written in place
    other = CFG.dsa_layers[-1]
    t.of(st, other)[0][...] = 4                         # a layer first written after the snapshot
    restore(st, snap, np)
    assert st.index_tail[LAYER] is views and (t.ik[LAYER][0] == 2).all()     # the same addresses, the old bytes
    assert other not in st.index_tail and not t.ik[other][0].any()           # back to zeros, as never written
    kept = KeptStore(CFG, OPS, kv, 1, 1 << 22)
    st.length, st.pages = 7, kv.pool.lease(1)
    _kda(st)
    for layer in CFG.dsa_layers:
        t.of(st, layer)[0][...] = layer + 1
    kept.keep(1, st, range(kept.pages_for(st.length)))
    fresh = _kda(SeqState(pages=kv.pool.lease(1)))
    kept.restore(1, fresh)
    assert fresh.tail_slot == 1
    for layer in CFG.dsa_layers:
        ik = t.ik[layer][1]
        assert address_of(fresh.index_tail[layer][0]) == address_of(ik)
        assert (ik[:3] == layer + 1).all() and not ik[3:].any()              # 7 % 4 rows restored, the rest 0


def test_a_keep_takes_only_the_kept_pages_it_is_given():
    """No rank leases kept pages: a keep copies into rank 0's ids and refuses ids already held or too few."""
    kv = _store(2)
    kept = KeptStore(CFG, OPS, kv, 1, 1 << 22)
    st = _kda(SeqState(length=8, pages=kv.pool.lease(1)))             # 8 % 4 = 0: no tail rows written
    n = kept.pages_for(st.length)
    entry = kept.keep(1, st, range(3, 3 + n))
    assert entry.kept.pages == tuple(range(3, 3 + n)) and kept.pool.free_count == kept.pool.num_pages - n
    with pytest.raises(ValueError, match="not free"):
        kept.keep(2, st, range(3, 3 + n))
    with pytest.raises(ValueError, match="needs"):
        kept.keep(2, st, range(3 + n, 3 + 2 * n + 1))
    kept.drop(1)
    assert kept.pool.free_count == kept.pool.num_pages
