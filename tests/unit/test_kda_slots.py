"""KDA seats (engine/kda_slots.py) on plain CPU data, numpy as xp: exact slot ids after seats, releases, keeps and
evictions, the copies counted, and every sequence's bits kept (a replay's in-place write is played by adding to
the seated slot rows; the kept state is copied by the real walk, kv/kept.py)."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.config import preset
from cupyglm.kv.kept import KeptStore
from cupyglm.kv.state import new_index_tail
from cupyglm.kv.state import SeqState
from cupyglm.kv.store import KVStore
from cupyglm.memory import alloc, kda_state_arrays, storage_of
from cupyglm.model.batch import Segment
from cupyglm.engine.kda_slots import KDASlots

CFG = preset("tiny")
OPS = NumpyOps()


def _state(seed: int) -> SeqState:
    """A sequence's KDA states filled with values of its own (a fresh state is zeros)."""
    st, rng = SeqState(), np.random.default_rng(seed)
    for layer in CFG.kda_layers:
        for d, spec in zip((st.kda_state, st.kda_conv), kda_state_arrays(CFG, 1, layer)):
            a = alloc(np, spec, storage_of(OPS))
            a[...] = rng.integers(-8, 8, a.shape).astype(a.dtype)
            d[layer] = a
    return st


def _bits(st: SeqState) -> list[bytes]:
    return [d[layer].tobytes() for layer in CFG.kda_layers for d in (st.kda_state, st.kda_conv)]


def _replay(slots: KDASlots, states: list) -> None:
    """One captured decode call of `states` (one row each): seat, move in, then each layer's in-place step."""
    segs = [Segment(state=s, start=0, n=1, off=i, decode=True) for i, s in enumerate(states)]
    slots.seat(segs, len(segs), max(2, len(segs)))
    for layer in CFG.kda_layers:
        slots.move_in(layer, segs)
        for s in segs:
            i = slots.slot_of[id(s.state)]
            slots.S[layer][i] += 1.0
            slots.W[layer][i] += 1


def _stepped(st: SeqState) -> list[bytes]:
    """What `st`'s bits become after one _replay."""
    out = []
    for layer in CFG.kda_layers:
        out += [(st.kda_state[layer] + 1.0).tobytes(), (st.kda_conv[layer] + 1).tobytes()]
    return out


def test_a_released_sequence_vacates_its_seat_without_a_copy():
    slots = KDASlots(np, n=2)
    a, b, c = _state(1), _state(2), _state(3)
    _replay(slots, [a, b])
    assert [slots._seated(a), slots._seated(b)] == [0, 1]
    assert (slots.moves, slots.evictions) == (4 * len(CFG.kda_layers), 0)
    slots.release(a)                    # finished; the engine's tables may still hold it
    assert slots.owner[0] is None and slots.releases == 1
    assert not a.kda_state and not a.kda_conv           # no view of a slot its next owner will write
    want_b, want_c = _stepped(b), _stepped(c)
    _replay(slots, [c, b])
    assert [slots._seated(c), slots._seated(b)] == [0, 1]
    assert slots.evictions == 0                          # the wasted copy-out of a finished sequence is gone
    assert slots.moves == 6 * len(CFG.kda_layers)        # c's two arrays per layer moved in, b stayed
    assert _bits(b) == want_b and _bits(c) == want_c
    slots.release(SeqState())                            # a sequence without a seat: nothing to do
    assert slots.releases == 1


def test_a_live_sequence_absent_from_a_call_is_evicted_with_its_bits():
    slots = KDASlots(np, n=2)
    a, b, c = _state(1), _state(2), _state(3)
    _replay(slots, [a, b])
    want_a = _bits(a)
    _replay(slots, [c, b])                               # a lives on: its slot is taken, a copied out first
    assert [slots._seated(c), slots._seated(b), slots._seated(a)] == [0, 1, None]
    assert slots.evictions == 1 and _bits(a) == want_a
    want_a = _stepped(a)
    _replay(slots, [a, b])                               # a back: c (absent) evicted, a moved into slot 0
    assert [slots._seated(a), slots._seated(b)] == [0, 1] and slots.evictions == 2
    assert _bits(a) == want_a


@pytest.mark.parametrize("released", [False, True])
def test_a_kept_state_is_copied_by_the_walk_and_keeps_its_seat(released):
    """The keep after a step copies the slot's bytes through the walk (no copy-out); after its release the slot
    goes to a new sequence, and the kept entry still restores every bit."""
    kv = KVStore(CFG, OPS, 4, CFG.page_tokens)
    kept = KeptStore(CFG, OPS, kv, 1, 1 << 22)
    slots = KDASlots(np, n=2)
    a, b, c = _state(1), _state(2), _state(3)
    for st in (a, b, c):
        st.index_tail = {layer: new_index_tail(np, CFG, storage_of(OPS).bf16) for layer in CFG.dsa_layers}
    _replay(slots, [a, b])
    want = _bits(a)
    kept.keep(7, a, range(kept.pages_for(a.length)))   # a is seated: the walk reads its slot's addresses
    assert slots._seated(a) == 0 and (slots.moves, slots.evictions) == (4 * len(CFG.kda_layers), 0)
    if released:
        slots.release(a)
    _replay(slots, [c, b])               # slot 0 rewritten by c
    assert slots._seated(c) == 0
    assert slots.evictions == (0 if released else 1)
    fresh = _state(9)
    fresh.index_tail = {}
    kept.restore(7, fresh)
    assert _bits(fresh) == want
