"""Verify row groups on every rank: snapshot, propose, verify, and the rollback that leaves rejected rows no trace.

A verify group of request r feeds [T, d1..dn] at q..q+n (n + 1 <= 16 rows, decode-role rows). Rank 0 samples
every row with the serial (seed, position) draw and accepts the longest prefix of drafts equal to what it drew,
plus the draw after it: a + 1 tokens, a + 1 positions fed. Every rank learns a from the next step's row group
of r (its start is q + a + 1) and settles before anything else leases or reads:

- Pages: the table is cut to the pages q + a + 1 positions need: in rank 0's scheduler when it accepts (before
  it leases the next step's pages), and here on every rank (the step's settle operation, before its leases).
- State: snapshot before the proposer runs (KDA states, conv windows and index-key tails copied, since the
  model writes tails in place; the MTP pending row by reference, since the model replaces it); on a
  rejection the snapshot is put back (length q; the tails copied into the state's slot views, in place) and
  the accepted rows [T, d1..da] run again as one forward call. Recompute rather than per-row states: the
  forward is row-invariant, so the replay writes exactly the bytes a serial run writes (KDA states, conv
  windows, index tails, KV rows, MTP rows and pending row) and no kernel has to keep a state per row. When
  every draft is accepted nothing is replayed.
- KV rows past q + a (main and MTP layers) and pooled keys of pools the rejected rows completed stay on the
  pages but are never read: each call writes a position's rows before any row reads them, and a pool's key is
  read only once the pool is complete, which rewrites it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cupyglm.engine.draft import Draft, MTPProposer
from cupyglm.model.glm import SeqInput


@dataclasses.dataclass
class Snapshot:
    length: int
    kda_state: dict
    kda_conv: dict
    index_tail: dict
    mtp_pending: object


@dataclasses.dataclass
class Pending:
    """A verify group that ran and awaits its accepted count."""

    start: int
    tokens: tuple[int, ...]          # (T, d1..dn)
    snap: Snapshot


def _tails(tails: dict, xp) -> dict:
    """Copies of index tails (layer -> (ik, ig)): the model writes tails in place."""
    return {l: tuple(xp.copy(a) for a in t) for l, t in tails.items()}


def put_tails(state, tails: dict) -> None:
    """Copies of index tails written back into the state's own tails, in place (they are views of its slot in
    the KV store, kv/index_tails.py); a layer the copies lack (first written after them) goes back to zeros and
    leaves the dict, as before its first write."""
    for l in [l for l in state.index_tail if l not in tails]:
        for a in state.index_tail.pop(l):
            a[...] = 0
    for l, t in tails.items():
        held = state.index_tail.get(l)
        if held is None:                                   # not the state's own tail yet: the model moves it in
            state.index_tail[l] = tuple(a.copy() for a in t)
            continue
        for dst, src in zip(held, t):
            dst[...] = src


def snapshot(state, xp) -> Snapshot:
    return Snapshot(state.length, {l: xp.copy(s) for l, s in state.kda_state.items()},
                    {l: xp.copy(c) for l, c in state.kda_conv.items()}, _tails(state.index_tail, xp),
                    state.mtp_pending)


def restore(state, snap: Snapshot, xp) -> None:
    """The snapshot put back; its tails are copied into the state's (in place), so the snapshot stays what it
    was."""
    state.length = snap.length
    state.kda_state, state.kda_conv = dict(snap.kda_state), dict(snap.kda_conv)
    put_tails(state, snap.index_tail)
    state.mtp_pending = snap.mtp_pending


class Verifier:
    """One rank's verify groups in flight (request id -> Pending) and its proposer."""

    def __init__(self, runner, proposer=None):
        self.runner = runner
        self.proposer = proposer
        self.pending: dict[int, Pending] = {}
        self.replayed_rows = 0

    def _proposer(self):
        if self.proposer is None:
            self.proposer = MTPProposer(self.runner.model)
        return self.proposer

    def drop(self, request_id: int) -> None:
        self.pending.pop(request_id, None)

    def settle(self, starts, states: dict) -> None:
        """Roll each verified request back to its next row group's start (before any lease of this step);
        starts: (request id, start) pairs (ops.settle.Start)."""
        kv, replay = self.runner.kv, []
        for rid, start in starts:
            p = self.pending.pop(rid, None)
            if p is None:
                continue
            state = states[rid]
            fed = start - p.start
            if not 1 <= fed <= len(p.tokens):
                raise ValueError(f"request {rid}: verify at {p.start} of {len(p.tokens)} rows, "
                                 f"next row group at {start}")
            keep = kv.pages_needed(start)
            if len(state.pages) > keep:
                kv.pool.release(state.pages[keep:])
                del state.pages[keep:]
            if fed < len(p.tokens):
                restore(state, p.snap, self.runner.ops.xp)
                replay.append(SeqInput(np.asarray(p.tokens[:fed], dtype=np.int32), state, decode=True))  # as verified
        if replay:
            self.replayed_rows += sum(s.tokens.size for s in replay)
            self.runner.forward(replay)

    def propose(self, entries: list[tuple[int, object, int, int]]) -> dict[int, tuple[int, ...]]:
        """entries: (request id, state, last token, drafts) of this step's verify groups -> the full verify
        tokens (T, d1..dn) per request, each state snapshotted before the proposer touched it."""
        if not entries:
            return {}
        xp = self.runner.ops.xp
        snaps = {rid: snapshot(st, xp) for rid, st, _, _ in entries}
        drafts = self._proposer().propose([Draft(rid, st, tok, st.length, n) for rid, st, tok, n in entries])
        out = {}
        for rid, st, tok, n in entries:
            got = tuple(drafts.get(rid, ()))
            if len(got) != n:
                raise ValueError(f"request {rid}: the proposer gave {len(got)} drafts for {n}")
            put_tails(st, snaps[rid].index_tail)       # the chain wrote the MTP layer's tail in place
            out[rid] = (tok,) + got
            self.pending[rid] = Pending(st.length, out[rid], snaps[rid])
        return out


def accept(drafts: tuple[int, ...], drawn: list[int]) -> list[int]:
    """The tokens a verify group yields: draws while each equals its draft, and the first that differs (or the
    draw after the last draft). drawn[j] is the serial draw at row j."""
    out = []
    for j, tok in enumerate(drawn):
        out.append(int(tok))
        if j >= len(drafts) or int(tok) != drafts[j]:
            break
    return out
