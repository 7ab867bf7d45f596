"""Kept prompts as KV pool pages (CUPYGLM_KV_SHARE), pure CPU with exact page ids: the page store's holds, the
scheduler's evict section (decided before any of the step's leases), and a replay of every plan through the
operations other ranks' workers apply, whose page tables must equal rank 0's at every step."""
from __future__ import annotations

import dataclasses

import pytest

from cupyglm.engine.config import EngineConfig
from cupyglm.engine.page_evict import WHY, evict_for
from cupyglm.engine.prompt_cache import PromptCache
from cupyglm.engine.request import Request
from cupyglm.engine.sampling import SamplingParams
from cupyglm.engine.scheduler import Scheduler
from cupyglm.engine.ops.codec import decode, encode
from cupyglm.engine.ops.run import Run
from cupyglm.engine.step_message import from_plan
from cupyglm.engine.worker import Worker
from cupyglm.kv.page_store import PageStore
from cupyglm.kv.pool import PagePool
from cupyglm.kv.state import SeqState

PT, PAGES = 16, 10


class Arena:
    """The kept store's byte side, reduced to its bookkeeping (the bytes are the walk's, tested elsewhere)."""

    def __init__(self, pages: PageStore):
        self.pages, self.entries = pages, {}

    def shared_pages(self, length):
        return self.pages.shared_pages(length)

    def keep(self, eid, state, kept_pages):
        self.entries[eid] = state.length

    def restore(self, eid, state):
        state.length = self.entries[eid]

    def drop(self, eid):
        del self.entries[eid]


class _Runner:
    """A runner reduced to states and its pool (the replay runs no model)."""

    def __init__(self, pool):
        self.kv = type("KV", (), {"pool": pool, "host": None, "pages_needed": lambda s, n: -(-n // PT)})()

    def new_state(self):
        return SeqState()

    def release(self, state):
        self.kv.pool.release(state.pages)


class Replay:
    """Another rank: its own pool and page store, fed only the step messages (every operation but the run)."""

    def __init__(self):
        self.pool = PagePool(PAGES)
        self.pages = PageStore(self.pool, PT, limit=4)
        self.arena = Arena(self.pages)
        self.worker = Worker(_Runner(self.pool), 1, kept=self.arena)
        self.states = self.worker.states

    def run(self, plan, requests):
        msg = decode(encode(from_plan(plan, requests, set(), dict.fromkeys(plan.admitted, 0))))
        self.worker.execute(dataclasses.replace(msg, ops=tuple(_Advance(op) if isinstance(op, Run) else op
                                                               for op in msg.ops)))


class _Advance:
    """In the run's place: each group's state simply reaches its end."""

    def __init__(self, run: Run):
        self.run = run

    def apply(self, w, result):
        for g in self.run.groups:
            w.states[g.request_id].length = g.start + g.count


def make(limit=4):
    cfg = EngineConfig(context=PAGES * PT, num_pages=PAGES, page_tokens=PT, keep_grid=32, parallel=2,
                       prefill_chunk=32)
    pool = PagePool(PAGES)
    pages = PageStore(pool, PT, limit)
    return Scheduler(cfg, pool, PromptCache(100, lambda n: 1, max_entries=limit), pages), Replay()


def req(rid, prompt, max_tokens):
    return Request(rid, tuple(prompt), SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                   max_tokens=max_tokens)


def step(s, replay):
    """One step on 'rank 0' and on the replay; rank 0's page tables must equal the replay's."""
    plan = s.schedule()
    replay.run(plan, s.requests)
    for r in s.running:
        assert replay.states[r.id].pages == r.pages, (plan.step, r.id)
    assert replay.pool.free_ids() == s.pool.free_ids()
    assert replay.pages.entries == s.pages.entries
    s.update(plan, {g.request_id: 7 for g in plan.groups if g.logits})
    return plan


def drain(s, replay):
    plans = []
    while s.has_work():
        plans.append(step(s, replay))
    return plans


A = tuple(range(100, 140))                                 # 40 tokens: keep points at 32 and 40


def test_keep_holds_whole_pages_and_the_pool_counts_them():
    s, rp = make()
    s.add(req(1, A, 1))
    plans = drain(s, rp)
    assert [p.keeps for p in plans[:2]] == [((1, 0, 32),), ((1, 1, 40),)]
    assert s.pages.entries == {0: (0, 1), 1: (0, 1)}       # 40 tokens: page 2 is partly filled, so it is copied
    assert [s.pool.refcount(p) for p in range(3)] == [2, 2, 0]
    assert s.pool.free_count + s.pages.held == PAGES        # idle: free + the store's pages = all
    assert s.drop_kept() == (0, 1) and s.pool.free_count == PAGES and s.pages.held == 0


def test_restore_shares_the_entry_pages_and_leases_the_rest():
    s, rp = make()
    s.add(req(1, A, 1))
    drain(s, rp)
    s.add(req(2, A + (5, 6, 7), 2))                          # resumes at 40: shares pages 0, 1, leases page 2
    p = step(s, rp)
    assert p.restores == ((2, 1, 40),) and p.evicts == ()
    assert s.requests[2].pages == [0, 1, 2] and s.requests[2].cached == 40
    assert [s.pool.refcount(q) for q in range(3)] == [4, 4, 1]     # entries 0, 1, its keep at 43, itself
    drain(s, rp)
    assert s.pages.entries == {0: (0, 1), 1: (0, 1), 2: (0, 1)}    # the new prompt end at 43: pages 0, 1 again
    assert s.pool.free_count + s.pages.held == PAGES


def test_admission_evicts_pages_only_the_store_holds_before_leasing():
    s, rp = make()
    s.add(req(1, A, 1))
    drain(s, rp)                                            # the store holds pages 0, 1; 8 free
    s.add(req(2, range(500, 600), 60))                      # 159 positions: all 10 pages
    p = step(s, rp)
    assert p.evicts == (0, 1)                               # superseded keep point first, then the other
    assert [why for *_, why in s.cache.evicted] == [WHY, WHY]
    assert p.admitted == (2,) and s.requests[2].pages == [0, 1]      # the freed ids, lowest first
    assert s.pages.entries == {2: (0, 1)}                   # its own keep point at 32
    drain(s, rp)
    assert s.pool.free_count + s.pages.held == PAGES


def test_pages_a_running_request_holds_are_not_evictable():
    s, rp = make()
    s.add(req(1, A, 30))                                    # 69 positions: 5 pages; keeps share pages 0, 1
    step(s, rp)
    step(s, rp)
    assert s.pages.freeable(set()) == set()                 # request 1 still holds them
    s.add(req(2, range(500, 580), 10))                      # 89 positions: 6 pages > 5 free, nothing to evict
    p = step(s, rp)
    assert p.admitted == () and p.evicts == () and s.waiting[0].id == 2
    drain(s, rp)                                            # request 1 ends; then request 2 runs
    assert s.pool.free_count + s.pages.held == PAGES and 2 not in s.requests


def test_the_resumed_entry_is_protected_from_the_eviction():
    s, rp = make()
    s.add(req(1, A, 1))
    drain(s, rp)                                            # entries 0 and 1 hold pages 0, 1
    s.add(req(5, range(200, 232), 1))
    drain(s, rp)                                            # entry 2 holds pages 2, 3; 6 free
    s.add(req(2, A + tuple(range(600, 700)), 19))           # 158 positions: 10 pages, 2 shared from entry 1
    p = step(s, rp)
    assert p.restores == ((2, 1, 40),) and p.evicts == (2,)   # entry 1 is resumed and entry 0 frees nothing
    assert s.requests[2].pages == [0, 1, 2, 3]              # shared 0, 1; the freed 2, 3 for positions to 64
    drain(s, rp)
    assert s.pool.free_count + s.pages.held == PAGES


def test_evict_for_is_all_or_nothing():
    pool = PagePool(6)
    pages = PageStore(pool, PT, limit=4)
    cache = PromptCache(100, lambda n: 1, max_entries=4)
    held = pool.lease(4)                                    # a sequence's pages 0..3
    for tokens, table in (((1,) * 32, held[:2]), ((2,) * 32, held[2:4])):
        eid, _ = cache.plan_keep("", tokens, set())
        pages.hold(eid, table)
    pool.release(held[:3])                                  # the sequence lets go of 0..2; it still holds 3
    assert pages.freeable(set()) == {0, 1, 2}
    assert evict_for(cache, pages, 4, set()) is None and len(cache.entries) == 2
    assert evict_for(cache, pages, 1, {0}) == [1] and pool.free_ids() == [2, 4, 5]
    assert pages.entries == {0: (0, 1)}


def test_the_count_limit_drops_the_oldest_kept_prompt():
    s, rp = make(limit=2)
    for rid, base in enumerate((200, 300, 400)):
        s.add(req(rid, range(base, base + 32), 1))
        drain(s, rp)
    assert sorted(s.cache.entries) == [1, 2] and sorted(s.pages.entries) == [1, 2]
    assert s.pool.free_count + s.pages.held == PAGES


def test_shared_pages_with_the_mtp_head():
    assert PageStore(PagePool(1), 16, 1).shared_pages(32) == 2
    assert PageStore(PagePool(1), 16, 1, mtp=True).shared_pages(32) == 1      # its layer writes position 31 later
    assert PageStore(PagePool(1), 16, 1).shared_pages(15) == 0
    with pytest.raises(ValueError, match="at least one"):
        PageStore(PagePool(1), 16, 0)


def test_every_eviction_of_a_step_comes_before_its_first_restore_lease():
    s, rp = make()
    s.add(req(1, A, 1))
    drain(s, rp)                                            # entries 0, 1 hold pages 0, 1
    s.add(req(5, range(200, 232), 1))
    drain(s, rp)                                            # entry 2 holds pages 2, 3; 4..9 free
    s.add(req(2, A + (5, 6, 7), 2))                          # resumes at 40: needs 1 page beside the shared 0, 1
    s.add(req(3, range(700, 770), 27))                      # 96 positions: 6 pages, 1 short once request 2 counts
    p = step(s, rp)                                         # the replay applies the evicts before any lease
    assert p.admitted == (2, 3) and p.evicts == (2,) and p.restores == ((2, 1, 40),)
    assert s.requests[2].pages == [0, 1, 2]                 # page 2 came free in this step's evict section
    assert s.requests[3].pages == []                        # the chunk budget went to request 2's 3 tokens
    step(s, rp)
    assert s.requests[3].pages == [3, 4]
    drain(s, rp)
    assert s.pool.free_count + s.pages.held == PAGES


def test_the_count_limit_never_drops_a_protected_entry():
    cache = PromptCache(100, lambda n: 1, max_entries=1)
    a, _ = cache.plan_keep("", (1, 2), set())
    assert cache.plan_keep("", (3, 4), {a}) == (None, [])
    b, drops = cache.plan_keep("", (3, 4), set())
    assert drops == [a] and list(cache.entries) == [b]


def test_a_cache_clear_lets_go_of_the_kept_pages_on_the_planning_pool():
    s, rp = make()
    s.add(req(1, A, 1))
    drain(s, rp)
    assert s.pages.held == 2 and s.pool.free_count == PAGES - 2
    assert s.admin("clear").drops == (0, 1) and s.pages.entries == {} and s.pool.free_count == PAGES
