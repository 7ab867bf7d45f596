"""Kept prompt states on one rank (numpy): a resumed prompt gives the same tokens as a cold one, byte-for-byte
restores, cached_tokens and miss reasons, salts, and eviction within the budget with the pages back at the end."""
from __future__ import annotations

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.prompt_cache import MISS_EVICTED, MISS_NONE, MISS_OFF, MISS_SALT
from cupyglm.engine.runner import ModelRunner
from cupyglm.kv.kept import KeptStore
from model_helpers import random_prompt as _prompt, run_engine as _run

PAGES, PT = 24, 16


def _engine(ckpt, kept_pages: int = 0):
    c = ckpt.config
    ops = NumpyOps()
    runner = ModelRunner(ckpt, ops, LocalComm(), PAGES, PT, poison=True)
    kept = None
    if kept_pages:
        probe = KeptStore(c, ops, runner.kv, 1, 1 << 30)
        kept = KeptStore(c, ops, runner.kv, 1, kept_pages * probe.page_bytes)
    cfg = EngineConfig(context=PAGES * PT, num_pages=PAGES, page_tokens=PT, keep_grid=c.keep_grid, parallel=2,
                       prefill_chunk=c.keep_grid, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size,
                       poison=True)
    return Engine(runner, LocalComm(), cfg, None, kept=kept)


def test_resumed_equals_fresh_at_grid_and_prompt_end(tiny_ckpt):
    grid = tiny_ckpt.config.keep_grid
    base = _prompt(grid + 7)                                 # kept at the grid point and at its end
    warm = _engine(tiny_ckpt, kept_pages=400)
    _, info = _run(warm, [base])
    assert info == [(0, MISS_NONE)]
    for n, want in ((grid + 1, grid), (grid + 7 + 5, grid + 7), (2 * grid + 3, grid + 7)):
        prompt = base[:min(n, len(base))] + _prompt(max(0, n - len(base)), seed=n)
        got, info = _run(warm, [prompt])
        cold, cinfo = _run(_engine(tiny_ckpt), [prompt])
        assert got == cold and info == [(want, None)] and cinfo == [(0, MISS_OFF)], n
    assert warm.free_pages == PAGES


def test_salts_and_miss_reasons(tiny_ckpt):
    grid = tiny_ckpt.config.keep_grid
    p = _prompt(grid + 3, seed=5)
    eng = _engine(tiny_ckpt, kept_pages=400)
    _run(eng, [p], salt="a")
    assert _run(eng, [p + [9]], salt="b")[1] == [(0, MISS_SALT)]
    assert _run(eng, [p + [9]], salt="a")[1] == [(grid + 3, None)]


def test_eviction_keeps_budget_and_pages(tiny_ckpt):
    grid = tiny_ckpt.config.keep_grid
    eng = _engine(tiny_ckpt, kept_pages=1)
    one = eng.worker.store.kept.pages_for(grid + 3)
    eng = _engine(tiny_ckpt, kept_pages=one + eng.worker.store.kept.pages_for(grid) // 2)
    a, b = _prompt(grid + 3, seed=1), _prompt(grid + 3, seed=2)
    _run(eng, [a])
    _run(eng, [b])                                            # a's states go to make room
    why = [(length, reason) for _, _, length, reason in eng.scheduler.cache.evicted]
    assert why == [(grid, "superseded"), (grid + 3, "least recently used"), (grid, "superseded")]
    assert _run(eng, [a + [7]])[1] == [(0, MISS_EVICTED)]
    got, info = _run(eng, [b + [11]])
    assert got == _run(_engine(tiny_ckpt), [b + [11]])[0]
    held = sum(len(e.kept.pages) for e in eng.worker.store.kept.entries.values())
    kept = eng.worker.store.kept
    assert held == kept.pool.num_pages - kept.pool.free_count == eng.scheduler.cache.held_pages
    assert eng.free_pages == PAGES
