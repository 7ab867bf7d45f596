"""Contract cases of cuda_src/gather.cu (op kv_gather: mark, copy, remap, unmark) at the shapes a call
segment gathers at: a decode row, a verify window of 16 rows, a prompt chunk (the union of its picks), a
dense call (every visible row in order), and a call past its slots.

The store is NaN except for the rows the lists name, the lists are past their counts padded with a row no
call picks, and ids repeat within and across token rows. Slot numbers follow the kernels' atomics, so the
outputs are what a caller reads through them: the gathered rows slots[ids[t, j]] (NaN where ids is -1), the
padding, the slots claimed, every mark after the call (all -1), the flag words, and the rows of the used
slots as a sorted set. Controls: a stale mark left from an earlier call (input), a dropped row (copy), a
swapped slot (remap), a mark the unmark skips, and, past the slots, a row left claimed.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend import numpy_gather as ref
from cupyglm.backend.lanes import BF16, bf16
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gather

PAGE, R, FLAGS = 16, 64, 8


def _lists(rng, t: int, w: int, num_pages: int, start: int, dense: bool):
    """Token rows of one segment at positions start..start+t-1 through a shuffled page table: dense rows list
    positions 0..p in order, sparse rows a random subset (repeats across rows) of 0..p of width w."""
    pages = rng.permutation(num_pages).astype(np.int64)
    rows = np.full((t, w), -1, dtype=np.int32)
    counts = np.zeros((t,), dtype=np.int32)
    for i in range(t):
        p = start + i
        pos = np.arange(p + 1) if dense else np.sort(rng.choice(p + 1, size=min(w, p + 1) - 2, replace=False))
        n = pos.size
        rows[i, :n] = (pages[pos // PAGE] * PAGE + pos % PAGE).astype(np.int32)
        counts[i] = n
        rows[i, n:] = int(pages[-1]) * PAGE + PAGE - 1          # past the count: a row nobody picks
    return rows, counts


def _make(t: int, w: int, num_pages: int, start: int, slots: int, dense: bool = False, which: int = 3):
    def make(rng):
        rows, counts = _lists(rng, t, w, num_pages, start, dense)
        n = num_pages * PAGE
        store = np.full((n, R), np.nan, dtype=BF16)                # [N, R] bf16, NaN where unpicked
        picked = np.unique(rows[np.arange(w)[None, :] < counts[:, None]])
        store[picked] = bf16(rng.standard_normal((picked.size, R)).astype(np.float32))
        store[picked[::7], :3] = np.array([np.inf, -np.inf, np.nan], dtype=np.float32).astype(BF16)
        return {"store": store, "rows": rows, "counts": counts,
                "marks": np.full((n,), -1, dtype=np.int32), "slot_row": np.full((slots,), -7, dtype=np.int32),
                "slots": np.full((slots, R), np.nan, dtype=BF16), "flags": np.zeros((FLAGS,), dtype=np.int32),
                "which": np.int32(which)}
    return make


def _view(d: dict, ids, used: int, xp) -> dict:
    """What a caller reads: rows through the slot ids, the padding, the marks, the flags, the used rows."""
    ids = np.asarray(ids if xp is np else xp.asnumpy(ids))
    slots = d["slots"] if xp is np else xp.asnumpy(d["slots"])
    marks = np.asarray(d["marks"] if xp is np else xp.asnumpy(d["marks"]))
    slot_row = np.asarray(d["slot_row"] if xp is np else xp.asnumpy(d["slot_row"]))
    flags = np.asarray(d["flags"] if xp is np else xp.asnumpy(d["flags"]))
    slots = np.asarray(slots).view(np.uint16)
    got = np.where((ids >= 0)[..., None], slots[np.maximum(ids, 0)], np.uint16(0xFFFF))
    n = min(used, slot_row.shape[0])
    if used > slot_row.shape[0]:                  # past the slots: which rows got one follows the atomics
        return {"used": np.array([n], dtype=np.int32), "marks": marks, "flags": flags}
    return {"gathered": got, "pad": (ids < 0).astype(np.int32), "used": np.array([n], dtype=np.int32),
            "marks": marks, "flags": flags, "rows": np.sort(slot_row[:n])}


def _run_with(k, d: dict) -> dict:
    xp = k.xp
    used = xp.zeros((1,), dtype=np.int32)
    bound = ops_gather.bound_of(d["rows"], d["marks"], d["slot_row"])
    ops_gather.launch_mark(k, d["rows"], d["counts"], d["marks"], d["slot_row"], used, d["flags"], int(d["which"]))
    ops_gather.launch_copy(k, d["store"], d["slot_row"], used, d["slots"], bound)
    ids = ops_gather.launch_remap(k, d["rows"], d["counts"], d["marks"])
    ops_gather.launch_unmark(k, d["slot_row"], used, d["marks"], bound)
    return _view(d, ids, int(used[0]), xp)


def _replay(d: dict) -> dict:
    used = ref.mark(d["rows"], d["counts"], d["marks"], d["slot_row"], d["flags"], int(d["which"]))
    ref.copy(d["store"], d["slot_row"], used, d["slots"])
    ids = ref.remap(d["rows"], d["counts"], d["marks"])
    ref.unmark(d["slot_row"], used, d["marks"])
    return _view(d, ids, used, np)


def _stale_input(k, d: dict) -> dict:
    """A mark left by an earlier call: that row is never copied into this call's slots."""
    marks = d["marks"]
    r = int(d["rows"][0, 0])
    marks[r] = 0
    return _run_with(k, d)


def _variant(define: str):
    def ctl(k, d):
        return _run_with(k.variant(define), d)
    return ctl


def _gather(label: str, make, control, note: str = "") -> Case:
    return case(Case(f"kv_gather[{label}]", ("gather_mark", "gather_copy", "gather_remap", "gather_unmark"),
                     make, _run_with, _replay, control))


#        label           rows  width pages start slots        control
_gather("decode",   _make(1,    35,  8,    90,   64), _stale_input)
_gather("verify16", _make(16,   35,  8,    96,  128), _variant("GATHER_CONTROL_SWAP_SLOT"))
_gather("prompt48", _make(48,   35,  10,   80,  160), _variant("GATHER_CONTROL_DROP_ROW"))
_gather("dense",    _make(20,   34,  4,    0,    64, dense=True), _variant("GATHER_CONTROL_STALE_MARK"))
_gather("past-slots", _make(8,  35,  8,    90,   24), _variant("GATHER_CONTROL_LEAVE_CLAIMED"))
