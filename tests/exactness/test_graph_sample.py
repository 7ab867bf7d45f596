"""Sampling inside the captured exit graph (engine/graph_ends.py, engine/step_sample.plain_rows), through the
strict CuPy double:

* the exit graph's draw is the eager `ops.sample` of the same rows with the same (seed, position) columns:
  greedy and seeded top-k / top-p / min-p rows, 3 rows padded into the 4-row bucket = the same rows eager =
  each row alone (bucket 1), over several steps;
* the engine with graphs: a plain decode step (no penalties, grammar, min_tokens bans or logprobs) launches no
  eager sample kernel and stacks no logits rows, its tokens read back from the graph; a step with one request
  that edits its logits or asks for logprobs samples eagerly; the tokens are the graphs-off engine's either way
  (verify groups: test_cuda_graphs.test_engine_with_graphs_equals_numpy[3] draws them in the exit graph).
"""
from __future__ import annotations

import numpy as np
import pytest

import cupy_double
from cupy_double.fixtures import cuda_double_module  # noqa: F401
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams
from cupyglm.engine.draw import upload_params
from cupyglm.model.glm import SeqInput
from cupyglm.engine.draw import SampleRows

PROMPTS = [[5, 17, 300, 42], list(range(60, 100)), [7] * 13]
COLUMNS = [(0.0, 0, 1.0, 0.0, 3, 0),                  # (temperature, top_k, top_p, min_p, seed; position set later)
           (0.9, 20, 0.9, 0.0, 2**63 + 11, 0),
           (1.1, 0, 1.0, 0.1, 7, 0)]


@pytest.fixture(scope="module")
def cuda_ops(cuda_double_module):
    from cupyglm.backend.cuda_ops import CudaOps

    return CudaOps()


def _runner(ckpt, ops, graphs: bool) -> ModelRunner:
    return ModelRunner(ckpt, ops, LocalComm(), 64, 16, poison=True, graphs=graphs)


def _drawn(runner, ops, states, toks, cols) -> list[int]:
    """One decode call of the sequences; graphs: drawn in the exit graph, else ops.sample on the eager logits."""
    sample = SampleRows(cols) if runner.graphs is not None else None
    out = runner.forward([SeqInput(t, s, decode=True) for t, s in zip(toks, states)], sample=sample)
    if sample is not None:
        assert sample.tokens is not None, "the call did not draw in its exit graph"
        return [int(t) for t in ops.asnumpy(sample.tokens)]
    logits = ops.xp.stack([o.logits[-1] for o in out])
    return [int(t) for t in ops.asnumpy(ops.sample(logits, *upload_params(ops.xp, cols)))]


def test_exit_graph_draws_the_eager_tokens_padded_and_alone(tiny_ckpt, cuda_ops):
    graph, eager = _runner(tiny_ckpt, cuda_ops, True), _runner(tiny_ckpt, cuda_ops, False)
    gs, es, ss = ([r.new_state() for _ in PROMPTS] for r in (graph, eager, graph))     # ss: each row alone
    for r, st in ((graph, gs), (eager, es), (graph, ss)):
        r.forward([SeqInput(np.asarray(p, np.int32), s) for p, s in zip(PROMPTS, st)])
    toks = [np.array([i + 1], np.int32) for i in range(len(PROMPTS))]
    for step in range(4):
        cols = [c[:5] + (s.length + 1,) for c, s in zip(COLUMNS, es)]
        want = _drawn(eager, cuda_ops, es, toks, cols)
        got = _drawn(graph, cuda_ops, gs, toks, cols)                # 3 rows in the 4-row bucket
        solo = [_drawn(graph, cuda_ops, [s], [t], [c])[0] for s, t, c in zip(ss, toks, cols)]      # bucket 1
        assert got == want == solo, f"step {step}: graph {got}, eager {want}, alone {solo}"
        toks = [np.array([t], np.int32) for t in want]
    ends = graph.ends
    assert ends.sampled == 4 * (1 + len(PROMPTS)) and set(ends.buckets) == {1, 4}
    assert all(e.exit is not None and e.sample is not None for e in ends.buckets.values())


PARAMS = [SamplingParams(temperature=0, max_tokens=7),
          SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=7),
          SamplingParams(temperature=1.0, top_k=20, seed=5, max_tokens=6),
          SamplingParams(temperature=0.7, min_p=0.1, seed=9, max_tokens=7)]
MIXED = [SamplingParams(temperature=0.9, seed=3, repetition_penalty=1.3, max_tokens=3),
         SamplingParams(temperature=0, logprobs=2, max_tokens=2)]


def _engine(ckpt, ops, graphs: bool) -> Engine:
    c = ckpt.config
    runner = ModelRunner(ckpt, ops, LocalComm(), 32, 16, poison=True, graphs=graphs)
    cfg = EngineConfig(context=128, num_pages=32, page_tokens=16, keep_grid=c.keep_grid, parallel=6, seed=0,
                       eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size, poison=True)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def _run(engine, prompts, params) -> tuple[list[list[int]], list[tuple]]:
    """Tokens per request and, per step that made tokens after every prompt's first token: (drew in the exit
    graph, (eager sample launches, CuPy stacks) of the step, whether it captured graphs: their warm-up runs the
    work once eagerly)."""
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    got = {i: [] for i in ids}
    steps, ends = [], engine.runner.ends
    while engine.has_work():
        prefilled = all(got[i] for i in ids)
        before = ends.sampled if ends is not None else 0
        with cupy_double.counting(trace=True) as c:
            outs = engine.step()
        for out in outs:
            got[out.request_id] += out.new_token_ids
        if prefilled and any(out.new_token_ids for out in outs):
            eager = c.where.get("launches", {}).get("sample_rows", 0), c.where.get("kernels", {}).get("stack", 0)
            steps.append(((ends.sampled if ends is not None else 0) > before, eager, c.captured > 0))
    assert engine.free_pages == engine.total_pages
    return [got[i] for i in ids], steps


def test_plain_steps_draw_in_the_exit_graph_with_the_eager_tokens(tiny_ckpt, cuda_ops):
    """(Verify groups drawn in the exit graph: test_cuda_graphs.test_engine_with_graphs_equals_numpy[3].)"""
    rng = np.random.default_rng(5)
    params = PARAMS + MIXED
    prompts = [rng.integers(0, 496, n).tolist() for n in (5, 40, 12, 20, 9, 16)]
    got, steps = _run(_engine(tiny_ckpt, cuda_ops, True), prompts, params)
    want, off = _run(_engine(tiny_ckpt, cuda_ops, False), prompts, params)
    assert got == want
    assert not any(g for g, _, _ in off) and all(e[0] == 1 for _, e, _ in off), off   # graphs off: eager
    drew = [e for g, e, captured in steps if g and not captured]
    assert drew and all(e[0] == 0 for e in drew), f"steps (in the graph, (samples, stacks), captured): {steps}"
    assert all(e[0] == 1 for g, e, _ in steps if not g)
    assert all(e[1] == 0 for e in drew) and all(e[1] > 0 for _, e, _ in off)
    assert any(not g for g, _, _ in steps)                   # the penalised and logprobs requests' steps: eager
