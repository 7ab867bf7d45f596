"""The engine on the `sim` backend samples through the kernel (cuda_src/sample.cu) and gives the same tokens
as on `numpy` (the NumPy reference of the op): two short prompts, greedy and seeded sampling with filters,
in one batch. Small on purpose: the tiny model on sim costs about a second per forward."""
from __future__ import annotations

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.sim_ops import SimOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams


def _engine(ckpt, ops):
    c = ckpt.config
    runner = ModelRunner(ckpt, ops, LocalComm(), 16, 16, poison=True)
    cfg = EngineConfig(context=64, num_pages=16, page_tokens=16, keep_grid=c.keep_grid, parallel=2, seed=0,
                       eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size, poison=True)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def _run(engine, prompts, params):
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    toks = {i: [] for i in ids}
    while engine.has_work():
        for out in engine.step():
            toks[out.request_id] += out.new_token_ids
    return [toks[i] for i in ids]


def test_sim_engine_samples_like_numpy(tiny_ckpt):
    prompts = [[5, 17, 300, 42], [7, 8, 9]]
    params = [SamplingParams(temperature=0.9, top_k=50, top_p=0.95, seed=3, max_tokens=4, ignore_eos=True),
              SamplingParams(temperature=1.2, min_p=0.02, min_tokens=2, seed=8, max_tokens=4)]
    ref = _run(_engine(tiny_ckpt, NumpyOps()), prompts, params)

    ops = SimOps()
    calls = []
    kernel = ops.sample

    def spy(logits, *rest):
        calls.append(logits.shape[0])
        return kernel(logits, *rest)

    ops.sample = spy
    got = _run(_engine(tiny_ckpt, ops), prompts, params)
    assert got == ref, (got, ref)
    assert "sample" in ops.kernel_ops and calls and max(calls) == 2      # both rows of a step in one call


def _run_outputs(engine, prompts, params):
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    got = {i: [] for i in ids}
    while engine.has_work():
        for out in engine.step():
            got[out.request_id].append((out.new_token_ids, out.logprobs, out.prompt_logprobs))
    return [got[i] for i in ids]


def test_sim_engine_logprobs_and_penalties_like_numpy(tiny_ckpt):
    """logprobs, prompt logprobs, penalties and logit_bias through their kernels (logprobs.cu, penalties.cu):
    the same tokens and the same logprob bits as the NumPy references."""
    prompts = [[5, 17, 300, 42], [7, 8, 9]]
    params = [SamplingParams(temperature=0.9, seed=3, max_tokens=3, ignore_eos=True, logprobs=3, prompt_logprobs=2,
                             presence_penalty=0.5, frequency_penalty=0.7, repetition_penalty=1.3),
              SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=0, logit_bias={11: 4.0, 12: -9.0})]
    ref = _run_outputs(_engine(tiny_ckpt, NumpyOps()), prompts, params)
    ops = SimOps()
    got = _run_outputs(_engine(tiny_ckpt, ops), prompts, params)
    assert got == ref
    assert {"logprobs", "penalize"} <= set(ops.kernel_ops)
    assert ref[0][0][2] is not None and len(ref[0][0][2]) == 3 and all(o[1] for o in ref[1])
