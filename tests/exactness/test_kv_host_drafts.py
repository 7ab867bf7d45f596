"""KV rows in host memory (CUPYGLM_KV_HOST) with MTP drafts: verify calls gather through the row cache, a rejected
draft's rows are rewritten by the next call, and the tokens equal serial device-resident decoding.

A rejected draft wrote rows the row cache may hold (the verify call kept them); the next call rewrites those
positions, so a cached copy of them would be stale. Prompts cross the tiny model's dense/sparse limit (35).
"""
import numpy as np
import pytest

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams

from tests.exactness.test_drafts import Oracle, run

PAGE = 16


def make_engine(ckpt, drafts=0, host_slots=0, pages=96, context=512):
    c = ckpt.config
    runner = ModelRunner(ckpt, NumpyOps(), LocalComm(), pages, PAGE, mtp=True, poison=True, host_slots=host_slots)
    assert (runner.kv.host is not None) == bool(host_slots)
    cfg = EngineConfig(context=context, num_pages=pages, page_tokens=PAGE, keep_grid=c.keep_grid, parallel=4,
                       seed=0, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size, poison=True,
                       mtp_drafts=drafts, draft_pricing=False)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def _prompts():
    rng = np.random.default_rng(23)
    return [rng.integers(3, 480, n).tolist() for n in (20, 60, 200)]


PARAMS = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
          SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=40, ignore_eos=True),
          SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)]


@pytest.fixture(scope="module")
def serial(tiny_ckpt):
    ps = _prompts()
    return ps, run(make_engine(tiny_ckpt), ps, PARAMS)


def test_host_rows_mtp_drafts_equal_serial(tiny_ckpt, serial):
    """The MTP proposer (random weights, mostly rejected) with host rows: the serial device-resident tokens."""
    ps, want = serial
    for p, sp, w in zip(ps, PARAMS, want):                          # alone: the row cache serves one sequence
        eng = make_engine(tiny_ckpt, drafts=3, host_slots=512)
        got = run(eng, [p], [sp])[0]
        assert got[0] == w[0]
        assert got[3][0] > 0                                        # it verified drafts
        assert eng.runner.kv.host.take_stats()["hits"] > 0          # through the row cache


def test_host_rows_rejections_roll_back_exactly(tiny_ckpt, serial):
    """Drafts right up to a chosen position (rejections at every draft position, and full accepts), host rows:
    every rejected draft's rows are rewritten by the next call and never read from the row cache."""
    ps, want = serial
    n = 4
    for p, sp, w in zip(ps, PARAMS, want):
        eng = make_engine(tiny_ckpt, drafts=n, host_slots=512)
        eng.verifier.proposer = Oracle({0: (len(p), w[0])}, tiny_ckpt.config.vocab_size,
                                       wrong=lambda k, j: j == k % (n + 1))
        got = run(eng, [p], [sp])[0]
        assert got[0] == w[0]
        proposed, accepted = got[3]
        assert proposed > accepted > 0                              # some accepted, some rejected
        assert eng.verifier.replayed_rows > 0
        assert eng.runner.kv.host.take_stats()["hits"] > 0
