"""The quantised tiny checkpoints (make-tiny --quant fp8|nvfp4) decode through the quantised weight-streaming GEMV
(cuda_src/gemv_q.cu): decode-role rows of every QWeight projection launch a gemv_*_{fp8,nvfp4} kernel and no
gemm_* kernel at all, and the logits are numpy's bit for bit, on sim (TP=1, TP=2) and on the `cuda` code path
through the CuPy double."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from cupy_double.fixtures import cuda_double_module  # noqa: F401
from cupyglm.backend.sim_ops import SimOps
from cupyglm.checkpoint.loader import Checkpoint
from cupyglm.checkpoint.tiny import write_tiny
from cupyglm.model.glm import SeqInput
from model_helpers import bits, build_models, run_ranks

PROMPTS = [[5, 17, 300, 42], list(range(60, 100))]
STEPS = 3


@pytest.fixture(scope="module", params=["fp8", "nvfp4"])
def qckpt(request, tmp_path_factory):
    return request.param, Checkpoint.open(write_tiny(tmp_path_factory.mktemp(request.param), quant=request.param))


class Recorder:
    """Wraps a Kernels' launch: the kernel names launched since the last take()."""

    def __init__(self, kernels):
        self.names: list[str] = []
        launch = kernels.launch

        def rec(src, name, *a, **kw):
            self.names.append(name)
            return launch(src, name, *a, **kw)

        kernels.launch = rec

    def take(self) -> list[str]:
        out, self.names = self.names, []
        return out


def _steps(models, asnumpy, feed_tokens, launched):
    """Prefill PROMPTS, then STEPS - 1 decode-role steps fed `feed_tokens`; rank 0's last logits [STEPS, B, V].
    launched(i) is a context manager around step i that returns the kernel names launched in it."""
    states = [[m.new_state() for _ in PROMPTS] for m in models]
    feed = [np.asarray(p, np.int32) for p in PROMPTS]
    out, names = [], []
    for i in range(STEPS):
        with launched(i) as got:
            res = run_ranks(models, lambda r, m: m.forward([SeqInput(f, s, decode=i > 0)
                                                            for f, s in zip(feed, states[r])]))
            out.append(np.stack([asnumpy(o.logits[-1]) for o in res[0]]))
        names.append(got())
        feed = [np.array([int(t)], np.int32) for t in feed_tokens[i]]
    for m, sts in zip(models, states):
        for s in sts:
            m.release(s)
    return np.stack(out), names


def _reference(ckpt, tp):
    """numpy's logits [STEPS, B, V] and greedy tokens per step."""
    models = build_models(ckpt, tp=tp)
    states = [[m.new_state() for _ in PROMPTS] for m in models]
    feed = [np.asarray(p, np.int32) for p in PROMPTS]
    out = []
    for i in range(STEPS):                   # the kernels' roles: a decode row sums in the tensor core's order
        res = run_ranks(models, lambda r, m: m.forward([SeqInput(x, s, decode=i > 0)
                                                        for x, s in zip(feed, states[r])]))
        out.append(np.stack([o.logits[-1] for o in res[0]]))
        feed = [np.array([int(t)], np.int32) for t in out[-1].argmax(-1)]
    return np.stack(out), [o.argmax(-1) for o in out]


def _check_launches(fmt, names):
    """The prompt step runs the dequantising GEMM; every decode step the quantised GEMV, a DSA layer's quantised
    and bf16 projections of one row in one launch (q_a, kv_a, wk; then q_b and wq_b behind the q_a norm), the MoE's
    router with its quantised shared expert in one launch, its two fused quantised launches (not the grouped GEMVs
    apart) and no gemm_* kernel."""
    for i, step in enumerate(names):
        gemms = sorted({n for n in step if n.startswith("gemm")})
        gemvq = sorted({n for n in step if n.startswith("gemv") and f"_{fmt}_" in n})
        if i == 0:
            assert any(f"_{fmt}_" in n for n in gemms), f"prompt step: {gemms}"
            continue
        assert not gemms, f"decode step {i} launched {gemms}"
        assert any(n.startswith(f"gemv_{fmt}_lane16") for n in gemvq), f"decode step {i}: no gemv_{fmt} in {gemvq}"
        assert not any(n.startswith("gemv_grouped") for n in gemvq), f"decode step {i}: {gemvq}"
        for name in (f"gemv_multi_{fmt}_lane16", f"gemv_multi_rmsnorm_{fmt}_lane16", f"gemv_multi_swiglu_{fmt}_lane16",
                     f"moe_route_swiglu_{fmt}_lane16", f"moe_down_combine_{fmt}_lane16"):
            assert name in step, f"decode step {i}: no {name} in {sorted(set(step))}"


@contextlib.contextmanager
def _recorded(rec):
    rec.take()
    names: list[str] = []
    yield lambda: names
    names.extend(rec.take())


@pytest.mark.parametrize("tp", [1, 2])
def test_sim_quantised_decode_runs_the_gemv_and_equals_numpy(qckpt, tp):
    fmt, ckpt = qckpt
    ref, greedy = _reference(ckpt, tp)
    ops = SimOps()
    rec = Recorder(ops.kernels)
    sim, names = _steps(build_models(ckpt, tp=tp, ops=ops), np.asarray, greedy, lambda i: _recorded(rec))
    assert np.isfinite(sim).all()
    assert np.array_equal(bits(ref), bits(sim))
    _check_launches(fmt, names)


@contextlib.contextmanager
def _counted(cupy_double):
    names: list[str] = []
    with cupy_double.counting(trace=True) as c:
        yield lambda: names
    names.extend(c.where.get("launches", {}))


def test_cuda_double_quantised_decode_runs_the_gemv_and_equals_numpy(qckpt, cuda_double_module):
    import cupy_double
    from cupyglm.backend.cuda_ops import CudaOps

    fmt, ckpt = qckpt
    ref, greedy = _reference(ckpt, 1)
    ops = CudaOps()
    dev, names = _steps(build_models(ckpt, tp=1, ops=ops), ops.asnumpy, greedy, lambda i: _counted(cupy_double))
    assert np.array_equal(bits(ref), bits(dev))
    _check_launches(fmt, names)
