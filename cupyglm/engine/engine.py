"""The engine: rank 0's scheduling loop and every rank's lockstep execution of the same step.

Each `step()` on rank 0: admit and schedule (`Scheduler.schedule`, which leases the step's pages), encode the
plan as a versioned step message (`cupyglm.distributed.step`: new requests' prompts and sampling parameters once,
row groups after, with the sampled token of each decode row; finished and aborted requests as `cancelled`),
broadcast it, run it, sample on rank 0 (every row of the step in one `ops.sample` call: on the
device on cuda, the kernel on sim), then `Scheduler.update` and detokenize (stop strings, on rank 0).
Ranks other than 0 run `worker_loop()`: receive, run the same message on their shard, until the stop flag.

Every rank runs a message the same way (`_run`), rank 0 included (it runs the decoded bytes it sent): release
the cancelled requests' pages, create states for new requests, lease pages for each row group in order, run
the model. Page ids stay identical on every rank because every rank's pool sees the same releases and then
the same leases in the same order (lowest free id first); each row group's flags carry a 24-bit hash of rank
0's page table and every rank checks its own against it.

Kept prompt states: rank 0's `PromptCache` decides, the message carries it, every rank applies it alike
(`cupyglm.kv.kept`: evicts, then restores, before the rows run; after the model call the drops, then the keeps).
With kept prompts as pool pages (CUPYGLM_KV_SHARE) rank 0's scheduler makes the page store's holds as it plans, and
every other rank makes them as it applies the message (`cupyglm.kv.page_store`). The disk tier
(`cupyglm.engine.disk_tier`) rides in the same message: spills before the drops, loads (agreed by every rank)
between the drops and the keeps, and a save or a clear as a message of its own.

MTP drafts (`cupyglm.engine.verify`): a verify group carries its one token; every rank drafts the rest, rank 0
samples every row (`cupyglm.engine.step_sample`), and the next message's row group tells every rank how far to
roll back (`Verifier.settle`, before anything else of that step leases or runs).

Requests on rank 0 (`cupyglm.engine.frontend`): one record a request from `add_request` to its one end, whatever
ends it (finished, aborted, refused, failed); the engine hands each step's sampled tokens to the front end.

Thread safety: `add_request`, `abort`, `has_work` and the page counts may be called from any thread; `step` from one
thread at a time. An abort that arrives while a step runs is applied when the step's model call returns (its token
is dropped); otherwise its pages go back at once.
"""
from __future__ import annotations

import threading
import zlib

import numpy as np

from cupyglm.distributed import step as stepmod
from cupyglm.engine import disk_tier, prompt_logprobs
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.draft import Pricer
from cupyglm.engine.frontend import Frontend
from cupyglm.engine.prompt_cache import PromptCache
from cupyglm.engine.request import EngineError, RequestOutput
from cupyglm.engine.sampling import SamplingParams
from cupyglm.engine.step_sample import plain_rows, sample_step, sampled_rows
from cupyglm.engine.verify import Verifier
from cupyglm.kv.host_rows import early_writes, log_writes
from cupyglm.kv.kept import apply_keeps, apply_restores
from cupyglm.kv.page_store import stop_line
from cupyglm.engine.scheduler import Scheduler, StepPlan
from cupyglm.model.glm import SeqInput

FLAG_LOGITS = 1
FLAG_DECODE = 2
FLAG_ALL_LOGITS = 4        # a prompt chunk whose every row's logits are needed (prompt logprobs)
FLAG_VERIFY = 8            # a verify group: its one token, then count - 1 rows every rank drafts (engine.verify)
HASH_SHIFT = 8


def page_hash(pages: list[int]) -> int:
    """24-bit hash of a page table (the check every rank makes against rank 0's)."""
    return zlib.crc32(np.asarray(pages, dtype="<i4").tobytes()) & 0xFFFFFF


class Engine:
    """Rank 0: the API below. Other ranks: `worker_loop()`."""

    def __init__(self, runner, comm, cfg: EngineConfig, tokenizer=None, log=None, kept=None, disk=None,
                 planner=None, host_comm=None):
        if runner.kv.pool.num_pages != cfg.num_pages or runner.kv.page_tokens != cfg.page_tokens:
            raise ValueError("the runner's KV store does not match the EngineConfig's pages")
        self.runner, self.comm, self.cfg, self.tokenizer = runner, comm, cfg, tokenizer
        self.rank, self.size = comm.rank, comm.size
        self.ops = runner.ops
        self.log = log
        self.kept = kept                 # this rank's KeptStore (None: no prompt cache)
        self.pages = kept.pages if kept else None       # the kept prompts' pool pages (CUPYGLM_KV_SHARE)
        cache = PromptCache(kept.pool.num_pages if kept else 0, kept.pages_for if kept else (lambda n: 0),
                            self.pages.limit if self.pages else 0)
        self.disk, self.host_comm = disk, host_comm     # this rank's DiskStore (None: no disk tier)
        self._disk_results: dict[int, bool] = {}
        pricer = Pricer(cfg.mtp_drafts, runner.cfg.num_hidden_layers, cfg.draft_pricing) if cfg.mtp_drafts else None
        self.scheduler = Scheduler(cfg, runner.kv.pool, cache if kept else None, pages=self.pages, disk=planner,
                                   pricer=pricer) if self.rank == 0 else None
        self.verifier = Verifier(runner, trim=self.rank != 0)   # this rank's verify groups in flight
        self.kv_host_stats: dict | None = None     # the row cache's totals (KV rows in host memory), rank 0
        self._mirror = stepmod.Mirror()
        self._states: dict = {}
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

    # ---- rank 0 API --------------------------------------------------------------------------------------------
    def _root(self, what: str) -> None:
        if self.rank != 0:
            raise EngineError(f"Engine.{what} runs on rank 0 only (rank {self.rank} runs worker_loop)")
        if self._stopped:
            raise EngineError("the engine is shut down")

    def add_request(self, prompt_ids, params: SamplingParams | None = None, request_id: int | None = None,
                    cache_salt: str | None = None) -> int:
        """Queue a request; returns its id. Raises QueueFull, RequestTooLong (before it takes a page) or
        ValueError (bad ids) at once. `cache_salt`: kept prompt states are shared only under the same salt."""
        self._root("add_request")
        with self._lock:
            return self.front.add(prompt_ids, params, request_id, cache_salt)

    def abort(self, request_id: int) -> bool:
        """Cancel a request; False when it is not waiting or running."""
        self._root("abort")
        with self._lock:
            return self.front.abort(request_id, later=self._in_step)

    def has_work(self) -> bool:
        with self._lock:
            return bool(self.scheduler and self.scheduler.has_work()) or bool(self.front and self.front.has_ready())

    @property
    def free_pages(self) -> int:
        return self.runner.kv.pool.free_count

    @property
    def total_pages(self) -> int:
        return self.runner.kv.pool.num_pages

    @property
    def store_pages(self) -> int | None:
        return None if self.pages is None else self.pages.held      # KV pages kept prompts hold

    @property
    def cache_held(self) -> tuple[int, int] | None:
        """(bytes of kept states held on this rank, evictions so far); None without a prompt cache."""
        if self.kept is None or self.scheduler is None:
            return None
        return self.scheduler.cache.held_pages * self.kept.page_bytes, self.scheduler.cache.stats.evictions

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
            msg = self._message(plan)
            reqs = {g.request_id: self.scheduler.requests[g.request_id] for g in plan.groups}
            self._masks = self.guides.start(sampled_rows(plan))   # while the step runs
            self._in_step = True
        if self.watch is not None:
            self.watch.step_started(plan.step, sum(g.count for g in plan.groups))
        try:
            data = stepmod.encode(msg)
            if self.size > 1:
                self.comm.bcast_bytes(data)
            plain = plain_rows(self.runner, plan, reqs, self.guides, self.cfg)   # sampled in the exit graph
            outs = self._run(stepmod.decode(data), False, plain)     # checked with the sampled tokens
            if self.scheduler.disk is not None:
                self.scheduler.disk.resolved(self._disk_results)      # the ranks' agreed loads
            with self._lock:
                self.front.add_prompt_logprobs(prompt_logprobs.collect(self.ops, plan.groups, outs, reqs))
            masks, self._masks = self._masks, None
            sampled, logprobs, failed = sample_step(self.ops, self.cfg, plan, outs, reqs, self.verifier.pending,
                                                    self.guides, masks, plain)
            with self._lock:
                self.front.fail(failed)                # a failed grammar ends its request "abort"
            refused = self._host_refused(plan)
            for rid in refused:
                sampled.pop(rid, None)
        finally:
            with self._lock:
                self._in_step = False
            if self.watch is not None:
                self.watch.step_done()
        with self._lock:
            outputs = self.front.finish_step(plan, sampled, logprobs, refused, ready)
        self.steps += 1
        return outputs

    def shutdown(self) -> None:
        """Rank 0: abort what is left and broadcast the stop flag (other ranks leave worker_loop). Idempotent."""
        if self.rank != 0 or self._stopped:
            return
        with self._lock:
            self.front.end_all()
            plan = self.scheduler.schedule()
            drops = self.scheduler.drop_kept() if self.pages is not None else ()
            disk = self.scheduler.disk.save_ops(self.scheduler) if self.scheduler.disk is not None else None
            msg = stepmod.StepMessage(step=plan.step, new=(), cancelled=plan.released, schedule=(), stop=True,
                                      drops=drops, disk=disk)       # the stop saves the memory states to disk
            self._stopped = True
            self.guides.close()
        data = stepmod.encode(msg)
        if self.size > 1:
            self.comm.bcast_bytes(data)
        self._run(stepmod.decode(data))
        self._stop_line()

    def _stop_line(self) -> None:
        if self.pages is not None and self.log is not None:
            self.log(stop_line(self.rank, self.pages))

    # ---- every rank --------------------------------------------------------------------------------------------
    def worker_loop(self) -> None:
        """Ranks other than 0: run rank 0's step messages until the stop flag."""
        if self.rank == 0:
            raise EngineError("worker_loop runs on ranks other than 0")
        while True:
            msg = stepmod.decode(self.comm.bcast_bytes(None))
            self._run(msg)
            self.done_step = msg.step
            if msg.stop:
                self._stopped = True
                self._stop_line()
                return

    def _message(self, plan: StepPlan) -> stepmod.StepMessage:
        sch = self.scheduler
        new = []
        for rid in plan.admitted:
            r = sch.requests[rid]
            p = r.params
            new.append(stepmod.NewRequest(rid, r.prompt, stepmod.Sampling(
                temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, min_p=p.min_p, seed=r.seed,
                max_tokens=r.max_tokens, min_tokens=p.min_tokens, ignore_eos=p.ignore_eos,
                stop_token_ids=p.stop_token_ids)))
        entries = []
        for g in plan.groups:
            r = sch.requests[g.request_id]
            flags = (FLAG_LOGITS if g.logits else 0) | (FLAG_DECODE if g.decode else 0)
            flags |= FLAG_VERIFY if g.drafts else 0
            flags |= FLAG_ALL_LOGITS if not g.decode and prompt_logprobs.wants(r.params) else 0
            flags |= page_hash(r.pages) << HASH_SHIFT
            entries.append(stepmod.ScheduleEntry(g.request_id, g.start, g.count,
                                                  g.tokens if g.decode else (), flags))
        return stepmod.StepMessage(step=plan.step, new=tuple(new), cancelled=plan.released,
                                   schedule=tuple(entries), restores=plan.restores, drops=plan.drops,
                                   keeps=plan.keeps, evicts=plan.evicts, disk=plan.disk)

    def _run(self, msg: stepmod.StepMessage, check: bool = True, sample=None):
        """Apply a step message on this rank and run its rows (`sample`: rank 0's plain_rows); one output a group."""
        self._mirror.apply(msg)
        for rid in msg.cancelled:
            state = self._states.pop(rid, None)
            self.verifier.drop(rid)
            if state is not None:
                self.runner.release(state)      # on rank 0 the scheduler already released: its table is empty
        self.verifier.settle(msg.schedule, self._states)      # before this step leases or reads anything
        for req in msg.new:
            state = self.runner.new_state()
            if self.rank == 0:
                state.pages = self.scheduler.requests[req.request_id].pages   # leased by the scheduler
            self._states[req.request_id] = state
        kv = self.runner.kv
        pages = self.pages if self.rank != 0 else None      # rank 0's scheduler made the page store's holds
        early_writes(kv.host, bool(msg.restores) or any(e.flags & FLAG_VERIFY for e in msg.schedule))
        if msg.has_cache:
            apply_restores(self.kept, kv, self._states, msg, self.rank, pages)
        rows = []
        for e in msg.schedule:
            state = self._states[e.request_id]
            if state.length != e.start:
                raise EngineError(f"rank {self.rank}: request {e.request_id} is at position {state.length}, "
                                  f"step {msg.step} feeds position {e.start}")
            tokens = e.tokens if e.tokens else self._mirror.requests[e.request_id].prompt[e.start:e.start + e.count]
            verify = bool(e.flags & FLAG_VERIFY)
            if len(tokens) != (1 if verify else e.count) or (verify and not 2 <= e.count <= 16):
                raise EngineError(f"rank {self.rank}: step {msg.step} gives request {e.request_id} "
                                  f"{len(tokens)} tokens for {e.count} rows")
            kv.ensure(state.pages, e.start + e.count)
            if page_hash(state.pages) != e.flags >> HASH_SHIFT:
                raise EngineError(f"rank {self.rank}: request {e.request_id}'s page table {state.pages} differs "
                                  f"from rank 0's (step {msg.step})")
            rows.append((e, state, tokens, verify))
        drafted = self.verifier.propose([(e.request_id, st, t[0], e.count - 1) for e, st, t, v in rows if v])
        batch = [SeqInput(np.asarray(drafted[e.request_id] if verify else tokens, dtype=np.int32), state,
                          all_logits=verify or bool(e.flags & FLAG_ALL_LOGITS),
                          decode=bool(e.flags & FLAG_DECODE)) for e, state, tokens, verify in rows]
        outs = self.runner.forward(batch, check=check, sample=sample) if batch else []
        self._disk_results = {}
        if msg.disk is not None:         # spills before the drops; the ranks agree on the loads between
            disk_tier.spill_before_drops(self.disk, msg)
            apply_keeps(self.kept, self._states, msg, self.rank, pages, between=lambda: self._disk_results.update(
                disk_tier.apply_disk(self.disk, self.host_comm, msg)))
        elif msg.has_cache:
            apply_keeps(self.kept, self._states, msg, self.rank, pages)
        if self.disk is not None and msg.keeps:
            disk_tier.note_keeps(self.disk, msg, self._mirror)
        log_writes(kv.host, self.log, self.rank, msg.step)        # a test's check mode only
        return outs

    def cache_admin(self, op: str) -> dict:
        """Rank 0, between steps: "save" (memory states to disk) or "clear" (memory and disk), as one message."""
        self._root("cache_admin")
        with self._lock:
            msg = disk_tier.admin_message(self.scheduler, op)     # ValueError when this server cannot
        data = stepmod.encode(msg)
        if self.size > 1:
            self.comm.bcast_bytes(data)
        self._run(stepmod.decode(data))
        return disk_tier.admin_result(msg, self._disk_results)

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
