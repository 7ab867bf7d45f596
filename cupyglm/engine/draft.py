"""MTP drafts: how many tokens a request proposes each step (priced), and the proposer that chains the MTP head.

A drafting request's decode step feeds its last sampled token T at position q plus n drafted tokens d1..dn at
q+1..q+n in one verify row group; `cupyglm.engine.verify` keeps the step exactly serial. Drafts never change
output, only how many verify rows a step spends, so the proposer and the price may be anything deterministic.

The proposer (every rank, identical results): MTP row q-1 pairs the pending main row h_{q-1} with embed(T) and
predicts the token at q+1; its head-normed output is the next h, paired with embed(d1) at MTP position q, and
so on (the MTP layer's own KV rows at q-1..q+n-2; the verify call rewrites them). A draft is the argmax of the
chained head's logits (ties to the lower id).

The price (rank 0): a request's acceptance rate a is an exponential average over its verify calls of
accepted / proposed (start OPTIMISTIC_RATE, weight RATE_WEIGHT). With n drafts a step yields
E(n) = 1 + a + ... + a^n tokens and costs C(n) = 1 + n * m + (1 - a^n) decode steps: one verify call (its rows
share one weight stream), n chained MTP calls of relative cost m = 2 / (layers + 1) (one layer plus the
lm_head), and, when a draft is rejected, one replay of the accepted rows (verify.py). The request proposes the
n in 0..N with the largest E(n) / C(n); n = 0 (E/C = 1) skips drafting. A skipping request still proposes
one draft every PROBE_EVERY steps so its rate can recover. Never more than the tokens it may still generate
after this step's first (so a verify never leases past the positions admission reserved).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cupyglm.model.batch import Segment

OPTIMISTIC_RATE = 1.0
RATE_WEIGHT = 0.25
PROBE_EVERY = 8


@dataclasses.dataclass(frozen=True)
class Draft:
    """What one request drafts from this step: its last sampled token at position `start`, n proposals."""

    request_id: int
    state: object          # the request's SeqState (length == start)
    token: int
    start: int
    n: int


class Pricer:
    """Rank 0: drafts per step for each request (the rule in the module docstring)."""

    def __init__(self, max_drafts: int, num_layers: int, priced: bool = True):
        self.max_drafts, self.priced = max_drafts, priced
        self.mtp_cost = 2.0 / (num_layers + 1)

    def best(self, rate: float) -> int:
        """The n in 0..max_drafts maximising E(n) / C(n) at acceptance rate `rate`."""
        best_n, best_v = 0, 1.0
        for n in range(1, self.max_drafts + 1):
            expected = sum(rate ** k for k in range(n + 1))
            cost = 1.0 + n * self.mtp_cost + (1.0 - rate ** n)
            if expected / cost > best_v + 1e-12:
                best_n, best_v = n, expected / cost
        return best_n

    def choose(self, r) -> int:
        """Drafts for request `r`'s next decode step."""
        if self.max_drafts <= 0 or r.params.draft is False or r.params.guide is not None:
            return 0                        # a grammar masks one row at a time: guided requests decode serially
        room = r.max_tokens - len(r.output) - 1
        if room <= 0:
            return 0
        n = self.max_drafts
        if self.priced:
            n = self.best(r.draft_rate)
            if n == 0:
                r.draft_skipped += 1
                n = 1 if r.draft_skipped % PROBE_EVERY == 0 else 0
        return min(n, room)

    def observe(self, r, proposed: int, accepted: int) -> None:
        r.draft_rate += RATE_WEIGHT * (accepted / proposed - r.draft_rate)


class MTPProposer:
    """Chains the model's MTP head (every rank runs it on its shard; the drafts agree across ranks)."""

    def __init__(self, model):
        if model.mtp is None:
            raise ValueError("MTP drafts need the MTP head (the model was built without it)")
        self.model = model

    def propose(self, drafts: list[Draft]) -> dict[int, tuple[int, ...]]:
        m = self.model
        ops, xp = m.ops, m.ops.xp
        live = [d for d in drafts if d.n > 0]
        out: dict[int, list[int]] = {d.request_id: [] for d in drafts}
        if not live:
            return {}
        for d in live:
            if d.state.mtp_pending is None:
                raise ValueError(f"request {d.request_id} has no pending MTP row to draft from")
        h = xp.stack([d.state.mtp_pending for d in live])                       # [R, D] bf16
        ids = np.array([d.token for d in live], dtype=np.int32)
        for k in range(max(d.n for d in live)):
            segs = [Segment(d.state, d.start - 1 + k, 1, i, True) for i, d in enumerate(live)]   # decode role
            positions = np.array([d.start - 1 + k for d in live], dtype=np.int32)
            hm = m.mtp(m.embed, h, xp.asarray(ids), positions, segs, m.kv, m.comm)  # [R, D] head-normed
            tok = ops.asnumpy(xp.argmax(m.logits(hm, decode=len(live)), axis=1)).astype(np.int32)   # ties: lower id
            for d, t in zip(live, tok):
                out[d.request_id].append(int(t))
            keep = [i for i, d in enumerate(live) if d.n > k + 1]
            if len(keep) < len(live):
                live = [live[i] for i in keep]
                if not live:
                    break
                h, tok = hm[xp.asarray(np.array(keep))], tok[keep]
            else:
                h = hm
            ids = tok
        return {rid: tuple(v) for rid, v in out.items()}
