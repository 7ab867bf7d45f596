"""The engine: rank 0's scheduling loop and every rank's lockstep execution of the same step.

Each `step()` on rank 0: admit and schedule (`Scheduler.schedule`, which leases the step's pages), encode the
plan as a versioned step message (`cupyglm.dist.step`: new requests' prompts and sampling parameters once,
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
(`cupyglm.kv.kept`: restores before the rows run; after the model call the drops, then the keeps).

Thread safety: `add_request`, `abort`, `has_work` and the page counts may be called from any thread; `step`
from one thread at a time. An abort that arrives while a step runs is applied when the step's model call
returns (its token is dropped); otherwise its pages go back at once.
"""
from __future__ import annotations

import itertools
import threading
import zlib

import numpy as np

from cupyglm.dist import step as stepmod
from cupyglm.engine import penalties, prompt_logprobs
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.logprobs import tokens_and_logprobs
from cupyglm.engine.prompt_cache import PromptCache
from cupyglm.engine.request import EngineError, Request, RequestOutput
from cupyglm.engine.sampling import FINISH_ABORT, FINISH_STOP, SamplingParams, banned_ids
from cupyglm.engine.text import RequestText
from cupyglm.kv.kept import apply_keeps, apply_restores
from cupyglm.engine.scheduler import Scheduler, StepPlan
from cupyglm.model.glm import SeqInput

FLAG_LOGITS = 1
FLAG_DECODE = 2
FLAG_ALL_LOGITS = 4        # a prompt chunk whose every row's logits are needed (prompt logprobs)
HASH_SHIFT = 8


def page_hash(pages: list[int]) -> int:
    """24-bit hash of a page table (the check every rank makes against rank 0's)."""
    return zlib.crc32(np.asarray(pages, dtype="<i4").tobytes()) & 0xFFFFFF


class Engine:
    """Rank 0: the API below. Other ranks: `worker_loop()`."""

    def __init__(self, runner, comm, cfg: EngineConfig, tokenizer=None, log=None, kept=None):
        if runner.kv.pool.num_pages != cfg.num_pages or runner.kv.page_tokens != cfg.page_tokens:
            raise ValueError("the runner's KV store does not match the EngineConfig's pages")
        self.runner, self.comm, self.cfg, self.tokenizer = runner, comm, cfg, tokenizer
        self.rank, self.size = comm.rank, comm.size
        self.ops = runner.ops
        self.log = log
        self.kept = kept                 # this rank's KeptStore (None: no prompt cache)
        cache = PromptCache(kept.pool.num_pages if kept else 0, kept.pages_for if kept else (lambda n: 0))
        self.scheduler = Scheduler(cfg, runner.kv.pool, cache if kept else None) if self.rank == 0 else None
        self._mirror = stepmod.Mirror()
        self._states: dict = {}
        self._lock = threading.RLock()
        self._in_step = False
        self._pending_aborts: list[int] = []
        self._ready: list[RequestOutput] = []          # abort outputs waiting for the next step()
        self._texts: dict[int, RequestText] = {}
        self._logprobs: dict[int, tuple] = {}             # this step's (logprob, top) per request that asked
        self._prompt_lp: dict[int, list] = {}             # prompt logprobs gathered until the first token
        self._ids = itertools.count()
        self._seeds = itertools.count()
        self._stopped = False
        self.steps = 0
        self.done_step = -1          # the last step message this rank finished (read by its heartbeat thread)
        self.watch = None            # rank 0: step_started(step, rows) / step_done() (cupyglm.dist.watchdog)

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
        params = params or SamplingParams()
        prompt = tuple(int(t) for t in prompt_ids)
        vocab = self.cfg.vocab_size
        if vocab and any(not 0 <= t < vocab for t in prompt):
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise ValueError(f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        with self._lock:
            if request_id is None:
                request_id = next(self._ids)
                while request_id in self.scheduler.requests:
                    request_id = next(self._ids)
            elif not 0 <= int(request_id) < 2**64:
                raise ValueError(f"request_id must be in 0..2**64-1, got {request_id}")
            max_tokens = self.scheduler.resolve_max_tokens(len(prompt), params.max_tokens)
            seed = params.seed if params.seed is not None else None
            req = Request(int(request_id), prompt, params, 0, max_tokens, salt=cache_salt or "")
            self.scheduler.add(req)                       # QueueFull / duplicate id raise before a seed is used
            req.seed = seed if seed is not None else (self.cfg.seed + next(self._seeds)) % 2**64
            self._texts[req.id] = RequestText(self.tokenizer, params)
            return req.id

    def abort(self, request_id: int) -> bool:
        """Cancel a request; False when it is not waiting or running."""
        self._root("abort")
        with self._lock:
            if request_id not in self.scheduler.requests:
                return False
            if self._in_step:
                self._pending_aborts.append(request_id)
            else:
                self._abort_now(request_id)
            return True

    def _abort_now(self, request_id: int) -> None:
        r = self.scheduler.abort(request_id)
        if r is not None:
            self._texts.pop(r.id, None)
            self._prompt_lp.pop(r.id, None)
            self._ready.append(RequestOutput(r.id, [], "", True, FINISH_ABORT, r.prompt_len, len(r.output),
                                             r.cached, None if r.cached else r.miss_reason))

    def has_work(self) -> bool:
        with self._lock:
            return bool(self.scheduler and self.scheduler.has_work()) or bool(self._ready or self._pending_aborts)

    @property
    def free_pages(self) -> int:
        return self.runner.kv.pool.free_count

    @property
    def total_pages(self) -> int:
        return self.runner.kv.pool.num_pages

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
            for rid in self._pending_aborts:
                self._abort_now(rid)
            self._pending_aborts.clear()
            plan = self.scheduler.schedule()
            ready, self._ready = self._ready, []
            if plan.empty:
                return ready
            msg = self._message(plan)
            reqs = {g.request_id: self.scheduler.requests[g.request_id] for g in plan.groups}
            self._in_step = True
        if self.watch is not None:
            self.watch.step_started(plan.step, sum(g.count for g in plan.groups))
        try:
            data = stepmod.encode(msg)
            if self.size > 1:
                self.comm.bcast_bytes(data)
            outs = self._run(stepmod.decode(data), check=False)     # checked with the sampled tokens
            for rid, got in prompt_logprobs.collect(self.ops, plan.groups, outs, reqs).items():
                self._prompt_lp.setdefault(rid, []).extend(got)
            sampled = self._sample(plan, outs, reqs)
        finally:
            with self._lock:
                self._in_step = False
            if self.watch is not None:
                self.watch.step_done()
        with self._lock:
            for rid in self._pending_aborts:
                self._abort_now(rid)
            self._pending_aborts.clear()
            events = self.scheduler.update(plan, sampled)
            outputs = ready + self._outputs(events)
            outputs += self._ready
            self._ready = []
        self.steps += 1
        return outputs

    def shutdown(self) -> None:
        """Rank 0: abort what is left and broadcast the stop flag (other ranks leave worker_loop). Idempotent."""
        if self.rank != 0 or self._stopped:
            return
        with self._lock:
            for r in list(self.scheduler.requests.values()):
                self.scheduler.abort(r.id)
            plan = self.scheduler.schedule()
            msg = stepmod.StepMessage(step=plan.step, new=(), cancelled=plan.released, schedule=(), stop=True)
            self._stopped = True
        data = stepmod.encode(msg)
        if self.size > 1:
            self.comm.bcast_bytes(data)
        self._run(stepmod.decode(data))

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
            flags |= FLAG_ALL_LOGITS if not g.decode and prompt_logprobs.wants(r.params) else 0
            flags |= page_hash(r.pages) << HASH_SHIFT
            entries.append(stepmod.ScheduleEntry(g.request_id, g.start, g.count,
                                                  g.tokens if g.decode else (), flags))
        return stepmod.StepMessage(step=plan.step, new=tuple(new), cancelled=plan.released,
                                   schedule=tuple(entries), restores=plan.restores, drops=plan.drops,
                                   keeps=plan.keeps)

    def _run(self, msg: stepmod.StepMessage, check: bool = True):
        """Apply a step message on this rank and run its rows; the model's outputs, one per row group."""
        self._mirror.apply(msg)
        for rid in msg.cancelled:
            state = self._states.pop(rid, None)
            if state is not None:
                self.runner.release(state)      # on rank 0 the scheduler already released: its table is empty
        for req in msg.new:
            state = self.runner.new_state()
            if self.rank == 0:
                state.pages = self.scheduler.requests[req.request_id].pages   # leased by the scheduler
            self._states[req.request_id] = state
        kv = self.runner.kv
        if msg.has_cache:
            apply_restores(self.kept, kv, self._states, msg, self.rank)
        batch = []
        for e in msg.schedule:
            state = self._states[e.request_id]
            if state.length != e.start:
                raise EngineError(f"rank {self.rank}: request {e.request_id} is at position {state.length}, "
                                  f"step {msg.step} feeds position {e.start}")
            tokens = e.tokens if e.tokens else self._mirror.requests[e.request_id].prompt[e.start:e.start + e.count]
            if len(tokens) != e.count:
                raise EngineError(f"rank {self.rank}: step {msg.step} gives request {e.request_id} "
                                  f"{len(tokens)} tokens for {e.count} rows")
            kv.ensure(state.pages, e.start + e.count)
            if page_hash(state.pages) != e.flags >> HASH_SHIFT:
                raise EngineError(f"rank {self.rank}: request {e.request_id}'s page table {state.pages} differs "
                                  f"from rank 0's (step {msg.step})")
            every = bool(e.flags & FLAG_ALL_LOGITS)
            batch.append(SeqInput(np.asarray(tokens, dtype=np.int32), state, all_logits=every,
                                  decode=bool(e.flags & FLAG_DECODE)))
        outs = self.runner.forward(batch, check=check) if batch else []
        if msg.has_cache:
            apply_keeps(self.kept, self._states, msg, self.rank)
        return outs

    # ---- rank 0: sampling and outputs --------------------------------------------------------------------------
    def _sample(self, plan: StepPlan, outs, reqs: dict[int, Request]) -> dict[int, int]:
        """Every logits row of the step at once through `ops.sample` (a kernel on sim and cuda, the NumPy
        reference on numpy). min_tokens bans are logits edits before the op (a NaN stays NaN, so a NaN row is
        still refused); the tokens come back to the host for the stops and the bookkeeping."""
        rows = [(g, out) for g, out in zip(plan.groups, outs) if g.logits]
        self._logprobs = {}
        if not rows:
            self.ops.raise_device_errors()
            return {}
        ops, xp = self.ops, self.ops.xp
        logits = xp.stack([xp.asarray(out.logits[-1], dtype=xp.float32).reshape(-1) for _, out in rows])
        vocab = logits.shape[1]
        pen = penalties.edits([(i, reqs[g.request_id].params, reqs[g.request_id].prompt, reqs[g.request_id].output)
                               for i, (g, _) in enumerate(rows) if penalties.wants(reqs[g.request_id].params)],
                              vocab)
        if pen is not None:                 # before the bans: a banned id stays -inf
            ops.penalize(logits, *pen.values())
        params = []
        for i, (g, _) in enumerate(rows):
            r = reqs[g.request_id]
            p = r.params
            ban = [b for b in banned_ids(p, len(r.output), self.cfg.eos_token_ids) if 0 <= b < vocab]
            if ban:
                ban = xp.asarray(ban, dtype=xp.int64)
                cur = logits[i, ban]
                logits[i, ban] = xp.where(xp.isnan(cur), cur, xp.float32(-np.inf))
            params.append((0.0 if p.greedy else p.temperature, p.top_k, p.top_p, p.min_p, r.seed, g.end))
        temperature, top_k, top_p, min_p, seed, position = (
            np.array(col, dtype=dt) for col, dt in zip(zip(*params), (np.float32, np.int32, np.float32,
                                                                       np.float32, np.uint64, np.int32)))
        drawn = ops.sample(logits, temperature, top_k, top_p, min_p, seed, position)
        tokens, lps = tokens_and_logprobs(ops, logits, drawn, [reqs[g.request_id].params.logprobs for g, _ in rows])
        self._logprobs = {rows[i][0].request_id: lp for i, lp in lps.items()}
        sampled = {}
        for (g, _), tok in zip(rows, tokens):
            if tok < 0:
                raise EngineError(f"request {g.request_id} at position {g.end}: logits hold NaN")
            sampled[g.request_id] = int(tok)
        return sampled

    def _outputs(self, events) -> list[RequestOutput]:
        out = []
        for r, tok, reason in events:
            text = self._texts.get(r.id)
            finished = reason is not None
            if text is not None:
                include = reason != FINISH_STOP                 # a stop id / EOS adds no text
                if text.push(tok, finished, include) and not finished:
                    self.scheduler.finish(r.id, FINISH_STOP)
                    finished, reason = True, FINISH_STOP
                elif text.stopped:
                    reason = FINISH_STOP                        # the last token also completed a stop string
                    r.finish_reason = reason
                piece = text.take(finished)
            else:
                piece = ""
            if finished:
                self._texts.pop(r.id, None)
            lp = self._logprobs.pop(r.id, None)
            out.append(RequestOutput(r.id, [tok], piece, finished, reason, r.prompt_len, len(r.output),
                                     r.cached, None if r.cached else r.miss_reason,
                                     logprobs=None if lp is None else [lp],
                                     prompt_logprobs=self._prompt_lp.pop(r.id, None)))
        return out

