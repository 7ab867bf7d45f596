"""Concurrent equals solo, and chunked equals unchunked, through the engine at TP=1 (in-process).

Eight prompts of different lengths (past position 35 where the tiny model's attention turns sparse, across
several 16-token pages and the 64-token keep grid) with greedy and seeded sampling, stop strings, stop ids,
min_tokens and ignore_eos: the token ids of each are bit-identical run together (parallel 4) and alone.
"""
import numpy as np
import pytest

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams

LENGTHS = [5, 150, 37, 70, 12, 100, 40, 66]


def make_engine(ckpt, parallel=4, prefill_chunk=0, pages=96, context=256, poison=True):
    c = ckpt.config
    runner = ModelRunner(ckpt, NumpyOps(), LocalComm(), pages, 16, poison=poison)
    cfg = EngineConfig(context=context, num_pages=pages, page_tokens=16, keep_grid=c.keep_grid, parallel=parallel,
                       prefill_chunk=prefill_chunk, seed=0, eos_token_ids=c.eos_token_ids,
                       vocab_size=c.vocab_size, poison=poison)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def run(engine, prompts, params):
    """Submit all, step until done; per prompt (token ids, text, finish reason). Also the most running at once."""
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    got = {i: ([], [], None) for i in ids}
    most = 0
    while engine.has_work():
        most = max(most, engine.running)
        for out in engine.step():
            toks, text, _ = got[out.request_id]
            toks += out.new_token_ids
            text.append(out.new_text)
            if out.finished:
                got[out.request_id] = (toks, text, out.finish_reason)
    assert engine.free_pages == engine.total_pages
    return [(got[i][0], "".join(got[i][1]), got[i][2]) for i in ids], most


def prompts():
    rng = np.random.default_rng(7)
    return [rng.integers(0, 496, n).tolist() for n in LENGTHS]


def base_params():
    return [
        SamplingParams(temperature=0, max_tokens=10),
        SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=12),
        SamplingParams(temperature=1.0, top_k=20, seed=5, max_tokens=8),
        SamplingParams(temperature=0.7, min_p=0.1, seed=9, max_tokens=16),           # + a stop string
        SamplingParams(temperature=0, max_tokens=12),                                 # + a stop token id
        SamplingParams(temperature=1.2, seed=11, min_tokens=6, ignore_eos=True, max_tokens=10),
        SamplingParams(temperature=0.9, top_k=50, top_p=0.95, min_p=0.02, seed=13, max_tokens=12),
        SamplingParams(temperature=1.0, seed=17, min_tokens=3, max_tokens=6, stop_token_ids=(1, 2)),
    ]


@pytest.fixture(scope="module")
def case(tiny_ckpt):
    """The eight requests, with a stop string and a stop id picked from a first run so that they do stop."""
    ps, params = prompts(), base_params()
    eng = make_engine(tiny_ckpt)
    (first, _), = [run(eng, [ps[i]], [params[i]]) for i in (3,)]
    toks3, text3, _ = first[0]
    assert len(text3) >= 4, text3
    stop = text3[len(text3) // 2:len(text3) // 2 + 2].strip() or text3[-2:]
    (first4, _), = [run(eng, [ps[4]], [params[4]])]
    toks4 = first4[0][0]
    from dataclasses import replace
    params[3] = replace(params[3], stop=(stop,))
    params[4] = replace(params[4], stop_token_ids=(toks4[4],))
    return ps, params


def test_concurrent_equals_solo(tiny_ckpt, case):
    ps, params = case
    together, most = run(make_engine(tiny_ckpt, parallel=4), ps, params)
    assert most == 4
    eng = make_engine(tiny_ckpt, parallel=4)
    alone = [run(eng, [p], [sp])[0][0] for p, sp in zip(ps, params)]
    for i, (t, a) in enumerate(zip(together, alone)):
        assert t[0] == a[0], f"request {i}: concurrent {t[0]} != solo {a[0]}"
        assert t[1:] == a[1:], f"request {i}"
    reasons = [t[2] for t in together]
    assert reasons[3] == "stop" and params[3].stop[0] not in together[3][1]
    assert reasons[4] == "stop" and together[4][0][-1] == params[4].stop_token_ids[0]
    assert len(together[5][0]) == 10 and reasons[5] == "length"
    assert all(len(t[0]) <= sp.max_tokens for t, sp in zip(together, params))
    # the same engine again (pages reused, other ids): still the same tokens
    again, _ = run(eng, ps, params)
    assert [a[0] for a in again] == [t[0] for t in together]


CHUNK_PARAMS = [SamplingParams(temperature=0, max_tokens=6), SamplingParams(temperature=0.8, seed=3, max_tokens=6)]


@pytest.fixture(scope="module")
def unchunked(tiny_ckpt):
    p = prompts()[1]                              # 150 tokens, in one chunk (the default chunk is 512)
    whole, _ = run(make_engine(tiny_ckpt, prefill_chunk=0), [p, p], CHUNK_PARAMS)
    return [w[0] for w in whole]


@pytest.mark.parametrize("chunk", [64, 128])
def test_chunked_equals_unchunked(tiny_ckpt, unchunked, chunk):
    p = prompts()[1]
    eng = make_engine(tiny_ckpt, prefill_chunk=chunk)
    plans = []
    schedule = eng.scheduler.schedule

    def spy():
        plan = schedule()
        plans.append(plan)
        return plan

    eng.scheduler.schedule = spy
    chunked, _ = run(eng, [p, p], CHUNK_PARAMS)
    assert [c[0] for c in chunked] == unchunked
    ends = sorted({g.end for plan in plans for g in plan.groups if not g.decode})
    assert all(e % 64 == 0 for e in ends if e != 150) and 150 in ends and len(ends) >= 2


def test_abort_midway_leaves_others_unchanged(tiny_ckpt, case):
    ps, params = case
    eng = make_engine(tiny_ckpt, parallel=4)
    ids = [eng.add_request(p, sp) for p, sp in zip(ps[:4], params[:4])]
    got = {i: [] for i in ids}
    reasons = {}
    step = 0
    while eng.has_work():
        step += 1
        if step == 3:
            assert eng.abort(ids[1])
        for out in eng.step():
            got[out.request_id] += out.new_token_ids
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    assert reasons[ids[1]] == "abort"
    solo = make_engine(tiny_ckpt)
    for k in (0, 2, 3):
        assert got[ids[k]] == run(solo, [ps[k]], [params[k]])[0][0][0]
    assert eng.free_pages == eng.total_pages


def test_llm_offline_api(tiny_ckpt):
    from cupyglm import LLM, SamplingParams as SP

    llm = LLM(backend="numpy", parallel=2, context=128, kv_pages=32, log=False)
    try:
        outs = llm.generate(["Hello world!", [5, 6, 7]], [SP(temperature=0, max_tokens=4, ignore_eos=True),
                                                         SP(seed=1, max_tokens=3)])
        assert [o.index for o in outs] == [0, 1] and outs[1].prompt_token_ids == [5, 6, 7]
        assert len(outs[0].token_ids) == 4 and outs[0].finish_reason == "length"
        eng = make_engine(tiny_ckpt, pages=32, context=128)
        ref = run(eng, [llm.tokenizer.encode("Hello world!")], [SP(temperature=0, max_tokens=4, ignore_eos=True)])
        assert outs[0].token_ids == ref[0][0][0]
        chat = llm.chat([{"role": "user", "content": "Hi"}], SP(temperature=0, max_tokens=2, ignore_eos=True))
        assert len(chat) == 1 and len(chat[0].token_ids) == 2
    finally:
        llm.close()
