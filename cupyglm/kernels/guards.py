"""Launcher preconditions on ids and positions (in range, distinct write ids, the pick's rows), checked where
the arrays live, never by a host sync of a device array.

* A host (numpy) array (numpy and sim backends): checked on the host at once; ValueError naming the kernel and
  the parameter, as before.
* A device array (cuda): the guarded kernel itself (cuda_src/check_flag.cuh: kv.cu, pick.cu, the grouped gemv)
  or a kernel of cuda_src/checks.cu counts the violations into a slot of the Kernels' flags buffer
  ([MAX_SLOTS, 2] u32: count, ~first index) and nothing waits. `raise_pending(k)` reads the
  buffer once (after the step, ModelRunner.forward) and raises DeviceCheckError naming every failed check.
The guarded kernels stay memory-safe on bad input (they skip the row or write NaN / -1).
"""
from __future__ import annotations

import weakref

import numpy as np

from cupyglm.kernels.ops import Kernels, check, i32

SRC = "checks.cu"
THREADS = 128
MAX_SLOTS = 64                     # distinct checks (kernel, parameter, limit) one Kernels can hold
PICK_MESSAGES = ("pick: parameter positions holds a negative position",
                 "pick: parameter width is too small for a row's position",
                 "pick: parameter scores has fewer pools than a row sees")


class DeviceCheckError(ValueError):
    """A launcher precondition failed on the device; the message names each check, its count, first index."""


class Guards:
    """The flags buffer of one Kernels and the message of each slot."""

    def __init__(self, k: Kernels):
        self.k = k
        self.flags = None                       # [MAX_SLOTS, 2] u32 on the device, made at the first check
        self.messages: list[str] = []

    def slot(self, *messages: str) -> int:
        """The first of len(messages) consecutive slots holding these messages (allocated on first use)."""
        for s in range(len(self.messages) - len(messages) + 1):
            if tuple(self.messages[s:s + len(messages)]) == messages:
                return s
        if len(self.messages) + len(messages) > MAX_SLOTS:
            raise RuntimeError(f"guards: more than {MAX_SLOTS} distinct device checks")
        self.messages.extend(messages)
        if self.flags is None:
            self.flags = self.k.xp.zeros((MAX_SLOTS, 2), dtype=np.uint32)
        return len(self.messages) - len(messages)

    def take(self, host=None) -> list[str]:
        """Read the flags once (the one sync; `host`: a copy already read), clear them; the failed checks' lines."""
        if self.flags is None:
            return []
        if host is None:
            host = self.k.xp.asnumpy(self.flags) if self.k.xp is not np else self.flags.copy()
        if not host[:, 0].any():
            return []
        self.flags[...] = 0
        return [f"{m} ({int(host[s, 0])} of them, the first at index {int(~host[s, 1] & 0xFFFFFFFF)})"
                for s, m in enumerate(self.messages) if host[s, 0]]


_GUARDS: "weakref.WeakKeyDictionary[Kernels, Guards]" = weakref.WeakKeyDictionary()


def guards_of(k: Kernels) -> Guards:
    g = _GUARDS.get(k)
    if g is None:
        g = _GUARDS[k] = Guards(k)
    return g


def raise_pending(k: Kernels) -> None:
    """Raise DeviceCheckError if a device check of k failed since the last call (reads the flags once)."""
    lines = guards_of(k).take()
    if lines:
        raise DeviceCheckError("; ".join(lines))


def fetch_checked(k: Kernels, x) -> np.ndarray:
    """x (a 4-byte dtype) on the host with the flags in the same device-to-host transfer; raises
    DeviceCheckError if a check failed (before anyone reads x)."""
    g, xp = guards_of(k), k.xp
    if g.flags is None or xp is np:
        lines = g.take()
        if lines:
            raise DeviceCheckError("; ".join(lines))
        return xp.asnumpy(x) if xp is not np else np.array(x)
    if x.dtype.itemsize != 4:
        raise ValueError(f"fetch_checked: x must have a 4-byte dtype, got {x.dtype}")
    nf = g.flags.size
    both = xp.concatenate([g.flags.reshape(-1), xp.ascontiguousarray(x).reshape(-1).view(xp.uint32)])
    host = xp.asnumpy(both)
    lines = g.take(host[:nf].reshape(g.flags.shape))
    if lines:
        raise DeviceCheckError("; ".join(lines))
    return host[nf:].view(x.dtype).reshape(x.shape)


# ---- the kernels (also the contract's entry points) -----------------------------------------------------------
def launch_range(k: Kernels, ids, flags, limit: int, slot: int) -> None:
    check("check_ids_range", "ids", ids, (None,), np.int32)
    check("check_ids_range", "flags", flags, (None, 2), np.uint32)
    n = ids.shape[0]
    if n:
        k.launch(SRC, "check_ids_range", (-(-n // THREADS),), (THREADS,), (ids, flags, i32(n), i32(limit), i32(slot)))


def launch_distinct(k: Kernels, ids, flags, slot: int) -> None:
    check("check_ids_distinct", "ids", ids, (None,), np.int32)
    check("check_ids_distinct", "flags", flags, (None, 2), np.uint32)
    n = ids.shape[0]
    if n > 1:
        k.launch(SRC, "check_ids_distinct", (-(-n // THREADS),), (THREADS,), (ids, flags, i32(n), i32(slot)))


# ---- what the launchers call ----------------------------------------------------------------------------------
def ids_in_range(k: Kernels, kernel: str, param: str, ids, limit: int, what: str = "ids") -> None:
    """Every id in [0, limit): at once for a host array, on the device (reported later) for a device array."""
    if isinstance(ids, np.ndarray):
        if ids.size:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= limit:
                raise ValueError(f"{kernel}: parameter {param} holds {what} outside [0, {limit}): {lo}..{hi}")
        return
    g = guards_of(k)
    s = g.slot(f"{kernel}: parameter {param} holds {what} outside [0, {limit})")
    launch_range(k, ids, g.flags, limit, s)


def range_slot(k: Kernels, kernel: str, param: str, ids, limit: int, what: str = "ids"):
    """For a kernel that checks the ids it reads itself (cuda_src/check_flag.cuh): (flags, slot) to pass it. A host
    array is checked here at once (ValueError) and gets a zeroed one-slot buffer and slot -1; a device array the
    Kernels' flags buffer and the slot of ids_in_range's message, read with the step's other checks."""
    if isinstance(ids, np.ndarray):
        ids_in_range(k, kernel, param, ids, limit, what)
        return k.xp.zeros((1, 2), dtype=np.uint32), -1
    g = guards_of(k)
    slot = g.slot(f"{kernel}: parameter {param} holds {what} outside [0, {limit})")     # makes g.flags
    return g.flags, slot


def kernel_guard(k: Kernels, kernel: str, param: str, ids, limit: int, what: str, own: bool):
    """(flags, slot) for a kernel that can count bad ids itself: range_slot's when it checks them (own), else a
    zeroed one-slot buffer and slot -1 (the ids were checked by ids_in_range)."""
    if own:
        return range_slot(k, kernel, param, ids, limit, what)
    return k.xp.zeros((1, 2), dtype=np.uint32), -1


def ids_distinct(k: Kernels, kernel: str, param: str, ids) -> None:
    """No id twice (write ids: the order of two writes would decide the row)."""
    if isinstance(ids, np.ndarray):
        if np.unique(ids).size != ids.size:
            raise ValueError(f"{kernel}: parameter {param} repeats a row id (the write order would decide it)")
        return
    g = guards_of(k)
    s = g.slot(f"{kernel}: parameter {param} repeats a row id (the write order would decide it)")
    launch_distinct(k, ids, g.flags, s)


def pick_slot(k: Kernels, positions, p: int, npools: int, kpool: int, width: int):
    """The pick's rows: positions >= 0, each row's list fits width, a sparse row's pools fit the scores. A host
    array is checked here at once (ValueError) and gets a zeroed one-slot buffer and slot -1; a device array the
    flags buffer and the first of PICK_MESSAGES' slots, counted by dsa_pick itself (pick.cu)."""
    if isinstance(positions, np.ndarray):
        _pick_rows_host(positions, p, npools, kpool, width)
        return k.xp.zeros((1, 2), dtype=np.uint32), -1
    g = guards_of(k)
    slot = g.slot(*PICK_MESSAGES)                                      # makes g.flags
    return g.flags, slot


def _pick_rows_host(positions: np.ndarray, p: int, npools: int, kpool: int, width: int) -> None:
    if not positions.size:
        return
    pos = positions.astype(np.int64)
    if int(pos.min()) < 0:
        raise ValueError("pick: parameter positions must be >= 0")
    v = (pos + 1) // kpool
    sparse = v > npools
    need = np.where(sparse, npools * kpool + (pos + 1 - v * kpool), pos + 1)
    if int(need.max()) > width:
        raise ValueError(f"pick: parameter width={width} is too small for position {int(pos.max())} "
                         f"(needs {int(need.max())})")
    if sparse.any() and int(v[sparse].max()) > p:
        raise ValueError(f"pick: parameter scores has {p} pools but a row sees {int(v[sparse].max())}")
