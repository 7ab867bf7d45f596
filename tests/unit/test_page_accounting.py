"""Page accounting through the real engine on the tiny model: 200 random requests, some aborted, some stopped.

Afterwards every page is free with exactly the ids of the start, and no sequence ever read another's page:
pages start NaN (poison), released pages are NaN-filled again, no logits may hold NaN, and every page table
the model reads through is the reading request's own and disjoint from every other live request's.
"""
import numpy as np
import pytest

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.request import QueueFull
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams

PAGES, PAGE_TOKENS = 96, 4


def _engine(ckpt):
    runner = ModelRunner(ckpt, NumpyOps(), LocalComm(), PAGES, PAGE_TOKENS, poison=True)
    c = ckpt.config
    cfg = EngineConfig(context=64, num_pages=PAGES, page_tokens=PAGE_TOKENS, keep_grid=c.keep_grid, parallel=16,
                       max_queue=24, prefill_chunk=128, seed=3, eos_token_ids=c.eos_token_ids,
                       vocab_size=c.vocab_size, poison=True)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def _instrument(engine):
    kv, pool, sched = engine.runner.kv, engine.runner.kv.pool, engine.scheduler
    stats = {"reads": 0, "nan_fills": 0}
    rows, release, forward = kv.rows, pool.release, engine.runner.forward

    def checked_rows(pages, positions):
        live = engine._states.values()                  # the worker's tables (the scheduler's plan, by id)
        owner = [s for s in live if s.pages is pages]
        assert len(owner) == 1, "a page table that belongs to no running request was read"
        assert any(r.pages == pages for r in sched.running), "a table that differs from the plan's was read"
        others = {p for s in live if s is not owner[0] for p in s.pages}
        assert not others & set(pages), "two live requests share a page"
        pos = np.asarray(positions)
        assert pos.max(initial=-1) < len(pages) * PAGE_TOKENS
        assert all(pool.refcount(p) == 1 for p in pages)
        stats["reads"] += 1
        return rows(pages, positions)

    def poisoning_release(pages):
        pages = list(pages)
        release(pages)
        per = PAGE_TOKENS // kv.cfg.index_kpool
        for p in pages:
            for arr in kv.latent.values():
                arr[p * PAGE_TOKENS:(p + 1) * PAGE_TOKENS] = np.nan
            for arr in kv.pooled.values():
                arr[p * per:(p + 1) * per] = np.nan
            stats["nan_fills"] += 1

    def finite_forward(batch, **kw):
        outs = forward(batch, **kw)
        for o in outs:
            assert np.isfinite(o.logits).all(), "NaN logits: a sequence read a row it did not write"
        return outs

    kv.rows, pool.release, engine.runner.forward = checked_rows, poisoning_release, finite_forward
    return stats


def _random_request(rng):
    n = int(rng.choice([1, 2, 3, 5, 9, 38], p=[.2, .2, .2, .17, .17, .06]))
    prompt = rng.integers(0, 496, n).tolist()
    kind = rng.integers(0, 4)
    kw = dict(max_tokens=int(rng.integers(1, 5)))
    if kind == 0:
        kw.update(temperature=0)
    elif kind == 1:
        kw.update(temperature=0.9, top_p=0.9, seed=int(rng.integers(0, 1000)))
    elif kind == 2:
        kw.update(temperature=1.0, stop_token_ids=rng.integers(0, 512, 40).tolist(), min_tokens=1)
    else:
        kw.update(temperature=0.8, top_k=40, stop=["e", "a"])
    return prompt, SamplingParams(**kw)


@pytest.mark.timeout(300)
def test_pages_all_come_back_with_the_same_ids(tiny_ckpt):
    engine = _engine(tiny_ckpt)
    pool = engine.runner.kv.pool
    start_ids = pool.free_ids()
    assert start_ids == list(range(PAGES)) and engine.free_pages == engine.total_pages == PAGES
    stats = _instrument(engine)
    rng = np.random.default_rng(20240611)
    todo = [_random_request(rng) for _ in range(200)]
    reasons, live, max_running = {}, set(), 0
    while todo or engine.has_work():
        for _ in range(int(rng.integers(0, 9))):
            if not todo:
                break
            try:
                live.add(engine.add_request(*todo[-1]))
                todo.pop()
            except QueueFull:
                break
        if live and rng.random() < 0.15:
            engine.abort(int(rng.choice(sorted(live))))
        max_running = max(max_running, engine.running)
        for out in engine.step():
            if out.finished:
                reasons[out.request_id] = out.finish_reason
                live.discard(out.request_id)
        held = sum(len(r.pages) for r in engine.scheduler.running)
        assert engine.free_pages == PAGES - held
    assert len(reasons) == 200
    counts = {k: list(reasons.values()).count(k) for k in ("stop", "length", "abort")}
    assert all(counts[k] >= 5 for k in counts), counts
    assert max_running >= 4
    assert pool.free_ids() == start_ids and pool.free_count == PAGES
    assert all(pool.refcount(p) == 0 for p in range(PAGES))
    assert stats["reads"] > 100 and stats["nan_fills"] > 100
    assert not engine._states


def test_too_long_is_refused_before_any_page(tiny_ckpt):
    engine = _engine(tiny_ckpt)
    from cupyglm.engine.request import RequestTooLong

    with pytest.raises(RequestTooLong, match="prompt of 60 tokens \\+ max_tokens 10 exceeds the context window of 64"):
        engine.add_request(list(range(60)), SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([1, 2, 600])
    assert engine.free_pages == PAGES and not engine.has_work()
