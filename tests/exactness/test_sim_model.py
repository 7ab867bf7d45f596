"""The tiny model on the `sim` backend (every op a cuda_src kernel on the CPU emulator) against `numpy`.

* greedy generation: 3 prompts x 32 tokens, decoded together; at every step both backends are fed the same
  (numpy's) tokens and their logits compared: bit-identical (the kernels and the reference share each row role's
  order and exp_f32), so free-running greedy gives identical tokens;
* the output contract on sim: a row's logits never depend on its batch; prefill = decode (smaller than
  tests/exactness/test_model_exactness.py to stay fast).
"""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.sim_ops import SimOps
from cupyglm.model.glm import SeqInput
from model_helpers import bits, build_models, check_batch_invariant, check_prefill_equals_decode

PROMPTS = [[5, 17, 300, 42], list(range(60, 100)), [7] * 13]
STEPS = 32


@pytest.fixture(scope="module")
def numpy_model(tiny_ckpt):
    return build_models(tiny_ckpt, tp=1, num_pages=64)[0]


@pytest.fixture(scope="module")
def sim_model(tiny_ckpt):
    return build_models(tiny_ckpt, tp=1, num_pages=64, mtp=True, ops=SimOps())[0]


def _teacher_forced(ref, sim, prompts, steps):
    """Prefill together, then decode together feeding both models the reference's greedy tokens.
    Returns per step (ref logits [B, V], sim logits [B, V])."""
    rs, ss = [ref.new_state() for _ in prompts], [sim.new_state() for _ in prompts]
    feed = [np.asarray(p, np.int32) for p in prompts]
    out = []
    for step in range(steps):                  # the prompts, then decode rows (the gemv kernels on sim)
        lr = np.stack([o.logits[-1] for o in ref.forward([SeqInput(f, s, decode=step > 0) for f, s in zip(feed, rs)])])
        ls = np.stack([o.logits[-1] for o in sim.forward([SeqInput(f, s, decode=step > 0) for f, s in zip(feed, ss)])])
        out.append((lr, ls))
        feed = [np.array([int(np.argmax(r))], np.int32) for r in lr]
    for m, sts in ((ref, rs), (sim, ss)):
        for s in sts:
            m.release(s)
    return out


@pytest.fixture(scope="module")
def greedy_run(numpy_model, sim_model):
    return _teacher_forced(numpy_model, sim_model, PROMPTS, STEPS)


def test_greedy_logits_bit_identical_at_every_step(greedy_run):
    diffs = np.array([np.max(np.abs(lr - ls), axis=1) for lr, ls in greedy_run])          # [steps, prompts]
    print(f"sim vs numpy over {len(PROMPTS)} x {STEPS} steps: max |logit diff| {diffs.max():.4g}")
    assert all(np.isfinite(ls).all() for _, ls in greedy_run)
    assert all(np.array_equal(bits(lr), bits(ls)) for lr, ls in greedy_run)


def test_greedy_tokens_identical(greedy_run):
    ref = np.array([[int(np.argmax(r)) for r in lr] for lr, _ in greedy_run])
    sim = np.array([[int(np.argmax(r)) for r in ls] for _, ls in greedy_run])
    assert ref.tolist() == sim.tolist()


# ---- the output contract on sim ---------------------------------------------------------------------------------
@pytest.mark.parametrize("target, others, where", [
    ([3, 1, 4, 1, 5, 9, 2, 6], [[7] * 5, list(range(200, 240))], 1),
    (list(range(100, 140)), [[42]], 0),                 # 40 tokens: past the sparse limit (35)
])
def test_row_logits_do_not_depend_on_the_batch(sim_model, target, others, where):
    check_batch_invariant(sim_model, target, others, where)


# single-token calls at the start, around the 16-token chunk edge and across the sparse limit (35)
ONE_AT_EDGES = [1, 1, 1, 13, 1, 1, 1, 1, 15, 1, 1, 1]


@pytest.mark.parametrize("splits", [[38], ONE_AT_EDGES, [3, 33, 2]])
def test_prefill_equals_decode(sim_model, splits):
    """38 tokens (sparse from position 35) in one call, one at a time at the edges, or split: identical state, KV,
    logits."""
    check_prefill_equals_decode(sim_model, np.random.default_rng(11).integers(0, 496, sum(splits)).astype(np.int32),
                                splits)
