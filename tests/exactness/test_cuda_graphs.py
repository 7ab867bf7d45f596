"""CUDA graphs of decode calls (model/graph_capture.py) through the CuPy double, whose stream capture records
work instead of running it and replays it on the same allocations (tests/cupy_double/capture.py):

* replay = eager, bit for bit (logits, hence tokens), for decode steps at several context lengths (one past the
  sparse limit) and batch sizes 1..5 (buckets 1, 2, 4, 8), the graphs captured once and replayed after;
* padded = unpadded: a 3-row call in the 4-row bucket gives each row's bits of the same rows eager and of each
  row alone;
* host launches per decode token drop, the graph launches and the kernels inside them counted apart;
* the engine with graphs (batches shrinking as requests finish; MTP verify groups and rollback replays) gives
  the numpy engine's tokens.
"""
from __future__ import annotations

import numpy as np
import pytest

import cupy_double
from cupy_double.fixtures import cuda_double_module  # noqa: F401
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.dist.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams
from cupyglm.model.glm import SeqInput

PROMPTS = [[5, 17, 300, 42], list(range(60, 100)), [7] * 13, [9, 8, 7, 6, 5, 4], [11] * 21]


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def cuda_ops(cuda_double_module):
    from cupyglm.backend.cuda_ops import CudaOps

    return CudaOps()


def _runner(ckpt, ops, graphs: bool) -> ModelRunner:
    return ModelRunner(ckpt, ops, LocalComm(), 64, 16, poison=True, graphs=graphs)


def _step(runner, ops, states, feed, decode: bool) -> list[np.ndarray]:
    out = runner.forward([SeqInput(f, s, decode=decode) for f, s in zip(feed, states)])
    return [ops.asnumpy(o.logits[-1]) for o in out]


def test_graph_replay_equals_eager_across_buckets_and_lengths(tiny_ckpt, cuda_ops):
    eager, graph = _runner(tiny_ckpt, cuda_ops, False), _runner(tiny_ckpt, cuda_ops, True)
    es, gs = [eager.new_state() for _ in PROMPTS], [graph.new_state() for _ in PROMPTS]
    feed = [np.asarray(p, np.int32) for p in PROMPTS]
    _step(eager, cuda_ops, es, feed, False)
    last = _step(graph, cuda_ops, gs, feed, False)
    tokens = [np.array([int(np.argmax(r))], np.int32) for r in last]
    # which sequences decode together at each step: 5 rows (bucket 8), 3 (4), 1, 2, 3 again (replays), 5 again
    plan = [[0, 1, 2, 3, 4], [0, 1, 2], [1], [3, 4], [0, 1, 2], [4], [0, 1, 2, 3, 4], [0, 1, 2]]
    for step, who in enumerate(plan):
        want = _step(eager, cuda_ops, [es[i] for i in who], [tokens[i] for i in who], True)
        got = _step(graph, cuda_ops, [gs[i] for i in who], [tokens[i] for i in who], True)
        for i, w, g in zip(who, want, got):
            assert np.isfinite(g).all(), f"step {step} seq {i}: non-finite logits (a poisoned buffer read?)"
            assert np.array_equal(bits(w), bits(g)), f"step {step} seq {i}: max diff {np.abs(w - g).max()}"
            tokens[i] = np.array([int(np.argmax(w))], np.int32)
    layers = tiny_ckpt.config.num_hidden_layers
    assert {b for _, b in graph.graphs.entries} == {1, 2, 4, 8}
    assert len(graph.graphs.entries) == 4 * layers                 # captured once per (layer, bucket)
    assert graph.graphs.replays == len(plan) * layers


def test_padded_rows_equal_unpadded_and_alone(tiny_ckpt, cuda_ops):
    who = [0, 1, 2]                                      # 3 rows in the 4-row bucket
    graph = _runner(tiny_ckpt, cuda_ops, True)
    eager = _runner(tiny_ckpt, cuda_ops, False)
    alone = [_runner(tiny_ckpt, cuda_ops, False) for _ in who]
    gs, es = [graph.new_state() for _ in who], [eager.new_state() for _ in who]
    ss = [a.new_state() for a in alone]
    feed = [np.asarray(PROMPTS[i], np.int32) for i in who]
    _step(graph, cuda_ops, gs, feed, False)
    _step(eager, cuda_ops, es, feed, False)
    last = [_step(a, cuda_ops, [s], [f], False)[0] for a, s, f in zip(alone, ss, feed)]
    for step in range(3):
        toks = [np.array([int(np.argmax(r))], np.int32) for r in last]
        got = _step(graph, cuda_ops, gs, toks, True)
        want = _step(eager, cuda_ops, es, toks, True)
        solo = [_step(a, cuda_ops, [s], [t], True)[0] for a, s, t in zip(alone, ss, toks)]
        for i in range(len(who)):
            assert np.array_equal(bits(got[i]), bits(want[i])), f"step {step} row {i}: padded != unpadded"
            assert np.array_equal(bits(got[i]), bits(solo[i])), f"step {step} row {i}: padded != alone"
        last = want
    assert set(graph.graphs.entries) == {(layer, 4) for layer in range(tiny_ckpt.config.num_hidden_layers)}


def test_graphs_cut_host_launches_per_decode_token(tiny_ckpt, cuda_ops):
    counts = {}
    for on in (False, True):
        runner = _runner(tiny_ckpt, cuda_ops, on)
        states = [runner.new_state() for _ in range(2)]
        last = _step(runner, cuda_ops, states, [np.asarray(p, np.int32) for p in PROMPTS[:2]], False)
        toks = [np.array([int(np.argmax(r))], np.int32) for r in last]
        _step(runner, cuda_ops, states, toks, True)                  # captures (graphs on)
        with cupy_double.counting() as c:
            _step(runner, cuda_ops, states, toks, True)
        counts[on] = c
    off, on = counts[False], counts[True]
    layers = tiny_ckpt.config.num_hidden_layers
    assert on.graph_launches == layers and off.graph_launches == 0 and on.captured == 0
    assert on.launches + on.graph_launches < off.launches
    assert on.launches + on.graph_kernels == off.launches           # the same kernels run, fewer from the host
    assert on.syncs == off.syncs and on.h2d == off.h2d


LENGTHS = [5, 40, 12, 20]
PARAMS = [SamplingParams(temperature=0, max_tokens=6),
          SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=6),
          SamplingParams(temperature=1.0, top_k=20, seed=5, max_tokens=5),
          SamplingParams(temperature=0.7, min_p=0.1, seed=9, max_tokens=6)]


def _engine(ckpt, ops, graphs: bool, drafts: int) -> Engine:
    c = ckpt.config
    runner = ModelRunner(ckpt, ops, LocalComm(), 32, 16, mtp=drafts > 0, poison=True, graphs=graphs)
    cfg = EngineConfig(context=128, num_pages=32, page_tokens=16, keep_grid=c.keep_grid, parallel=4, seed=0,
                       eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size, poison=True, mtp_drafts=drafts,
                       draft_pricing=False)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def _run(engine, prompts) -> list[list[int]]:
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, PARAMS)]
    got = {i: [] for i in ids}
    while engine.has_work():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
    assert engine.free_pages == engine.total_pages
    return [got[i] for i in ids]


@pytest.mark.parametrize("drafts", [0, 3])
def test_engine_with_graphs_equals_numpy(tiny_ckpt, cuda_ops, drafts):
    """4 concurrent mixed-sampling requests (batches shrinking as they finish; with drafts, verify groups and
    rollback replays as decode calls): the tokens of the numpy engine."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 496, n).tolist() for n in LENGTHS]
    eng = _engine(tiny_ckpt, cuda_ops, True, drafts)
    got = _run(eng, prompts)
    assert eng.runner.graphs.replays > 0
    assert got == _run(_engine(tiny_ckpt, NumpyOps(), False, drafts), prompts)
