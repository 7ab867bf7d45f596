"""Run: the step's row groups, in the order the forward call takes them; each `count` rows of one request from
position `start`. A prompt chunk's tokens come from the admitted prompt; a decode row carries its token (rank 0
sampled it); a verify group carries its one token and every rank drafts the other count - 1 rows.

Apply: every group's state must be at `start` and its table must already hold the pages its rows write (the
restore and lease before it named them); then the verify groups draft and the model runs every row at once, a
prompt chunk's image placeholders taking their image's rows (ops.image) in place of their embeddings.
"""
from __future__ import annotations

import dataclasses
import struct

import numpy as np

from cupyglm.distributed.step import Reader, StepFormatError, ids, pack
from cupyglm.engine.images import chunk_rows
from cupyglm.engine.ops.fields import COUNT
from cupyglm.model.glm import SeqInput

TAG = 7
NAME = "run"
LAYOUT = ("n u32 | n x (request_id u64 | start u32 | count u32 | flags u32 | n_tokens u32 | token ids u32 x n_tokens)",
          "flags: bit 0 logits wanted, bit 1 decode, bit 2 every row's logits (prompt logprobs), bit 3 a verify",
          "group (its one token, then count - 1 rows every rank drafts)")
_ENTRY = struct.Struct("<QIIII")

LOGITS = 1
DECODE = 2
ALL_LOGITS = 4
VERIFY = 8
FLAGS = LOGITS | DECODE | ALL_LOGITS | VERIFY


@dataclasses.dataclass(frozen=True)
class Group:
    request_id: int
    start: int
    count: int
    tokens: tuple[int, ...] = ()          # the tokens not every rank knows yet (sampled on rank 0)
    flags: int = 0


@dataclasses.dataclass(frozen=True)
class Run:
    groups: tuple[Group, ...]

    def encode(self) -> bytes:
        out = bytearray(pack(COUNT, len(self.groups)))
        for g in self.groups:
            out += pack(_ENTRY, g.request_id, g.start, g.count, g.flags, len(g.tokens))
            out += ids(g.tokens, f"request {g.request_id}'s scheduled tokens")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> Run:
        r = Reader(payload, NAME)
        (n,) = r.take(COUNT, "the row group count")
        out = []
        for _ in range(n):
            rid, start, count, flags, n_tok = r.take(_ENTRY, "a row group")
            if flags & ~FLAGS:
                raise StepFormatError(f"request {rid}'s row group has unknown flags {flags:#x}")
            out.append(Group(rid, start, count, r.ids(n_tok, f"request {rid}'s scheduled tokens"), flags))
        r.done()
        return cls(tuple(out))

    @property
    def verifies(self) -> bool:
        return any(g.flags & VERIFY for g in self.groups)

    def apply(self, w, result) -> None:
        rows = [_checked(w, g) for g in self.groups]
        drafted = w.verifier.propose([(g.request_id, st, t[0], g.count - 1) for g, st, t in rows
                                      if g.flags & VERIFY])
        batch = [SeqInput(np.asarray(drafted[g.request_id] if g.flags & VERIFY else tokens, dtype=np.int32), state,
                          all_logits=bool(g.flags & (VERIFY | ALL_LOGITS)), decode=bool(g.flags & DECODE),
                          embeds=() if g.tokens else chunk_rows(w.images.get(g.request_id, ()), g.start, g.count))
                 for g, state, tokens in rows]
        result.outs = w.runner.forward(batch, check=w.check, sample=w.sample) if batch else []


def _checked(w, g: Group):
    """(group, state, tokens) once the group's state, tokens and pages agree with rank 0's plan."""
    if g.request_id not in w.requests:
        raise StepFormatError(f"step {w.step}: schedules unknown request {g.request_id}")
    state = w.states[g.request_id]
    if state.length != g.start:
        raise StepFormatError(f"rank {w.rank}: request {g.request_id} is at position {state.length}, "
                              f"step {w.step} feeds position {g.start}")
    tokens = g.tokens if g.tokens else w.requests[g.request_id].prompt[g.start:g.start + g.count]
    verify = bool(g.flags & VERIFY)
    if len(tokens) != (1 if verify else g.count) or (verify and not 2 <= g.count <= 16):
        raise StepFormatError(f"rank {w.rank}: step {w.step} gives request {g.request_id} "
                              f"{len(tokens)} tokens for {g.count} rows")
    if len(state.pages) < w.runner.kv.pages_needed(g.start + g.count):
        raise StepFormatError(f"rank {w.rank}: request {g.request_id}'s page table {state.pages} does not hold "
                              f"positions to {g.start + g.count} (step {w.step} leased too few pages)")
    return g, state, tokens


OP = Run
