"""Structured output through the engine at TP=1 (in-process): guided outputs match their grammar and end "stop",
the requests batched with them keep the tokens they have alone, and the sim engine (kernel mask_rows) gives
the numpy engine's tokens.
"""
import json

import numpy as np
import pytest

from cupyglm.engine.grammar import Guide
from cupyglm.engine.sampling import SamplingParams

from tests.exactness.test_concurrent import make_engine, prompts, run

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "tag", "s"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 999},
                         "tag": {"enum": ["red", "green", "blue"]}, "s": {"type": "string", "maxLength": 6}}}


def valid(obj) -> bool:
    return (isinstance(obj, dict) and set(obj) == {"ok", "n", "tag", "s"} and isinstance(obj["ok"], bool)
            and type(obj["n"]) is int and 0 <= obj["n"] <= 999 and obj["tag"] in ("red", "green", "blue")
            and isinstance(obj["s"], str) and len(obj["s"]) <= 6)


def test_schema_outputs_validate_and_plain_rows_keep_their_tokens(tiny_ckpt):
    ps = prompts()
    guide = Guide("json_schema", json.dumps(SCHEMA))
    plain = [SamplingParams(temperature=0.0, max_tokens=24), SamplingParams(temperature=0.9, seed=5, max_tokens=24),
             SamplingParams(temperature=1.0, seed=9, top_k=40, max_tokens=24, logprobs=2)]
    guided = [SamplingParams(temperature=1.0, seed=s, max_tokens=64, guide=guide) for s in range(5)]
    mixed, _ = run(make_engine(tiny_ckpt), ps[:8], [plain[0], guided[0], plain[1], guided[1], guided[2], plain[2],
                                                     guided[3], guided[4]])
    alone = [run(make_engine(tiny_ckpt), [ps[i]], [p])[0][0] for i, p in ((0, plain[0]), (2, plain[1]), (5, plain[2]))]
    assert [mixed[i] for i in (0, 2, 5)] == alone
    for toks, text, reason in (mixed[i] for i in (1, 3, 4, 6, 7)):
        assert reason == "stop" and valid(json.loads(text)), text
        assert toks[-1] in tiny_ckpt.config.eos_token_ids
    # the same guided request alone: the grammar's tokens do not depend on the batch either
    assert run(make_engine(tiny_ckpt), [ps[3]], [guided[1]])[0][0] == mixed[3]


def test_unguided_run_differs(tiny_ckpt):
    """The mask is what makes the output parse: the same seeds without a grammar give no JSON."""
    res, _ = run(make_engine(tiny_ckpt), prompts()[:2], [SamplingParams(temperature=1.0, seed=s, max_tokens=24)
                                                       for s in range(2)])
    for _, text, _ in res:
        with pytest.raises(ValueError):
            json.loads(text)


@pytest.mark.parametrize("guide,check", [
    (Guide("regex", r"[0-9]{3}-[a-z]{2}"), lambda t: len(t) == 6 and t[:3].isdigit() and t[3] == "-"),
    (Guide("choice", json.dumps(["yes", "no", "maybe so"])), lambda t: t in ("yes", "no", "maybe so")),
    (Guide("grammar", 'start: "(" num ("+" num)* ")"\nnum: /[1-9]/'), lambda t: t[0] == "(" and t[-1] == ")"),
])
def test_regex_choice_grammar(tiny_ckpt, guide, check):
    res, _ = run(make_engine(tiny_ckpt), prompts()[:3], [SamplingParams(temperature=1.0, seed=s, max_tokens=40,
                                                                       guide=guide) for s in range(3)])
    for _, text, reason in res:
        assert reason == "stop" and check(text), text


def test_length_when_the_grammar_is_cut(tiny_ckpt):
    g = Guide("regex", "a{50}")
    (toks, text, reason), = run(make_engine(tiny_ckpt), prompts()[:1], [SamplingParams(max_tokens=5, guide=g)])[0]
    assert reason == "length" and set(text) == {"a"} and len(toks) == 5


def test_refused_combinations_and_bad_grammars(tiny_ckpt):
    g = Guide("regex", "a+")
    for kw in ({"ignore_eos": True}, {"min_tokens": 2}):
        with pytest.raises(ValueError, match="structured output"):
            SamplingParams(guide=g, **kw)
    e = make_engine(tiny_ckpt)
    for bad in (Guide("regex", "("), Guide("json_schema", '{"type": "nope"}'), Guide("json_schema", "{")):
        with pytest.raises(ValueError):
            e.add_request([1, 2, 3], SamplingParams(guide=bad))
    assert not e.has_work() and e.free_pages == e.total_pages


def test_sim_engine_masks_like_numpy(tiny_ckpt):
    from cupyglm.backend.sim_ops import SimOps
    from cupyglm.distributed.comm import LocalComm
    from cupyglm.engine.config import EngineConfig
    from cupyglm.engine.engine import Engine
    from cupyglm.engine.runner import ModelRunner

    c = tiny_ckpt.config
    ops = SimOps()
    runner = ModelRunner(tiny_ckpt, ops, LocalComm(), 32, 16)
    cfg = EngineConfig(context=256, num_pages=32, page_tokens=16, keep_grid=c.keep_grid, parallel=2, seed=0,
                       eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size)
    sim = Engine(runner, LocalComm(), cfg, tiny_ckpt.tokenizer)
    assert "mask_tokens" in ops.kernel_ops
    g = Guide("json_schema", json.dumps({"type": "object", "properties": {"a": {"enum": [1, 22, 333]}},
                                         "required": ["a"], "additionalProperties": False}))
    ps, params = prompts()[:2], [SamplingParams(temperature=1.0, seed=3, max_tokens=16, guide=g),
                                 SamplingParams(temperature=0.0, max_tokens=6)]
    got, _ = run(sim, ps, params)
    want, _ = run(make_engine(tiny_ckpt, pages=32), ps, params)
    assert got == want
    assert json.loads(got[0][1])["a"] in (1, 22, 333)
    assert np.all(np.asarray(got[1][0]) >= 0)
