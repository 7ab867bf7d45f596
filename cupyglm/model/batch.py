"""How a forward call's rows map to sequences: rows of one sequence are contiguous and in position order."""
from __future__ import annotations

import dataclasses

import numpy as np

from cupyglm.backend import qweight
from cupyglm.kv.state import SeqState


@dataclasses.dataclass(frozen=True)
class Segment:
    state: SeqState
    start: int        # position of the segment's first row
    n: int            # rows (new tokens) of this sequence in the call
    off: int          # index of its first row in the call's flat rows
    dev: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)   # per-call device uploads

    @property
    def rows(self) -> slice:
        return slice(self.off, self.off + self.n)

    @property
    def positions(self) -> np.ndarray:
        return np.arange(self.start, self.start + self.n, dtype=np.int32)


def segments(states: list[SeqState], starts: list[int], counts: list[int]) -> list[Segment]:
    out, off = [], 0
    for st, s, n in zip(states, starts, counts):
        out.append(Segment(st, s, n, off))
        off += n
    return out


class Weights:
    """A rank's shard seen through one name prefix, converted once to the backend's storage."""

    def __init__(self, shard: dict, ops, prefix: str):
        self._shard, self._ops, self._prefix = shard, ops, prefix

    def __call__(self, name: str):
        w = self._shard[f"{self._prefix}.{name}"]
        if isinstance(w, qweight.QWeight):          # packed values and scales as stored, on the backend's arrays
            return w.to(self._ops.xp)
        return self._ops.weight(w)

    def stack(self, names: list[str]):
        """The tensors `prefix.name` for each name (equal shapes) stacked on a new leading axis in the backend's
        storage: [len(names), *shape], filled one converted tensor at a time (no host-side stack)."""
        first = self(names[0])
        if isinstance(first, qweight.QWeight):
            return qweight.stack([first] + [self(n) for n in names[1:]], self._ops.xp)
        out = self._ops.xp.empty((len(names),) + tuple(first.shape), dtype=first.dtype)
        out[0] = first
        del first
        for i, name in enumerate(names[1:], 1):
            out[i] = self(name)
        return out

    def sub(self, name: str) -> "Weights":
        return Weights(self._shard, self._ops, f"{self._prefix}.{name}")
