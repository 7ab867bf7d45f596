"""How a forward call's rows map to sequences: rows of one sequence are contiguous and in position order, and the
segments whose rows are decode/verify rows come first (cupyglm/backend/roles.py), so their rows are the call's
leading `decode_rows(segs)` rows: the number every GEMM of the call is given to pick each row's kernel by role."""
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
    decode: bool = False   # the rows' role: decode/verify rows (their tokens were sampled), else prompt rows
    dev: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)   # per-call device uploads

    @property
    def rows(self) -> slice:
        return slice(self.off, self.off + self.n)

    @property
    def positions(self) -> np.ndarray:
        return np.arange(self.start, self.start + self.n, dtype=np.int32)


def segments(states: list[SeqState], starts: list[int], counts: list[int],
             decode: list[bool] | None = None) -> list[Segment]:
    """Segments in the given order (decode/verify segments must come first: decode_rows refuses otherwise)."""
    out, off = [], 0
    roles = decode if decode is not None else [False] * len(states)
    for st, s, n, d in zip(states, starts, counts, roles):
        out.append(Segment(st, s, n, off, bool(d)))
        off += n
    return out


def decode_rows(segs: list[Segment]) -> int:
    """How many leading rows of the call are decode/verify rows (the GEMMs' `decode`)."""
    n, seen_prompt = 0, False
    for s in segs:
        if s.decode and seen_prompt:
            raise ValueError("segments: a decode/verify segment follows a prompt segment (decode rows go first)")
        seen_prompt |= not s.decode
        n += s.n if s.decode else 0
    return n


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
