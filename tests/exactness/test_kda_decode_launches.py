"""A KDA layer's decode rows through the CuPy double: four launches a layer, whatever the batch (one multi-GEMV of
x, the decode step with the low-rank second factors f_b, g_b inside it, one kda_step per sequence, the gated norm
once, and o_proj's GEMV); a mixed call's prompt rows take f_b and g_b as GEMMs of their own."""
from __future__ import annotations

import collections

import numpy as np
import pytest

from cupy_double.fixtures import cuda_double_module  # noqa: F401
import cupy_double
from cupy_double.state import STATE
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.runner import ModelRunner
from cupyglm.model.glm import SeqInput


@pytest.fixture(scope="module")
def cuda_ops(cuda_double_module):
    from cupyglm.backend.cuda_ops import CudaOps

    return CudaOps()


def _kda_launches(runner, feeds, cupy_kernels=None):
    """The RawKernel launches of each KDA layer's attention in one forward call of feeds, by kernel name (and
    CuPy's own kernels into the dict cupy_kernels when given)."""
    per_layer = {}
    blocks = [b for b in runner.model.blocks if b.is_kda]

    def wrap(b):
        inner = b.attn

        def attn(*args, **kw):
            before = [collections.Counter(STATE.where.get(k, {})) for k in ("launches", "kernels")]
            out = inner(*args, **kw)
            per_layer[b.layer] = collections.Counter(STATE.where.get("launches", {})) - before[0]
            if cupy_kernels is not None:
                cupy_kernels[b.layer] = collections.Counter(STATE.where.get("kernels", {})) - before[1]
            return out
        return inner, attn

    saved = {}
    for b in blocks:
        saved[b.layer], b.attn = wrap(b)
    try:
        with cupy_double.counting(trace=True):
            out = runner.model.forward(feeds)
    finally:
        for b in blocks:
            b.attn = saved[b.layer]
    assert sorted(per_layer) == [b.layer for b in blocks]
    return per_layer, out


@pytest.mark.parametrize("prompts", [[[5, 17, 300, 42]], [[5, 17, 300], list(range(60, 100)), [7] * 13]],
                         ids=["one", "three"])
def test_kda_decode_rows_four_launches(tiny_ckpt, cuda_ops, prompts):
    runner = ModelRunner(tiny_ckpt, cuda_ops, LocalComm(), 64, 16)
    states = [runner.new_state() for _ in prompts]
    out = runner.forward([SeqInput(np.asarray(p, np.int32), s) for p, s in zip(prompts, states)])
    toks = [int(np.argmax(cuda_ops.asnumpy_checked(o.logits[-1]))) for o in out]
    copies = {}
    per_layer, _ = _kda_launches(runner, [SeqInput(np.array([t], np.int32), s, decode=True)
                                          for t, s in zip(toks, states)], copies)
    want = {"gemv_multi_lane16": 1, "kda_step": len(prompts), "kda_out": 1, "gemv_lane16": 1}
    for layer, got in per_layer.items():
        assert dict(got) == want, f"layer {layer}: {dict(got)}"
        # each sequence's step writes its rows of y and gate in place (out= views): no CuPy copy of them
        assert "setitem" not in copies[layer] and "copy" not in copies[layer], f"layer {layer}: {dict(copies[layer])}"
    # a prompt chunk after the decode rows: its rows' f_b and g_b as GEMMs, the decode rows' inside kda_step
    states.append(runner.new_state())
    per_layer, _ = _kda_launches(runner, [SeqInput(np.array([toks[0]], np.int32), states[0], decode=True),
                                          SeqInput(np.arange(3, 9, dtype=np.int32), states[-1])])
    for layer, got in per_layer.items():
        rec = sum(c for name, c in got.items() if name.startswith("kda_recurrence"))    # any K / rows form
        assert got["kda_step"] == 1 and got["gemv_multi_lane16"] == 1 and rec == 1, dict(got)
        assert got["gemm_tc_bf16"] >= 2, dict(got)           # f_b and g_b of the prompt rows
    for s in states:
        runner.release(s)
