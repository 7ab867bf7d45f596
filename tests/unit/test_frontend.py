"""Rank 0's front end (engine/frontend.py) on the tiny model: every way a request ends (length, stop id, stop
string, abort waiting / running / during a step, refused, failed grammar) goes through the one `end`, once, with
its reason, and leaves nothing of the request in any map or queue of the engine, front end, scheduler, guides or
verifier, neither at once nor after the next step has told the ranks.
"""
import collections
import dataclasses
from collections.abc import Mapping

import pytest

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.grammar import Guide
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams

RID = 7_000_001                          # an id no page, entry or counter of the engine takes
PROMPT = list(range(40, 140))            # 100 tokens: two prefill chunks of the 64-token keep grid
SHORT = list(range(40, 52))
PAGES = 48


def make_engine(ckpt, parallel=2):
    c = ckpt.config
    runner = ModelRunner(ckpt, NumpyOps(), LocalComm(), PAGES, 16)
    cfg = EngineConfig(context=192, num_pages=PAGES, page_tokens=16, keep_grid=c.keep_grid, parallel=parallel,
                       prefill_chunk=c.keep_grid, seed=0, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size)
    eng = Engine(runner, LocalComm(), cfg, ckpt.tokenizer)
    ends = []
    end = eng.front.end
    eng.front.end = lambda rec, reason: (ends.append((rec.id, reason)), end(rec, reason))[1]
    return eng, ends


def leftovers(eng, rid, every_rank: bool = True) -> list[str]:
    """The attributes (maps, queues) that still hold request `rid`: of rank 0's front end, scheduler and guides
    (the release waiting to travel aside), and with `every_rank` also of the engine, verifier and message mirror."""
    holders = [getattr(eng, "front", None), eng.scheduler, eng.guides]
    if every_rank:
        holders += [eng, eng.verifier, getattr(eng, "_mirror", None)]
    found = []
    for obj in (h for h in holders if h is not None):
        for name, v in vars(obj).items():
            if isinstance(v, Mapping) and rid in v:
                found.append(f"{type(obj).__name__}.{name}")
            elif isinstance(v, (list, collections.deque)) and any(
                    x == rid or getattr(x, "id", None) == rid for x in v):
                found.append(f"{type(obj).__name__}.{name}")
    return [f for f in found if every_rank or f != "Scheduler._released"]


def finish(eng, rid, on_step=None) -> list:
    """Step until `rid` ends (`on_step(n)` before step n); its outputs."""
    got, n = [], 0
    while not (got and got[-1].finished):
        assert eng.has_work() and n < 200
        if on_step is not None:
            on_step(n)
        got += [o for o in eng.step() if o.request_id == rid]
        n += 1
    return got


def check_gone(eng, ends, rid, reason):
    assert ends == [(rid, reason)]
    assert leftovers(eng, rid, every_rank=False) == []
    while eng.has_work():                                # the next step carries the release to every rank
        eng.step()
    assert leftovers(eng, rid) == []
    assert eng.free_pages == eng.total_pages


@pytest.mark.parametrize("reason", ["length", "stop"])
def test_token_finishes_end_once(tiny_ckpt, reason):
    eng, ends = make_engine(tiny_ckpt)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=1, logprobs=1)
    if reason == "stop":
        first, _ = make_engine(tiny_ckpt)
        toks = [t for o in finish(first, first.add_request(SHORT, params)) for t in o.new_token_ids]
        params = dataclasses.replace(params, stop_token_ids=(toks[2],))
    outs = finish(eng, eng.add_request(SHORT, params, request_id=RID))
    assert outs[-1].finish_reason == reason and outs[0].prompt_logprobs is not None
    check_gone(eng, ends, RID, reason)


def test_stop_string_ends_once(tiny_ckpt):
    eng, ends = make_engine(tiny_ckpt)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    first, _ = make_engine(tiny_ckpt)
    text = "".join(o.new_text for o in finish(first, first.add_request(SHORT, params)))
    stop = text[len(text) // 2:len(text) // 2 + 2].strip() or text[-2:]
    outs = finish(eng, eng.add_request(SHORT, dataclasses.replace(params, stop=(stop,)), request_id=RID))
    assert outs[-1].finish_reason == "stop" and stop not in "".join(o.new_text for o in outs)
    check_gone(eng, ends, RID, "stop")


@pytest.mark.parametrize("when", ["waiting", "running", "in step"])
def test_aborts_end_once(tiny_ckpt, when):
    eng, ends = make_engine(tiny_ckpt, parallel=1)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=1)
    other = eng.add_request(SHORT, params)
    rid = eng.add_request(PROMPT, params, request_id=RID)
    if when == "waiting":
        assert eng.abort(rid)
    elif when == "running":
        finish(eng, other)
        eng.step()                                     # admitted, its first chunk's prompt logprobs gathered
        assert eng.abort(rid)
    else:
        finish(eng, other)
        forward = eng.runner.forward
        eng.runner.forward = lambda batch, **kw: (eng.abort(rid), forward(batch, **kw))[1]
    outs = finish(eng, rid)
    assert outs[-1].finish_reason == "abort" and not outs[-1].new_token_ids and not eng.abort(rid)
    check_gone(eng, [e for e in ends if e[0] == rid], rid, "abort")


def test_refused_ends_once_and_drops_its_prompt_logprobs(tiny_ckpt):
    """The refused path (a KV-rows gather past the host cache's slots) mid-prefill, with prompt logprobs gathered."""
    eng, ends = make_engine(tiny_ckpt)
    refuse = eng._host_refused
    eng._host_refused = lambda plan: {RID: "past the slots"} if plan.step == 1 else refuse(plan)
    rid = eng.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=2), request_id=RID)
    outs = finish(eng, rid)
    assert [(o.finish_reason, o.error) for o in outs] == [("error", "past the slots")]
    check_gone(eng, ends, RID, "error")


def test_failed_grammar_ends_once_and_drops_its_matcher(tiny_ckpt):
    eng, ends = make_engine(tiny_ckpt)
    guide = Guide("regex", "[a-z]+")
    rid = eng.add_request(SHORT, SamplingParams(temperature=0, max_tokens=6, guide=guide), request_id=RID)
    assert rid in eng.guides
    consume = eng.guides.consume
    eng.guides.consume = lambda r, tok: False if r == RID else consume(r, tok)
    outs = finish(eng, rid)
    assert outs[-1].finish_reason == "abort" and rid not in eng.guides
    check_gone(eng, ends, RID, "abort")
