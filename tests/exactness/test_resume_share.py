"""Kept prompts as KV pool pages (CUPYGLM_KV_SHARE) through the real engine on one rank (numpy): resumed equals
cold token for token at whole-page and partly filled keep points, the store's pages counted at idle and all
free at stop, and a new request that needs pages only the store holds evicts them and runs."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.page_evict import WHY
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams
from cupyglm.kv.kept import KeptStore

PT = 16


def _engine(ckpt, pages=24, share=0, host=False, log=None):
    c = ckpt.config
    ops = NumpyOps()
    runner = ModelRunner(ckpt, ops, LocalComm(), pages, PT, poison=True)
    kept = KeptStore(c, ops, runner.kv, 1, 64 << 20, host=host, share=share) if share else None
    cfg = EngineConfig(context=pages * PT, num_pages=pages, page_tokens=PT, keep_grid=c.keep_grid, parallel=2,
                       prefill_chunk=c.keep_grid, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size,
                       poison=True)
    return Engine(runner, LocalComm(), cfg, None, kept=kept, log=log)


def _run(engine, prompts, max_tokens=4):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    toks, cached = {i: [] for i in ids}, {}
    while engine.has_work():
        for out in engine.step():
            toks[out.request_id] += out.new_token_ids
            if out.finished:
                cached[out.request_id] = out.cached_tokens
    return [toks[i] for i in ids], [cached[i] for i in ids]


def _prompt(n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(3, 400, size=n)]


def _idle(eng):
    """Free pages + the store's pages = every page, and the store's pages are exactly its entries' pages."""
    held = {p for pages in eng.worker.store.pages.entries.values() for p in pages}
    assert eng.free_pages + eng.store_pages == eng.total_pages and len(held) == eng.store_pages
    tables = eng.worker.store.pages.entries.values()
    assert all(eng.runner.kv.pool.refcount(p) == sum(p in t for t in tables) for p in held)


@pytest.mark.parametrize("host", [False, True])
def test_shared_pages_resume_equal_to_cold(tiny_ckpt, host):
    grid = tiny_ckpt.config.keep_grid
    base = _prompt(2 * grid + 7)                             # kept at grid, 2 grid (whole pages) and at its end
    warm, lines = _engine(tiny_ckpt, share=16, host=host), []
    warm.log = lines.append
    _run(warm, [base])
    _idle(warm)
    assert warm.store_pages == (2 * grid) // PT               # the end's last page is partly filled: copied
    for n, want in ((grid + 5, grid), (2 * grid + 3, 2 * grid), (2 * grid + 7 + 4, 2 * grid + 7)):
        prompt = base[:min(n, len(base))] + _prompt(max(0, n - len(base)), seed=n)
        got, cached = _run(warm, [prompt])
        assert cached == [want], n
        assert got == _run(_engine(tiny_ckpt), [prompt])[0], n
        _idle(warm)
    two = [base + _prompt(3, 1), base[:grid] + _prompt(9, 2)]      # two resumed at once share pages 0..
    assert _run(warm, two)[0] == [_run(_engine(tiny_ckpt), [p])[0][0] for p in two]
    _idle(warm)
    warm.shutdown()
    assert warm.free_pages == warm.total_pages and warm.store_pages == 0
    assert lines[-1] == f"rank 0: KV pages at stop: {warm.total_pages} of {warm.total_pages} free, 0 held by kept prompts"


def test_kept_bytes_skip_the_shared_pages(tiny_ckpt):
    grid = tiny_ckpt.config.keep_grid
    eng = _engine(tiny_ckpt, share=16)
    shared, full = eng.worker.store.kept, KeptStore(tiny_ckpt.config, eng.ops, eng.runner.kv, 1, 64 << 20)
    assert shared.state_bytes(grid) < full.state_bytes(grid)
    assert shared.state_bytes(grid) == shared.state_bytes(0)          # whole pages only: the fixed parts alone
    assert shared.state_bytes(grid + 3) > shared.state_bytes(grid)    # + the partly filled page's rows


def test_pool_pressure_evicts_the_store_and_resumes_equal(tiny_ckpt):
    grid = tiny_ckpt.config.keep_grid
    pages = 2 * grid // PT + 2                               # room for one conversation of 2 grid + a little
    eng = _engine(tiny_ckpt, pages=pages, share=16)
    a, b = _prompt(2 * grid, 11), _prompt(2 * grid, 12)
    _run(eng, [a], max_tokens=2)
    _idle(eng)
    assert eng.store_pages == 2 * grid // PT and eng.free_pages == 2
    got, cached = _run(eng, [b], max_tokens=20)               # needs pages only the store holds
    assert cached == [0] and got == _run(_engine(tiny_ckpt, pages=pages), [b], max_tokens=20)[0]
    assert {why for *_, why in eng.scheduler.cache.evicted} == {WHY}
    _idle(eng)
    got, cached = _run(eng, [b + _prompt(5, 13)])             # b's own keep points survived: resumed equal
    assert cached == [2 * grid]
    assert got == _run(_engine(tiny_ckpt, pages=pages), [b + _prompt(5, 13)])[0]
    _idle(eng)
