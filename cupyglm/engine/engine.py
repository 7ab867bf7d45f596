"""The engine: rank 0's scheduling loop and every rank's lockstep execution of the same step.

Each `step()` on rank 0: admit and schedule (`Scheduler.schedule`, which leases the step's pages), encode the
plan as a versioned step message (`cupyglm.engine.ops`: new requests' prompts and sampling parameters once,
row groups after, with the sampled token of each decode row; finished and aborted requests as `cancelled`),
broadcast it, run it, sample on rank 0 (every row of the step in one `ops.sample` call: on the
device on cuda, the kernel on sim), then `Scheduler.update` and detokenize (stop strings, on rank 0).
Ranks other than 0 run `worker_loop()`: receive, run the same message on their shard, until the stop flag.

Every rank runs a message the same way, rank 0 included (it runs the decoded bytes it sent): its
`cupyglm.engine.worker.Worker` applies the message's operations in order (`cupyglm.engine.ops`). Rank 0's
scheduler is the only allocator of KV pages: its pool and page store are the plan's (pure CPU), the message
names every page id a restore or a row group takes, and each worker, rank 0's too, holds its own pool that only
takes those ids, so every rank's tables equal the plan's or the message is refused.

Kept prompt states: rank 0's prefix store (`cupyglm.engine.prefix_store`: memory, pool pages and disk as tiers)
decides through the scheduler, the message carries it (evicts and restores before the rows run, drops and keeps
after; the disk tier's spills before the drops, loads, agreed by every rank, between the drops and the keeps),
and a save or a clear is a message of its own.

MTP drafts (`cupyglm.engine.verify`): a verify group carries its one token; every rank drafts the rest, rank 0
samples every row (`cupyglm.engine.step_sample`), and the next message settles each verified request at its next
row group's start (before anything else of that step leases or runs).

Requests on rank 0 (`cupyglm.engine.frontend`): one record a request from `add_request` to its one end, whatever
ends it (finished, aborted, refused, failed); the engine hands each step's sampled tokens to the front end.

Thread safety: `add_request`, `abort`, `has_work` and the page counts may be called from any thread; `step` from one
thread at a time. An abort that arrives while a step runs is applied when the step's model call returns (its token
is dropped); otherwise its pages go back at once.
"""
from __future__ import annotations

import threading

from cupyglm.engine import disk_tier, prompt_logprobs
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.draft import Pricer
from cupyglm.engine.frontend import Frontend
from cupyglm.engine.ops.codec import decode, encode
from cupyglm.engine.prefix_store import store_for
from cupyglm.engine.request import EngineError, RequestOutput
from cupyglm.engine.sampling import SamplingParams
from cupyglm.engine.step_sample import plain_rows, sample_step, sampled_rows
from cupyglm.engine.step_message import assemble, from_plan, with_images
from cupyglm.engine.worker import Worker
from cupyglm.engine.scheduler import Scheduler, StepPlan
from cupyglm.kv.pool import PagePool


class Engine:
    """Rank 0: the API below. Other ranks: `worker_loop()`."""

    def __init__(self, runner, comm, cfg: EngineConfig, tokenizer=None, log=None, kept=None, disk=None,
                 planner=None, host_comm=None, encoder=None):
        if runner.kv.pool.num_pages != cfg.num_pages or runner.kv.page_tokens != cfg.page_tokens:
            raise ValueError("the runner's KV store does not match the EngineConfig's pages")
        self.runner, self.comm, self.cfg, self.tokenizer = runner, comm, cfg, tokenizer
        self.rank, self.size = comm.rank, comm.size
        self.ops = runner.ops
        self.log = log
        self.encoder = encoder if self.rank == 0 else None   # rank 0's images.ImageEncoder (None: no images)
        # kept / disk: this rank's KeptStore and DiskStore (None: no prompt cache, no disk tier), the worker's own
        self.worker = Worker(runner, self.rank, kept, disk, host_comm, log)
        self.scheduler = self._scheduler(cfg, kept, planner) if self.rank == 0 else None
        self._verifying: set[int] = set()      # requests whose verify group ran in the last step
        self.kv_host_stats: dict | None = None     # the row cache's totals (KV rows in host memory), rank 0
        self._lock = threading.RLock()
        self._in_step = False
        vocab = cfg.vocab_size or runner.cfg.vocab_size
        self.front = Frontend(self.scheduler, cfg, tokenizer, vocab) if self.rank == 0 else None   # rank 0's requests
        self.guides = self.front.guides if self.front else None    # structured output (the server prepares guides)
        self._masks = None                                # this step's grammar masks, being computed
        self._stopped = False
        self.steps = 0
        self.done_step = -1          # the last step message this rank finished (read by its heartbeat thread)
        self.watch = None            # rank 0: step_started(step, rows) / step_done() (cupyglm.distributed.watchdog)

    def _scheduler(self, cfg: EngineConfig, kept, planner) -> Scheduler:
        """Rank 0's planner: a pool and prefix store of its own (the only allocators; the worker takes their
        ids)."""
        pool = PagePool(cfg.num_pages)
        pricer = Pricer(cfg.mtp_drafts, self.runner.cfg.num_hidden_layers, cfg.draft_pricing) \
            if cfg.mtp_drafts else None
        return Scheduler(cfg, pool, store=store_for(kept, pool, planner), pricer=pricer)

    @property
    def verifier(self):
        return self.worker.verifier

    @property
    def _states(self) -> dict:
        return self.worker.states

    # ---- rank 0 API --------------------------------------------------------------------------------------------
    def _root(self, what: str) -> None:
        if self.rank != 0:
            raise EngineError(f"Engine.{what} runs on rank 0 only (rank {self.rank} runs worker_loop)")
        if self._stopped:
            raise EngineError("the engine is shut down")

    def add_request(self, prompt_ids, params: SamplingParams | None = None, request_id: int | None = None,
                    cache_salt: str | None = None, images=()) -> int:
        """Queue a request; returns its id. Raises QueueFull, RequestTooLong (before it takes a page) or
        ValueError (bad ids) at once. `cache_salt`: kept prompt states are shared only under the same salt.
        `images`: images.ImageInput over the prompt's placeholder tokens (needs the engine's encoder)."""
        self._root("add_request")
        token = self.runner.cfg.vision.image_token_id if self.encoder is not None else None
        with self._lock:
            return self.front.add(prompt_ids, params, request_id, cache_salt, images, token)

    def abort(self, request_id: int) -> bool:
        """Cancel a request; False when it is not waiting or running."""
        self._root("abort")
        with self._lock:
            return self.front.abort(request_id, later=self._in_step)

    def has_work(self) -> bool:
        with self._lock:
            return bool(self.scheduler and self.scheduler.has_work()) or bool(self.front and self.front.has_ready())

    @property
    def _pool(self) -> PagePool:
        return self.scheduler.pool if self.scheduler is not None else self.runner.kv.pool

    @property
    def free_pages(self) -> int:
        return self._pool.free_count

    @property
    def total_pages(self) -> int:
        return self._pool.num_pages

    @property
    def store_pages(self) -> int | None:
        """KV pages kept prompts hold (the plan's count on rank 0)."""
        return (self.scheduler.store if self.scheduler is not None else self.worker.store).pages_held

    @property
    def cache_held(self) -> tuple[int, int] | None:
        """(bytes of kept states held on this rank, evictions so far); None without a prompt cache."""
        return self.scheduler.store.held() if self.scheduler is not None else None

    @property
    def keeps_prompts(self) -> bool:
        """A prompt cache is on: kept prompt states are restored."""
        return self.worker.store.kept is not None

    @property
    def disk_stats(self):
        """This rank's disk tier totals (`cupyglm.kv.disk_store`); None without a disk tier."""
        return self.worker.store.disk_stats

    @property
    def context(self) -> int:
        """The context window (max_model_len)."""
        return self.cfg.context

    @property
    def running(self) -> int:
        return len(self.scheduler.running) if self.scheduler else 0

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting) if self.scheduler else 0

    def step(self) -> list[RequestOutput]:
        """One lockstep step; the outputs (deltas) of the requests it advanced or ended."""
        self._root("step")
        with self._lock:
            self.front.run_aborts()
            plan = self.scheduler.schedule()
            ready = self.front.take_ready()
            if plan.empty:
                return ready
            msg, reqs, seeds, images = self._message(plan)
        if self.watch is not None:
            self.watch.step_started(plan.step, sum(g.count for g in plan.groups))
        try:
            if images:                 # outside the lock: the tower's time blocks no add_request
                msg = with_images(msg, {rid: self.encoder.rows(ims) for rid, ims in images.items()})
            sampled, logprobs, refused = self._run(plan, msg, reqs, seeds)
        finally:
            self._step_done()
        with self._lock:
            outputs = self.front.finish_step(plan, sampled, logprobs, refused, ready)
        self.steps += 1
        return outputs

    def _message(self, plan: StepPlan):
        """(the plan's step message, its groups' requests, the seeds of those and the admitted ones, the admitted
        ones' images to encode); under the lock: the step is in flight from here."""
        reqs = {g.request_id: self.scheduler.requests[g.request_id] for g in plan.groups}
        seeds = self.front.seeds(set(reqs) | set(plan.admitted))
        images = {rid: self.scheduler.requests[rid].images for rid in plan.admitted
                  if self.scheduler.requests[rid].images}
        msg = from_plan(plan, self.scheduler.requests, self._verifying, seeds)
        self._verifying = {g.request_id for g in plan.groups if g.drafts}
        self._masks = self.guides.start(sampled_rows(plan))   # while the step runs
        self._in_step = True
        return msg, reqs, seeds, images

    def _run(self, plan: StepPlan, msg, reqs: dict, seeds: dict):
        """Broadcast and run the message, then sample on rank 0: (sampled, logprobs, refused by the host rows)."""
        data = encode(msg)
        if self.size > 1:
            self.comm.bcast_bytes(data)
        plain = plain_rows(self.runner, plan, reqs, seeds, self.guides, self.cfg)   # sampled in the exit graph
        result = self.worker.execute(decode(data), False, plain)     # checked with the sampled tokens
        outs = result.outs
        self.scheduler.store.resolved(result.disk)        # the ranks' agreed loads
        with self._lock:
            self.front.add_prompt_logprobs(prompt_logprobs.collect(self.ops, plan.groups, outs, reqs))
        masks, self._masks = self._masks, None
        sampled, logprobs, failed = sample_step(self.ops, self.cfg, plan, outs, reqs, seeds, self.verifier.pending,
                                                self.guides, masks, plain)
        with self._lock:
            self.front.fail(failed)                # a failed grammar ends its request "abort"
        refused = self._host_refused(plan)
        for rid in refused:
            sampled.pop(rid, None)
        return sampled, logprobs, refused

    def _step_done(self) -> None:
        with self._lock:
            self._in_step = False
        if self.watch is not None:
            self.watch.step_done()

    def shutdown(self) -> None:
        """Rank 0: abort what is left and broadcast the stop flag (other ranks leave worker_loop). Idempotent."""
        if self.rank != 0 or self._stopped:
            return
        with self._lock:
            self.front.end_all()
            plan = self.scheduler.stop_plan()       # the stop saves the memory states to disk
            msg = assemble(plan.step, stop=True, cancelled=plan.released, drops=plan.drops, disk=plan.disk)
            self._stopped = True
            self.guides.close()
        data = encode(msg)
        if self.size > 1:
            self.comm.bcast_bytes(data)
        self.worker.execute(decode(data))
        self._stop_line()

    def _stop_line(self) -> None:
        line = self.worker.store.stop_line()
        if line is not None and self.log is not None:
            self.log(line)

    # ---- every rank --------------------------------------------------------------------------------------------
    def worker_loop(self) -> None:
        """Ranks other than 0: run rank 0's step messages until the stop flag."""
        if self.rank == 0:
            raise EngineError("worker_loop runs on ranks other than 0")
        while True:
            msg = decode(self.comm.bcast_bytes(None))
            self.worker.execute(msg)
            self.done_step = msg.step
            if msg.stop:
                self._stopped = True
                self._stop_line()
                return

    def cache_admin(self, op: str) -> dict:
        """Rank 0, between steps: "save" (memory states to disk) or "clear" (memory and disk), as one message."""
        self._root("cache_admin")
        with self._lock:
            plan = self.scheduler.admin(op)     # ValueError when this server cannot
        data = encode(assemble(plan.step, drops=plan.drops, disk=plan.disk))
        if self.size > 1:
            self.comm.bcast_bytes(data)
        return disk_tier.admin_result(plan, self.worker.execute(decode(data)).disk)

    # ---- rank 0: sampling and outputs --------------------------------------------------------------------------
    def _host_refused(self, plan: StepPlan) -> dict[int, str]:
        """Rank 0, after the step's read-back: the requests whose gather ran past its slots (kv/host_rows.py),
        with the named error. A call's segment i is plan.groups[i] (the step's rows in schedule order)."""
        host = self.runner.kv.host
        if host is None:
            return {}
        refused = {plan.groups[i].request_id: host.message for i in host.take_refused() if i < len(plan.groups)}
        self.kv_host_stats = host.take_stats()
        return refused
