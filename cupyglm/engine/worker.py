"""The worker: one rank's execution of a step message, the same on every rank (rank 0's Engine.step calls it
with the bytes it broadcast; other ranks' Engine.worker_loop with the bytes they received).

`execute` applies the message's operations in order (`cupyglm.engine.ops`); what they change is this rank's
own: the requests it knows (prompts), the sequences' states and page tables, its KV pool (taking the ids rank 0's
scheduler leased: no rank allocates KV pages of its own), and its kept states (`cupyglm.engine.rank_store`: the
arena, the kept prompts' pool pages, the state files).

What must stay true: two ranks that applied the same messages hold the same page tables, kept entries and pool
pages, so a message that names a page not free here, or a table that does not hold a row group's rows, is refused.
"""
from __future__ import annotations

import dataclasses

from cupyglm.distributed.step import StepFormatError
from cupyglm.engine.ops.codec import StepMessage
from cupyglm.engine.ops.restore import Restore
from cupyglm.engine.ops.run import Run
from cupyglm.engine.rank_store import RankStore
from cupyglm.engine.verify import Verifier
from cupyglm.kv.host_rows import early_writes, log_writes


@dataclasses.dataclass
class StepResult:
    step: int
    outs: list = dataclasses.field(default_factory=list)      # one model output per row group, in order
    disk: dict = dataclasses.field(default_factory=dict)      # load entry -> every rank read it; -1 -> writes ok


class Worker:
    def __init__(self, runner, rank: int, kept=None, disk=None, host_comm=None, log=None):
        self.runner, self.rank, self.log = runner, rank, log
        self.kv = runner.kv
        self.store = RankStore(rank, kept, disk, host_comm)   # this rank's kept states, every tier
        self.verifier = Verifier(runner)
        self.requests: dict = {}               # request id -> admit.NewRequest
        self.states: dict = {}                 # request id -> SeqState
        self.images: dict = {}                 # request id -> [(first placeholder, bf16 rows, tag)] (ops.image)
        self.step = -1
        self.check, self.sample = True, None   # this step's run options (Run.apply reads them)

    def execute(self, msg: StepMessage, check: bool = True, sample=None) -> StepResult:
        """Apply `msg` on this rank. check=False / sample: as `ModelRunner.forward` (rank 0 reads the checks
        with its sampled tokens and may draw them in the exit graph)."""
        if msg.step <= self.step:
            raise StepFormatError(f"step {msg.step} after step {self.step}: the ranks are out of step")
        self.step, self.check, self.sample = msg.step, check, sample
        self.store.begin(msg.step)
        run = msg.get(Run)
        early_writes(self.kv.host, msg.get(Restore) is not None or (run is not None and run.verifies))
        result = StepResult(msg.step)
        try:
            for op in msg.ops:
                op.apply(self, result)
        finally:
            self.sample = None
        log_writes(self.kv.host, self.log, self.rank, msg.step)        # a test's check mode only
        return result

    # ---- what the operations share --------------------------------------------------------------------------------
    def take(self, state, pages) -> None:
        """Append rank 0's leased ids to a table, holding them in this rank's pool."""
        try:
            self.kv.pool.take(pages)
        except ValueError as err:
            raise StepFormatError(f"rank {self.rank}: step {self.step} leases pages this rank does not hold free "
                                  f"({err})") from None
        state.pages.extend(int(p) for p in pages)
