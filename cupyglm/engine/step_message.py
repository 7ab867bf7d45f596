"""Rank 0: a step's plan as the step message every rank's worker applies (`cupyglm.engine.ops`).

The operations come in the codec's order; an empty one is left out. Page ids travel as the scheduler leased them
(each row group's new pages, each restored request's whole table, each keep's and load's kept pages), and the verified requests of the last step
travel as settles, so a worker decides nothing its plan does not name.
"""
from __future__ import annotations

import dataclasses

from cupyglm.engine import prompt_logprobs
from cupyglm.engine.disk_tier import DISK_CLEAR, DISK_SYNC
from cupyglm.engine.ops.admit import Admit, NewRequest, Sampling
from cupyglm.engine.ops.cancel import Cancel
from cupyglm.engine.ops.clear import Clear
from cupyglm.engine.ops.codec import StepMessage
from cupyglm.engine.ops.drop import Drop
from cupyglm.engine.ops.evict import Evict
from cupyglm.engine.ops.image import Image
from cupyglm.engine.ops.keep import Keep
from cupyglm.engine.ops.lease import Lease
from cupyglm.engine.ops.load import Load
from cupyglm.engine.ops.restore import Restore
from cupyglm.engine.ops.run import ALL_LOGITS, DECODE, LOGITS, VERIFY, Group, Run
from cupyglm.engine.ops.settle import Settle, Start
from cupyglm.engine.ops.spill import Spill
from cupyglm.engine.ops.sync import Sync
from cupyglm.engine.ops.unlink import Unlink


def assemble(step: int, stop: bool = False, new=(), images=(), cancelled=(), settles=(), evicts=(), restores=(),
             leases=(), groups=(), drops=(), keeps=(), disk=None, kept_pages=()) -> StepMessage:
    """The message of these parts, in the order every rank applies them (`disk`: a disk_tier.DiskOps;
    `kept_pages` and the disk's: (entry, the kept pages rank 0 leased it) per keep and load, which a worker
    refuses when they do not fit the state)."""
    d = disk if disk is not None and not disk.empty else None
    arena = dict(kept_pages) | (dict(d.kept_pages) if d is not None else {})
    parts = [(Admit, new), (Image, images), (Cancel, cancelled), (Settle, settles), (Evict, evicts),
             (Restore, restores), (Lease, leases), (Run, groups), (Spill, d.spills if d else ()), (Drop, drops),
             (Unlink, d.unlinks if d else ())]
    ops = [cls(tuple(items)) for cls, items in parts if items]
    if d is not None and d.ops & DISK_CLEAR:
        ops.append(Clear())
    if d is not None and d.loads:
        ops.append(Load(tuple((eid, n, key, arena.get(eid, ())) for eid, n, key in d.loads)))
    if d is not None and d.ops & DISK_SYNC:
        ops.append(Sync())
    if keeps:
        ops.append(Keep(tuple((rid, eid, n, arena.get(eid, ())) for rid, eid, n in keeps)))
    return StepMessage(step, tuple(ops), stop)


def with_images(msg: StepMessage, images: dict) -> StepMessage:
    """`msg` with the image operation after its admit; `images`: admitted request -> ((first placeholder
    position, bf16 rows, tag), ...) the tower gave."""
    rows = tuple((rid, start, r, tag) for rid, got in images.items() for start, r, tag in got)
    if not rows:
        return msg
    at = 1 if msg.ops and isinstance(msg.ops[0], Admit) else 0
    return dataclasses.replace(msg, ops=msg.ops[:at] + (Image(rows),) + msg.ops[at:])


def from_plan(plan, requests: dict, verifying: set[int], seeds: dict[int, int]) -> StepMessage:
    """rank 0's StepPlan as a message; `requests`: the scheduler's; `verifying`: requests whose verify group
    ran last step (settled before this step leases); `seeds`: each admitted request's (from its record)."""
    new = []
    for rid in plan.admitted:
        r = requests[rid]
        p = r.params
        new.append(NewRequest(rid, r.prompt, Sampling(
            temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, min_p=p.min_p, seed=seeds[rid],
            max_tokens=r.max_tokens, min_tokens=p.min_tokens, ignore_eos=p.ignore_eos,
            stop_token_ids=p.stop_token_ids)))
    groups = []
    for g in plan.groups:
        flags = (LOGITS if g.logits else 0) | (DECODE if g.decode else 0) | (VERIFY if g.drafts else 0)
        flags |= ALL_LOGITS if not g.decode and prompt_logprobs.wants(requests[g.request_id].params) else 0
        groups.append(Group(g.request_id, g.start, g.count, g.tokens if g.decode else (), flags))
    tables = dict(plan.tables)
    return assemble(plan.step, new=new, cancelled=plan.released,
                    settles=[Start(g.request_id, g.start) for g in plan.groups if g.request_id in verifying],
                    evicts=plan.evicts, restores=[(rid, eid, n, tables[rid]) for rid, eid, n in plan.restores],
                    leases=[(g.request_id, g.pages) for g in plan.groups if g.pages], groups=groups,
                    drops=plan.drops, keeps=plan.keeps, disk=plan.disk, kept_pages=plan.kept_pages)
