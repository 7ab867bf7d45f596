"""The quantised tiny checkpoints (make-tiny --quant fp8|nvfp4) through the model: sim = numpy bit for bit (TP=1
and TP=2), a row's logits independent of its batch, prefill = decode, weights held packed, and the logits
within the stated tolerance of the bf16 tiny's.

Tolerance: the tiny random model amplifies weight error (8 layers, random hyper-connection mixes), so a bound in
absolute logits says little. The stated bound is relative to the format's own rounding error: the quantised
model's logit error against bf16 (RMS over every step, relative to the logits' RMS) must stay within 1.25x that
of the bf16 model whose same projections carry random relative noise of the format's measured per-weight RMS
error (FP8 e4m3 ~2.6%, NVFP4 ~9.5%). A scale read from the wrong block or nibbles swapped give errors of order
the weights themselves, far outside it.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.qweight import QWeight
from cupyglm.backend.sim_ops import SimOps
from cupyglm.checkpoint import names, tiny_quant
from cupyglm.checkpoint.loader import Checkpoint
from cupyglm.checkpoint.tiny import write_tiny
from cupyglm.kv.store import KVStore
from cupyglm.model.glm import GLMModel, SeqInput
from model_helpers import ThreadComm, ThreadGroup, bits, build_models, check_prefill_equals_decode, prefill_all, \
    run_ranks

PROMPTS = [[5, 17, 300, 42], list(range(60, 100)), [7] * 13]
FORMAT_ERROR = {"fp8": 0.0265, "nvfp4": 0.095}        # per-weight relative RMS error of the format (measured)


@pytest.fixture(scope="module", params=["fp8", "nvfp4"])
def qckpt(request, tmp_path_factory):
    return request.param, Checkpoint.open(write_tiny(tmp_path_factory.mktemp(request.param), quant=request.param))


def _steps(models, feed_tokens=None, steps=8):
    """Prefill PROMPTS together, then decode together (fed `feed_tokens` per step, else greedy) on every rank;
    rank 0's last logits per step [steps, B, V]."""
    states = [[m.new_state() for _ in PROMPTS] for m in models]
    feed = [np.asarray(p, np.int32) for p in PROMPTS]
    out = []
    for i in range(steps):
        res = run_ranks(models, lambda r, m: m.forward([SeqInput(f, s) for f, s in zip(feed, states[r])]))
        logits = np.stack([o.logits[-1] for o in res[0]])
        out.append(logits)
        nxt = logits.argmax(-1) if feed_tokens is None else feed_tokens[i]
        feed = [np.array([int(t)], np.int32) for t in nxt]
    for m, sts in zip(models, states):
        for s in sts:
            m.release(s)
    return np.stack(out)


def test_quantised_projections_are_held_packed(qckpt, tiny_ckpt):
    fmt, ckpt = qckpt
    model = build_models(ckpt, tp=1)[0]
    expected = {s.name for s in names.all_specs(ckpt.config) if tiny_quant.release_quantised(s, ckpt.config)}
    assert ckpt.quantised == expected and expected
    moe = model.blocks[ckpt.config.first_k_dense_replace].mlp
    for w in (moe.gate, moe.up, moe.down, moe.shared.gate):
        assert isinstance(w, QWeight) and w.fmt == fmt and w.values.dtype == np.uint8
    assert ckpt.nbytes() < 0.75 * tiny_ckpt.nbytes()          # values + scales, as stored


@pytest.mark.parametrize("tp", [1, 2])
def test_sim_equals_numpy(qckpt, tp):
    _, ckpt = qckpt
    ref = _steps(build_models(ckpt, tp=tp), steps=4)
    sim = _steps(build_models(ckpt, tp=tp, ops=SimOps()), feed_tokens=ref.argmax(-1), steps=4)
    assert np.isfinite(sim).all()
    assert np.array_equal(bits(ref), bits(sim))


def test_row_logits_do_not_depend_on_the_batch(qckpt):
    _, ckpt = qckpt
    model = build_models(ckpt, tp=1, ops=SimOps())[0]
    target = list(range(100, 140))                      # past the sparse limit (35)
    alone, _ = prefill_all(model, [target])
    together, _ = prefill_all(model, [[42] * 7, target, [3, 1, 4]])
    assert np.array_equal(bits(alone[0]), bits(together[1]))


def test_prefill_equals_decode(qckpt):
    _, ckpt = qckpt
    model = build_models(ckpt, tp=1)[0]
    check_prefill_equals_decode(model, np.arange(3, 43, dtype=np.int32), [5, 1, 1, 17, 16])


def _perturbed(ckpt, eps: float, seed: int = 1):
    """The bf16 model with its release-quantised projections multiplied by (1 + eps * N(0, 1)) elementwise."""
    cfg = ckpt.config
    specs = {s.name: s for s in names.all_specs(cfg)}
    rng = np.random.default_rng(seed)

    class Noisy(dict):
        def __getitem__(self, name):
            a = ckpt.read_shard(name, 0, 1)
            if tiny_quant.release_quantised(specs[name], cfg):
                f = a.astype(np.float32)
                f = f * (np.float32(1) + np.float32(eps) * rng.standard_normal(f.shape).astype(np.float32))
                a = f.astype(ml_dtypes.bfloat16)
            return a

    ops = NumpyOps()
    return GLMModel(cfg, Noisy(), ops, ThreadComm(ThreadGroup(1), 0), KVStore(cfg, ops, 64, cfg.page_tokens, True))


def _rel(a, b) -> float:
    return float(np.sqrt(((a - b) ** 2).mean()) / np.sqrt((b ** 2).mean()))


def test_logits_within_tolerance_of_bf16(qckpt, tiny_ckpt):
    fmt, ckpt = qckpt
    ref = _steps(build_models(tiny_ckpt, tp=1), steps=16)
    toks = ref.argmax(-1)
    q = _steps(build_models(ckpt, tp=1), feed_tokens=toks, steps=16)
    noisy = _steps([_perturbed(tiny_ckpt, FORMAT_ERROR[fmt])], feed_tokens=toks, steps=16)
    err, bound = _rel(q, ref), 1.25 * _rel(noisy, ref)
    agree = float((q.argmax(-1) == toks).mean())
    print(f"{fmt}: logits rel RMS error {err:.3f} (matched-noise bf16 {bound / 1.25:.3f}, bound {bound:.3f}), "
          f"max |diff| {np.abs(q - ref).max():.3f}, argmax agreement {agree:.3f} over {toks.size} rows")
    assert err <= bound


def test_engine_concurrent_equals_solo(qckpt):
    """Through the offline LLM at TP=1: 3 mixed-sampling requests together give each one's solo tokens."""
    from cupyglm import LLM, SamplingParams

    _, ckpt = qckpt
    prompts = [list(range(10, 50)), [5, 6, 7], [300] * 9]
    params = [SamplingParams(temperature=0, max_tokens=6),
              SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=6),
              SamplingParams(temperature=1.1, top_k=20, seed=8, max_tokens=5, ignore_eos=True)]
    llm = LLM(model=str(ckpt.path), backend="numpy", parallel=3, context=128, kv_pages=32, log=False)
    try:
        together = [c.token_ids for c in llm.generate(prompts, params)]
        alone = [llm.generate([p], [sp])[0].token_ids for p, sp in zip(prompts, params)]
    finally:
        llm.close()
    assert together == alone and all(together)
