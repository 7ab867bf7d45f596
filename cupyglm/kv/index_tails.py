"""The index tails of every live sequence: per indexed KV layer one array of slots, a slot per sequence, so one
index_tail_pool launch serves a whole forward call (the call's segment table names each sequence's slot) and the
addresses never change (what a captured launch needs).

Ownership (what must stay true):
* A slot belongs to at most one sequence (its owner, held by weak reference; a dropped SeqState frees it through a
  finalizer). A sequence owns at most one slot index (`SeqState.tail_slot`), the same in every layer; it takes
  the lowest free one when its first rows are written (the call's maps, model/seg_device.py) or a kept state is
  restored into it, and the slot's bytes are zeros then.
* While a sequence owns a slot, its SeqState.index_tail[layer] IS the pair of views (ik, ig) [kpool, I] of its
  slot in that layer: the kept-state walk (kv/kept.py) copies from and restores into those addresses, the verify
  snapshot copies them, and every replacement of a tail (a verify rollback, the proposer's restore) is a copy
  into the views, in place. A pair set from outside (a test's arrays) is copied into the slot by `of` before the
  kernel writes it. A layer's bytes in the slot stay zeros until the sequence first writes or restores that layer
  (a rollback to before that layer's first write zeros them again).
* A released sequence (runner.release / GLMModel.release) frees its slot at once, without a copy, and its
  SeqState drops its views (a later read of them fails by name instead of reading the slot's next owner).
* Capacity is fixed at construction: the engine builds the store for its `parallel` running sequences (the memory
  plan counts those slots); taking a slot when all are held raises OutOfTailSlots.
Device memory: `cupyglm.memory.index_tail_array` (2 x layers x slots x kpool x I bf16), zeros.
"""
from __future__ import annotations

import heapq
import weakref

from cupyglm.kv.copy_hooks import address_of
from cupyglm.memory import alloc, index_tail_array

TAIL_SLOTS = 16     # a store built outside the engine: the largest captured bucket


class OutOfTailSlots(RuntimeError):
    pass


class IndexTails:
    def __init__(self, cfg, xp, storage, slots: int, layers: tuple[int, ...]):
        if slots < 1:
            raise ValueError(f"index tails need at least one slot, got {slots}")
        self.slots, self.layers = slots, tuple(layers)
        self.all = alloc(xp, index_tail_array(cfg, slots, self.layers), storage)   # [2, L, slots, kpool, I] bf16
        at = {layer: i for i, layer in enumerate(self.layers)}
        self.ik = {layer: self.all[0, i] for layer, i in at.items()}              # layer -> [slots, kpool, I] bf16
        self.ig = {layer: self.all[1, i] for layer, i in at.items()}
        self._free = list(range(slots))                                          # min-heap of free slots
        self.owner: list = [None] * slots                                        # slot -> weakref to its SeqState
        self._final: list = [None] * slots                                       # slot -> its owner's finalizer

    @property
    def free_count(self) -> int:
        return len(self._free)

    def slot_of(self, st) -> int | None:
        """The slot `st` owns in this store, else None."""
        i = getattr(st, "tail_slot", None)
        if i is None or not 0 <= i < self.slots or self.owner[i] is None or self.owner[i]() is not st:
            return None
        return i

    def slot(self, st) -> int:
        """The slot of `st`, the lowest free one (zeroed) taken if it has none."""
        i = self.slot_of(st)
        if i is not None:
            return i
        if not self._free:
            raise OutOfTailSlots(f"index tails: all {self.slots} slots are held by live sequences (the KV store "
                                 f"was built for {self.slots} running sequences; release finished ones)")
        i = heapq.heappop(self._free)
        self.all[:, :, i] = 0
        self.owner[i] = weakref.ref(st)
        self._final[i] = weakref.finalize(st, self._vacate, i)
        st.tail_slot = i
        return i

    def of(self, st, layer: int) -> tuple:
        """st.index_tail[layer] as the views of its slot (taking one); a pair held elsewhere is copied in first."""
        i = self.slot(st)
        views = (self.ik[layer][i], self.ig[layer][i])
        held = st.index_tail.get(layer)
        if held is not None and address_of(held[0]) == address_of(views[0]) \
                and address_of(held[1]) == address_of(views[1]):
            return held
        if held is not None:
            for dst, src in zip(views, held):
                dst[...] = src
        st.index_tail[layer] = views
        return views

    def release(self, st) -> None:
        """A finished sequence frees its slot (no copy) and drops its views; nothing for one without a slot."""
        i = self.slot_of(st)
        if i is None:
            return
        for layer in self.layers:
            held = st.index_tail.get(layer)
            if held is not None and address_of(held[0]) == address_of(self.ik[layer][i]):
                del st.index_tail[layer]
        st.tail_slot = None
        self._final[i].detach()
        self._vacate(i)

    def _vacate(self, i: int) -> None:
        self.owner[i], self._final[i] = None, None
        heapq.heappush(self._free, i)
