"""The scheduler (pure CPU): which rows of which requests run in the next step, and their KV pages.

Two calls a step: `schedule() -> StepPlan`, then `update(plan, sampled)` with the tokens sampled from the rows
that asked for logits.

- `parallel` running streams; a bounded waiting queue (`QueueFull`), admitted first come first served.
- Pages are leased (exact ids, lowest first) in `schedule()`, in row-group order, just before the step that
  writes them, and released the moment a request finishes or is aborted. This is the only allocator of KV
  pages: the plan names each group's new ids (`RowGroup.pages`) and each restored table (`StepPlan.tables`),
  and every rank's worker takes exactly those (cupyglm.engine.worker).
- Admission reserves a request's worst case: it is admitted only when the free pages, less what running
  requests may still lease, hold all it can ever write (prompt + max_tokens - 1 positions). So a running
  request never meets an empty pool, nothing is preempted, and a request that does not fit yet waits.
- A request that can never fit (over the context window, or more pages than the pool has) is refused with
  `RequestTooLong` in `add()`, before it takes anything.
- Prefill is chunked: one step feeds at most `cfg.chunk` prompt tokens (all requests together), and a chunk
  ends on a multiple of the keep grid unless it ends the prompt. Decode rows (one per request) ride along.
- MTP drafts (`pricer`, cupyglm.engine.draft): a drafting request's decode row is a verify group of 1 + n rows,
  n never past the tokens it may still generate, so its pages stay within what admission reserved; `update`
  takes the accepted tokens and cuts the table to the positions fed (before the next step leases).
- Kept prompt states come from one store (`cupyglm.engine.prefix_store`; a null one without a prompt cache):
  an admitted request whose prompt starts with a kept state resumes there (its pages for those positions
  leased at once, the restore in the plan); a prompt chunk that ends on the keep grid or at the prompt's end
  is a keep point (the keep and any evictions in the plan).
- With kept prompts as pool pages (a tier of the store): a resumed request shares the entry's whole pages and
  leases only the rest, and pages only the store holds count as free for admission: an admission short of
  pages evicts such entries first (the plan's `evicts`, applied on every rank before any of the step's leases;
  so here every admission is decided, and its evictions made, before the first restore leases a page).
- With a disk tier (a tier of the store): a request whose longest prefix is on disk (and longer than any in
  memory) waits one step while the ranks load it into a kept entry, then resumes from it; evicted states
  spill (the plan's disk section).
"""
from __future__ import annotations

import collections
import dataclasses

from cupyglm.engine.config import EngineConfig
from cupyglm.engine.prefix_store import MEMORY, NullStore, PrefixStore, prefix_store
from cupyglm.engine.prompt_cache import PromptCache
from cupyglm.engine.request import QueueFull, Request, RequestTooLong, Status
from cupyglm.engine.sampling import FINISH_ABORT, token_finish
from cupyglm.kv.pool import OutOfPages, PagePool

__all__ = ["Scheduler", "StepPlan", "RowGroup", "QueueFull", "RequestTooLong"]


@dataclasses.dataclass(frozen=True)
class RowGroup:
    """Rows of one request in one step: `tokens` fed at positions start, start + 1, ... A verify group
    (drafts > 0, `cupyglm.engine.verify`) is a decode row followed by `drafts` rows the ranks propose."""

    request_id: int
    tokens: tuple[int, ...]
    start: int
    logits: bool               # sample after this group (the prompt's last chunk, or a decode row)
    decode: bool               # a decode row (its token was sampled on rank 0), else a prompt chunk
    drafts: int = 0            # drafted rows after the decode row (verify rows, decode role)
    pages: tuple[int, ...] = ()   # the page ids leased for this group's rows (every rank takes exactly these)

    @property
    def count(self) -> int:
        return len(self.tokens) + self.drafts

    @property
    def end(self) -> int:
        return self.start + self.count


@dataclasses.dataclass(frozen=True)
class StepPlan:
    step: int
    groups: tuple[RowGroup, ...] = ()
    admitted: tuple[int, ...] = ()       # requests every rank learns of in this step
    released: tuple[int, ...] = ()       # admitted requests finished or aborted since the last plan
    restores: tuple[tuple[int, int, int], ...] = ()   # (request, kept entry, length) before the step runs
    drops: tuple[int, ...] = ()                        # kept entries evicted after the step runs
    keeps: tuple[tuple[int, int, int], ...] = ()      # (request, new kept entry, length) after the drops
    evicts: tuple[int, ...] = ()                       # kept entries evicted before the restores and leases
    disk: object = None                                # the disk work (cupyglm.engine.disk_tier.DiskOps) or None
    tables: tuple[tuple[int, tuple[int, ...]], ...] = ()   # (request, its page table right after its restore)
    kept_pages: tuple[tuple[int, tuple[int, ...]], ...] = ()   # (kept entry, the kept pages it was leased) per keep

    @property
    def empty(self) -> bool:
        return not (self.groups or self.admitted or self.released or self.restores or self.drops or self.keeps
                    or self.evicts or (self.disk is not None and not self.disk.empty))

    @property
    def rows(self) -> int:
        return sum(g.count for g in self.groups)


class Scheduler:
    """`store`: the kept prefixes (`cupyglm.engine.prefix_store`); or `cache` (a PromptCache) and `pages` (its
    PageStore over `pool`) composed into one; neither: a NullStore."""

    def __init__(self, cfg: EngineConfig, pool: PagePool | None = None, cache: PromptCache | None = None,
                 pages=None, store: PrefixStore | NullStore | None = None, pricer=None):
        self.cfg = cfg
        self.pricer = pricer                            # cupyglm.engine.draft.Pricer: drafts per decode step
        self.pool = pool if pool is not None else PagePool(cfg.num_pages)
        self.store = store if store is not None else prefix_store(cache, pages)
        self._restores: list[tuple[int, int, int]] = []
        self._tables: list[tuple[int, tuple[int, ...]]] = []
        self._evicts: list[int] = []
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.requests: dict[int, Request] = {}          # waiting and running
        self._released: list[int] = []
        self.step = 0

    @property
    def cache(self) -> PromptCache | None:
        """The store's memory tier (for observers)."""
        return self.store.cache

    @property
    def pages(self):
        """The store's pool-pages tier, a PageStore or None (for observers)."""
        return self.store.pages

    # ---- admission ---------------------------------------------------------------------------------------------
    def resolve_max_tokens(self, prompt_len: int, max_tokens: int | None) -> int:
        """max_tokens for a prompt (None: what the window leaves); RequestTooLong when it can never fit."""
        cfg = self.cfg
        if prompt_len < 1:
            raise ValueError("prompt must hold at least one token")
        if max_tokens is None:
            max_tokens = cfg.context - prompt_len
            if max_tokens < 1:
                raise RequestTooLong(f"prompt of {prompt_len} tokens leaves no room to generate in the context "
                                     f"window of {cfg.context}")
        if prompt_len + max_tokens > cfg.context:
            raise RequestTooLong(f"prompt of {prompt_len} tokens + max_tokens {max_tokens} exceeds the context "
                                 f"window of {cfg.context}")
        need = cfg.pages_needed(prompt_len + max_tokens - 1)
        if need > self.pool.num_pages:
            raise RequestTooLong(f"prompt of {prompt_len} tokens + max_tokens {max_tokens} needs {need} KV pages "
                                 f"of {cfg.page_tokens} tokens; the pool has {self.pool.num_pages}")
        return max_tokens

    def add(self, req: Request) -> None:
        """Queue a request (its max_tokens already resolved); QueueFull when the queue is at its bound."""
        if req.id in self.requests:
            raise ValueError(f"request id {req.id} is already in use")
        self.resolve_max_tokens(req.prompt_len, req.max_tokens)
        free_streams = max(0, self.cfg.parallel - len(self.running))
        if len(self.waiting) >= self.cfg.max_queue + free_streams:
            raise QueueFull(f"the queue is full ({self.cfg.max_queue} waiting requests)")
        req.status = Status.WAITING
        self.waiting.append(req)
        self.requests[req.id] = req

    def reserved_pages(self) -> int:
        """Pages running requests may still lease."""
        return sum(self.cfg.pages_needed(r.max_positions) - len(r.pages) for r in self.running)

    def _admit(self) -> list[int]:
        admitted, taken = [], self.reserved_pages()       # taken: pages running and admitted requests may lease
        protect = {eid for _, eid, _ in self._restores}
        while self.waiting and len(self.running) < self.cfg.parallel:
            head = self.waiting[0]
            need = self.cfg.pages_needed(head.max_positions) - self.store.shares(head, protect)
            short = need - (self.pool.free_count - taken)
            if short > 0:
                drops = self.store.evict(short, protect)
                if drops is None:
                    break                                  # first come first served: the head waits for pages
                self._evicts += drops
            self.waiting.popleft()
            head.status = Status.RUNNING
            head.announced = True
            self.running.append(head)
            admitted.append(head.id)
            taken += need
        for rid in admitted:                               # after every eviction: the leases see one free set
            self._resume(self.requests[rid])
        return admitted

    def _resume(self, r: Request) -> None:
        """Start an admitted request at its longest kept prefix (its pages leased now), or note the miss; one
        whose prefix is being loaded from disk is restored once the ranks have read it (`_resume_loaded`)."""
        found = self.store.lookup(r, {e for _, e, _ in self._restores})
        r.miss_reason = found.miss
        if found.tier == MEMORY:
            self._restore(r, found.entry, found.length)

    def _resume_loaded(self) -> None:
        """Requests whose disk load every rank completed resume from the new kept entry now."""
        for rid, eid, length in self.store.loaded():
            r = self.requests.get(rid)
            if r is None or not r.prefilling or r.fed:
                continue                                   # aborted while loading
            r.miss_reason = None
            self._restore(r, eid, length)

    def _restore(self, r: Request, eid: int, length: int) -> None:
        """`r` resumes from kept entry `eid` at `length`: the pages it shares first, the rest for those
        positions leased now."""
        r.pages.extend(self.store.restore(eid, length))
        self._lease(r, length)
        r.fed = r.cached = length
        self._restores.append((r.id, eid, length))
        self._tables.append((r.id, tuple(r.pages)))

    def _keeps(self, groups, restores) -> tuple[tuple[int, ...], tuple, tuple]:
        """The keep points this step's prompt chunks end on: (the evictions that make room for them, the keeps,
        (entry, kept pages) of each keep)."""
        if not self.store.keeps:
            return (), (), ()
        protect = {eid for _, eid, _ in restores}
        drops, keeps, kept_pages = [], [], []
        for g in groups:
            r = self.requests[g.request_id]
            if g.decode or not (g.end == r.prompt_len or g.end % self.cfg.keep_grid == 0):
                continue
            eid, pages, evict = self.store.keep(r, g.end, protect)   # after this step's leases, as on every rank
            drops += evict
            if eid is not None:
                keeps.append((r.id, eid, g.end))
                kept_pages.append((eid, pages))
        return tuple(drops), tuple(keeps), tuple(kept_pages)

    # ---- the two calls -----------------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """The next step: admit, then per running request (admission order) a decode row or a prompt chunk,
        leasing its pages."""
        cfg = self.cfg
        self.step += 1
        self.store.begin_step()
        admitted = self._admit()
        self._resume_loaded()
        budget = cfg.chunk
        groups = []
        for r in self.running:
            if self.store.loading(r.id):
                continue
            if r.prefilling:
                end = min(r.prompt_len, r.fed + budget)
                if end < r.prompt_len:
                    end = end // cfg.keep_grid * cfg.keep_grid
                if end <= r.fed:
                    continue
                group = RowGroup(r.id, r.prompt[r.fed:end], r.fed, end == r.prompt_len, False)
            else:
                n = self.pricer.choose(r) if self.pricer is not None else 0
                group = RowGroup(r.id, (r.output[-1],), r.fed, True, True, n)
            held = len(r.pages)
            if not self._lease(r, group.end):
                continue
            group = dataclasses.replace(group, pages=tuple(r.pages[held:]))
            if not group.decode:
                budget -= group.count
            groups.append(group)
        released, self._released = tuple(self._released), []
        restores, self._restores = tuple(self._restores), []
        evicts, self._evicts = tuple(self._evicts), []
        tables, self._tables = tuple(self._tables), []
        drops, keeps, kept_pages = self._keeps(groups, restores)
        drops, disk = self.store.end_step(drops)
        return StepPlan(self.step, tuple(groups), tuple(admitted), released, restores, drops, keeps, evicts, disk,
                        tables, kept_pages)

    def _lease(self, r: Request, positions: int) -> bool:
        need = self.cfg.pages_needed(positions) - len(r.pages)
        if need > 0:
            try:
                r.pages.extend(self.pool.lease(need))
            except OutOfPages:                              # not reached: admission reserved the pages
                return False
        return True

    def update(self, plan: StepPlan, sampled: dict) -> list[tuple[Request, int, str | None]]:
        """Apply a step's results: positions fed, sampled tokens, token-level finishes (pages released at
        once). `sampled[id]` is a token, or for a verify group the list of tokens it yields (a + 1 for a
        accepted drafts: a + 1 positions fed, the table cut to them). Returns (request, token, finish reason or
        None) for each token taken, in plan order."""
        events = []
        for g in plan.groups:
            r = self.requests.get(g.request_id)
            if r is None or r.status is not Status.RUNNING:
                continue                                   # aborted while the step ran
            if r.fed != g.start:
                raise RuntimeError(f"request {r.id}: step {plan.step} fed position {g.start}, expected {r.fed}")
            r.fed = g.end
            if not g.logits:
                continue
            got = sampled[g.request_id]
            toks = [int(t) for t in got] if isinstance(got, (list, tuple)) else [int(got)]
            if g.drafts:
                r.fed = g.start + len(toks)
                self.pricer.observe(r, g.drafts, len(toks) - 1)
                keep = self.cfg.pages_needed(r.fed)
                if len(r.pages) > keep:
                    self.pool.release(r.pages[keep:])
                    del r.pages[keep:]
            for tok in toks:
                r.output.append(tok)
                reason = token_finish(r.params, tok, len(r.output), r.max_tokens, self.cfg.eos_token_ids)
                if reason is not None:
                    self._finish(r, reason)
                events.append((r, tok, reason))
                if reason is not None:
                    break
        return events

    # ---- endings -----------------------------------------------------------------------------------------------
    def finish(self, request_id: int, reason: str) -> Request | None:
        """End a request now (e.g. a stop string matched on rank 0); its pages go back at once."""
        r = self.requests.get(request_id)
        if r is None:
            return None
        self._finish(r, reason)
        return r

    def abort(self, request_id: int) -> Request | None:
        """Cancel a waiting or running request; its pages go back at once. None when it is not live."""
        return self.finish(request_id, FINISH_ABORT)

    def _finish(self, r: Request, reason: str) -> None:
        if r.status is Status.WAITING:
            self.waiting.remove(r)
        elif r.status is Status.RUNNING:
            self.running.remove(r)
            self.pool.release(r.pages)
            r.pages.clear()
        r.status = Status.FINISHED
        r.finish_reason = reason
        self.requests.pop(r.id, None)
        if r.announced:
            self._released.append(r.id)

    def drop_kept(self) -> tuple[int, ...]:
        """Forget every kept entry and let go of its pages; their ids, for every rank to drop."""
        return self.store.drop_all()

    def stop_plan(self) -> StepPlan:
        """The last step: every request ended (released), the store's stop work (pool pages let go, memory
        states saved to disk)."""
        plan = self.schedule()
        drops, disk = self.store.stop()
        return dataclasses.replace(plan, drops=drops, disk=disk)

    def admin(self, op: str) -> StepPlan:
        """A step of its own for POST /v1/cache/save or clear (its drops and disk work); ValueError when this
        server cannot."""
        drops, disk = self.store.admin(op)
        self.step += 1
        return StepPlan(self.step, drops=drops, disk=disk)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._released)
