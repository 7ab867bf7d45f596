"""The prefix store (rank 0's kept-state tiers behind one object): the null store never hits and refuses the
admin operations by name; a disk load the ranks could not all read is forgotten by the memory tier, with no
callback into the scheduler."""
from __future__ import annotations

import pytest

from cupyglm.engine.config import EngineConfig
from cupyglm.engine.disk_tier import MISS_DISK, DiskIndex, DiskPlanner
from cupyglm.engine.prefix_store import NullStore, PrefixStore
from cupyglm.engine.prompt_cache import MISS_OFF, PromptCache
from cupyglm.engine.request import Request
from cupyglm.engine.sampling import SamplingParams
from cupyglm.engine.scheduler import Scheduler
from cupyglm.kv import disk_file as df

PT, PAGES = 16, 10


def cfg() -> EngineConfig:
    return EngineConfig(context=PAGES * PT, num_pages=PAGES, page_tokens=PT, keep_grid=32, parallel=2,
                        prefill_chunk=32)


def req(rid, prompt, max_tokens=1):
    return Request(rid, tuple(prompt), SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                   max_tokens=max_tokens)


def test_the_null_store_never_hits_and_refuses_admin():
    s = Scheduler(cfg())
    assert isinstance(s.store, NullStore) and s.cache is None and s.pages is None
    s.add(req(1, range(40)))
    plan = s.schedule()
    assert s.requests[1].miss_reason == MISS_OFF and plan.keeps == () and plan.disk is None
    with pytest.raises(ValueError, match="unknown cache operation"):
        s.admin("flush")
    with pytest.raises(ValueError, match="no prompt cache"):
        s.admin("clear")


def test_a_failed_load_is_forgotten_by_the_memory_tier():
    prompt = tuple(range(100, 150))
    planner = DiskPlanner(DiskIndex(1 << 20), lambda n: n)
    salt = df.salt_digest("")
    planner.index.add(df.state_key(salt, prompt[:32]), salt, prompt[:32], 32)
    cache = PromptCache(8, lambda n: -(-n // PT))
    s = Scheduler(cfg(), store=PrefixStore(cache, None, planner))
    s.add(req(1, prompt))
    plan = s.schedule()
    (eid, length, _), = plan.disk.loads
    assert length == 32 and eid in cache.entries and plan.groups == ()    # the request waits for its load
    assert s.store.loading(1)
    s.store.resolved({eid: False})
    assert eid not in cache.entries and s.requests[1].miss_reason == MISS_DISK
    assert s.schedule().groups[0].start == 0                              # served fresh
