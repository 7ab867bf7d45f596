"""The step message: an ordered tuple of operations (one module each in this package), framed by
`cupyglm.distributed.step`. Every rank applies them in ORDER; `encode` and `decode` refuse any other order.

`layout()` is the step-layout table docs/architecture.md shows (tests/unit/test_step.py fails when they differ).
"""
from __future__ import annotations

import dataclasses

from cupyglm.distributed import step as frame
from cupyglm.distributed.step import StepFormatError
from cupyglm.engine.ops import (admit, cancel, clear, drop, evict, image, keep, lease, load, restore, run, settle,
                                spill, sync, unlink)

MODULES = (admit, image, cancel, settle, evict, restore, lease, run, spill, drop, unlink, clear, load, sync, keep)
ORDER = tuple(m.NAME for m in MODULES)
_BY_TAG = {m.TAG: m for m in MODULES}
_CLASS = {m: m.OP for m in MODULES}
_MODULE_OF = {c: m for m, c in _CLASS.items()}


@dataclasses.dataclass(frozen=True)
class StepMessage:
    step: int = 0
    ops: tuple = ()
    stop: bool = False

    def get(self, cls):
        """This message's operation of type `cls`, or None."""
        return next((op for op in self.ops if isinstance(op, cls)), None)


def _check_order(mods, step: int) -> None:
    at = [MODULES.index(m) for m in mods]
    if at != sorted(set(at)):
        names = ", ".join(m.NAME for m in mods)
        raise StepFormatError(f"step {step}: operations out of order or repeated ({names}; the order is "
                              f"{', '.join(ORDER)})")


def encode(msg: StepMessage) -> bytes:
    mods = [_MODULE_OF.get(type(op)) for op in msg.ops]
    if None in mods:
        raise ValueError(f"step message: {type(msg.ops[mods.index(None)]).__name__} is not a step operation")
    _check_order(mods, msg.step)
    return frame.encode(frame.Frame(msg.step, msg.stop, tuple((m.TAG, op.encode()) for m, op in zip(mods, msg.ops))))


def decode(data: bytes) -> StepMessage:
    f = frame.decode(data)
    mods = []
    for tag, _ in f.records:
        if tag not in _BY_TAG:
            raise StepFormatError(f"step {f.step}: unknown operation tag {tag}")
        mods.append(_BY_TAG[tag])
    _check_order(mods, f.step)
    return StepMessage(f.step, tuple(_CLASS[m].decode(p) for m, (_, p) in zip(mods, f.records)), f.stop)


def layout() -> str:
    """The byte layout, one block per operation in ORDER (the docs' table)."""
    lines = ["header        magic \"CGST\" | version u16 | flags u16 (bit 0: stop) | step u64 | n_ops u32    "
             f"{frame.HEADER.size} bytes",
             "operation     tag u16 | n_bytes u32 | payload, n_ops times, in the order below (each at most once)"]
    for m in MODULES:
        head = f"{m.TAG:>2} {m.NAME}"
        lines += [f"{head:<14}{m.LAYOUT[0]}"] + [f"{'':<14}{x}" for x in m.LAYOUT[1:]]
    return "\n".join(lines)
