"""The radix tree against a brute-force dict of keys, and the prompt-cache index's rules: salts, the budget,
superseded keep points first, never a protected (resumed) entry, miss reasons."""
from __future__ import annotations

import numpy as np

from cupyglm.engine.prompt_cache import MISS_EVICTED, MISS_NONE, MISS_OFF, MISS_SALT, PromptCache
from cupyglm.engine.radix import RadixTree


def test_radix_matches_brute_force():
    rng = np.random.default_rng(0)
    tree, ref = RadixTree(), {}
    for step in range(1200):
        key = tuple(int(t) for t in rng.integers(0, 3, size=int(rng.integers(0, 9))))
        op = rng.random()
        if op < 0.5:
            assert tree.insert(key, step) == ref.get(key)
            ref[key] = step
        elif op < 0.75:
            assert tree.remove(key) == ref.pop(key, None)
        else:
            limit = int(rng.integers(0, 10))
            best = max((k for k in ref if len(k) <= min(limit, len(key)) and key[:len(k)] == k), key=len,
                       default=None)
            assert tree.longest(key, limit) == ((ref[best], len(best)) if best is not None else (None, 0))
            assert tree.has_longer(key) == any(len(k) > len(key) and k[:len(key)] == key for k in ref)
        assert tree.size == len(ref)
        for k, v in ref.items():
            assert tree.get(k) == v


def test_index_rules():
    pc = PromptCache(10, lambda n: n // 10)               # a state of n tokens takes n // 10 kept pages
    assert PromptCache(0, lambda n: 1).lookup("", (1, 2))[2] == MISS_OFF
    a = tuple(range(100))
    e40, drops = pc.plan_keep("", a[:40], set())
    e60, drops = pc.plan_keep("", a[:60], set())
    assert drops == [] and pc.free_pages == 0
    assert pc.plan_keep("", a[:60], set()) == (None, [])                  # already kept: touched
    assert pc.lookup("", a[:70])[:2] == (e60, 60) and pc.lookup("", a[:60])[:2] == (e40, 40)
    assert pc.lookup("x", a[:70])[2] == MISS_SALT
    b = tuple(range(200, 300))
    eb, drops = pc.plan_keep("", b[:40], {e60})
    assert drops == [e40]                                                 # the superseded keep point first
    assert pc.lookup("", a[:50])[2] == MISS_EVICTED
    assert pc.lookup("", (7, 7, 7))[2] == MISS_NONE
    assert pc.plan_keep("", b[:100], {e60}) == (None, [])               # cannot fit beside the protected one
    eid, drops = pc.plan_keep("", b[:100], set())
    assert sorted(drops) == [e60, eb] and pc.free_pages == 0 and [e[3] for e in pc.evicted] == \
        ["superseded", "superseded", "least recently used"]


def test_the_index_alone_leases_kept_pages_lowest_first():
    """The ids a keep carries to every rank: lowest free first, an evicted entry's pages reused, a forgotten one's
    back in the pool."""
    pc = PromptCache(6, lambda n: n // 10)
    a, b = tuple(range(100)), tuple(range(200, 300))
    e1, _ = pc.plan_keep("", a[:20], set())
    e2, _ = pc.plan_keep("", b[:30], set())
    assert pc.ids_of(e1) == (0, 1) and pc.ids_of(e2) == (2, 3, 4)
    e3, drops = pc.plan_keep("", a[:30], set())                           # supersedes e1: its pages reused
    assert drops == [e1] and pc.ids_of(e3) == (0, 1, 5)
    pc.forget(e2)
    assert pc.free_pages == 3 and pc.arena.free_ids() == [2, 3, 4]


def test_kept_copy_bench_runs():
    """bench/kept_copy.py: a restore moves exactly the state's bytes (a smoke run at one grid point)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "kept_copy.py"
    spec = importlib.util.spec_from_file_location("kept_copy", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.measure(64, 1, 1, host=True)
    assert r["nbytes"] > 0 and r["pieces"] > 0 and r["restore_s"] > 0
