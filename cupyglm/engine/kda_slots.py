"""The KDA states of captured decode calls (engine/graph_capture.py): per KDA layer 16 state slots at fixed
addresses, and which sequence sits in which slot.

Ownership (what must stay true):
* A slot belongs to at most one sequence (its owner, held by weak reference: a dropped SeqState frees it). A
  sequence owns at most one slot index, the same in every KDA layer.
* While a sequence is seated, its SeqState.kda_state[layer] / kda_conv[layer] ARE views of its slot in that layer
  (contiguous [H, K, K] fp32 / [taps - 1, 3HK] bf16), and only a replay of a call holding that sequence writes
  them, in place. Everything else that reads a state by address or by value keeps working: the kept-state walk
  (kv/kept.py) copies from and restores into the addresses the state holds, the verify snapshot copies, the disk
  tier copies kept pages.
* Any eager step (a prompt chunk, a mixed or oversized call, a verify rollback restoring a snapshot) replaces the
  state's arrays with new ones out of place: the sequence has then left its slot in those layers. Before a
  replay each layer checks by address that every sequence of the call is in its slot and copies it in (one copy
  per array) when it is not.
* A seat is kept while its owner lives, across calls and buckets (the bucket only bounds the rows, not the
  slots). A sequence without a seat takes a free slot, else the slot of an owner absent from the call, which is
  evicted first: its arrays still in the slot are copied out to its own arrays. So a slot's bytes change only
  through its owner's calls, and a state moves only when the batch's composition changes.
* A released sequence (runner.release: the request finished or was aborted) vacates its seat at once, with no
  copy: its bytes are never read again, and its SeqState drops its views of the slot (a later read of them fails
  by name instead of reading the slot's next owner). A sequence kept as a prompt-cache entry (kv/kept.py) keeps
  its seat and needs no copy-out either: a keep runs in the step whose rows reached its length, after that step's
  forward and before any later call can seat another sequence, and the walk copies the slot's bytes from the
  addresses the state holds (engine._run: a message's releases first, its keeps after its rows); the entry's
  bytes are then the arena's, so the slot may be reused once the sequence is released. So an eviction copies out
  only a sequence that lives on and may run again, never a released one.
* The call's table seg [B, 3] int32 (row0, n, slot) per sequence (its rows in order), padding rows (r, 1, -1) on a
  zero state with nothing written back, the rest (0, 0, -1); uploaded once per call, read by every layer's graph.
Device memory: 16 x (H K K fp32 + (taps - 1) 3HK bf16) per KDA layer and the per-bucket tables, counted by the
memory plan (`cupyglm.memory.graph_slot_arrays`) when graphs are on.
"""
from __future__ import annotations

import weakref

import numpy as np

from cupyglm.kv.copy_hooks import address_of

SLOTS = 16          # = the largest bucket: every sequence of a captured call has its own slot


class KDASlots:
    def __init__(self, xp, n: int = SLOTS):
        """n: slots per KDA layer, at least the sequences of any captured call (fewer only in tests: evictions)."""
        self.xp, self.n = xp, n
        self.S: dict[int, object] = {}         # layer -> [n, H, K, K] fp32
        self.W: dict[int, object] = {}         # layer -> [n, taps - 1, 3HK] bf16
        self.owner: list = [None] * n      # slot -> weakref to its SeqState (None: free)
        self.seg: dict[int, object] = {}       # bucket B -> [B, 3] int32, this call's table
        self.warm: dict[int, object] = {}      # bucket B -> [B, 3] int32, every row padding (warm-ups)
        self.done: dict[int, object] = {}      # bucket B -> [B, H] int32 zeros: kda_step_slots' counters
        self.call = None                       # the segment list seated last (one object per forward call)
        self.slot_of: dict[int, int] = {}      # id(state) -> slot, for the call seated last
        self.moves = 0                         # arrays copied into slots
        self.evictions = 0                     # owners copied out of their slot to seat another sequence
        self.releases = 0                      # seats vacated by a release (no copy)

    def _seated(self, st) -> int | None:
        for i, ref in enumerate(self.owner):
            if ref is not None and ref() is st:
                return i
        return None

    def seat(self, segs, rows: int, b: int) -> None:
        """Give each sequence of this call (its first layer to ask) a slot, and upload the call's table."""
        if segs is self.call:
            return
        self.call, self.slot_of = segs, {}
        present = {id(s.state) for s in segs}
        if len(present) > self.n:
            raise ValueError(f"a captured call of {len(present)} sequences exceeds the {self.n} KDA slots")
        for s in segs:
            i = self._seated(s.state)
            if i is not None:
                self.slot_of[id(s.state)] = i
        taken = set(self.slot_of.values())
        for s in segs:
            if id(s.state) in self.slot_of:
                continue
            free = [i for i in range(self.n) if i not in taken]
            dead = [i for i in free if self.owner[i] is None or self.owner[i]() is None]
            i = dead[0] if dead else next(i for i in free if id(self.owner[i]()) not in present)
            if not dead:
                self._evict(i)
            self.owner[i] = weakref.ref(s.state)
            self.slot_of[id(s.state)] = i
            taken.add(i)
        table = [(s.off, s.n, self.slot_of[id(s.state)]) for s in segs]
        table += [(r, 1, -1) for r in range(rows, b)]
        table += [(0, 0, -1)] * (b - len(table))
        if b not in self.seg:
            self.seg[b] = self.xp.zeros((b, 3), dtype=np.int32)
            self.warm[b] = self.xp.asarray(np.array([(r, 1, -1) for r in range(b)], dtype=np.int32))
        _upload(self.seg[b], np.asarray(table, dtype=np.int32))         # one upload per call

    def release(self, st) -> None:
        """A finished sequence leaves its seat (no copy: its state is never read again) and drops its views of the
        slot; nothing happens for a sequence without a seat."""
        i = self._seated(st)
        if i is None:
            return
        for layer, S in self.S.items():
            if layer in st.kda_state and address_of(st.kda_state[layer]) == address_of(S[i]):
                del st.kda_state[layer]
            if layer in st.kda_conv and address_of(st.kda_conv[layer]) == address_of(self.W[layer][i]):
                del st.kda_conv[layer]
        self.owner[i] = None
        if self.call is not None and any(s.state is st for s in self.call):
            self.call, self.slot_of = None, {}                     # the next forward seats afresh
        self.releases += 1

    def _evict(self, i: int) -> None:
        """The owner of slot i gets its own copies of whatever of its state still sits in the slot."""
        st = self.owner[i]()
        for layer, S in self.S.items():
            if address_of(st.kda_state[layer]) == address_of(S[i]):
                st.kda_state[layer] = S[i].copy()
            if address_of(st.kda_conv[layer]) == address_of(self.W[layer][i]):
                st.kda_conv[layer] = self.W[layer][i].copy()
        self.owner[i] = None
        self.evictions += 1

    def move_in(self, layer: int, segs) -> None:
        """Every sequence of the seated call into its slot of `layer` (a copy only where it is not there)."""
        xp = self.xp
        for s in segs:
            st, i = s.state, self.slot_of[id(s.state)]
            state, conv = st.kda_state[layer], st.kda_conv[layer]
            if layer not in self.S:
                self.S[layer] = xp.zeros((self.n,) + tuple(state.shape), dtype=state.dtype)
                self.W[layer] = xp.zeros((self.n,) + tuple(conv.shape), dtype=conv.dtype)
            S, W = self.S[layer], self.W[layer]
            if address_of(state) != address_of(S[i]):
                S[i] = state
                st.kda_state[layer] = S[i]
                self.moves += 1
            if address_of(conv) != address_of(W[i]):
                W[i] = conv
                st.kda_conv[layer] = W[i]
                self.moves += 1

    def args(self, layer: int, b: int, warm: bool = False) -> tuple:
        """KDALayer's slots argument: (S, window, seg, done) of `layer` for bucket b (warm: all rows padding)."""
        S = self.S[layer]
        if b not in self.done:
            self.done[b] = self.xp.zeros((b, S.shape[1]), dtype=np.int32)
        return S, self.W[layer], (self.warm if warm else self.seg)[b], self.done[b]

    def nbytes(self) -> int:
        """Bytes the slots and the per-bucket tables hold now (`memory.graph_slot_arrays` counts them at most)."""
        arrays = [*self.S.values(), *self.W.values(), *self.seg.values(), *self.warm.values(), *self.done.values()]
        return sum(int(a.nbytes) for a in arrays)


def _upload(dst, host: np.ndarray) -> None:
    """host -> dst in one copy (a device array's set; an array of a CPU backend in place)."""
    if isinstance(dst, np.ndarray):
        dst[...] = host
    else:
        dst.set(host)
