"""The MoE's routed experts as grouped GEMMs (ops.gemm_grouped over all (row, slot) pairs) give exactly the bits
of the per-expert loop of ops.gemm they replaced, on the numpy and sim backends, for full and TP shards."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.sim_ops import SimOps
from cupyglm.model.batch import Weights
from cupyglm.model.moe import MLP, MoE


def _per_expert_loop(moe: MoE, experts: list[MLP], x, decode: bool = False):
    """The MoE as it was: one MLP (three ops.gemm) per expert present, on that expert's rows (all of them decode
    rows when `decode`: a row's role fixes its order)."""
    ops, c = moe.ops, moe.cfg
    d = x.shape[0] if decode else 0
    ids, weights = ops.moe_route(ops.gemm(x, moe.router, decode=d), moe.bias, c.num_experts_per_tok,
                                 c.routed_scaling_factor)
    y = np.zeros((x.shape[0], c.num_experts_per_tok, x.shape[1]), dtype=np.float32)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)
        y[rows, slots] = experts[int(e)](np.ascontiguousarray(x[rows]), len(rows) if decode else 0)
    return ops.moe_combine(y, weights, moe.shared(x, d))


@pytest.mark.parametrize("backend,rank,tp,t", [("numpy", 0, 1, 1), ("numpy", 0, 1, 97), ("numpy", 1, 2, 40),
                                               ("sim", 0, 1, 1), ("sim", 0, 1, 29)])
def test_grouped_moe_equals_per_expert_gemm_loop(tiny_ckpt, backend, rank, tp, t):
    cfg = tiny_ckpt.config
    ops = NumpyOps() if backend == "numpy" else SimOps()
    prefix = next(n for n in tiny_ckpt.names() if ".mlp.experts.0.gate_proj.weight" in n).split(".experts.")[0]
    w = Weights(tiny_ckpt.shard(rank, tp), ops, prefix)
    moe = MoE(cfg, w, ops)
    assert moe.gate.shape == (cfg.n_routed_experts, cfg.moe_intermediate_size // tp, cfg.hidden_size)
    assert moe.down.shape == (cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size // tp)
    experts = [MLP(w.sub(f"experts.{e}"), ops, cfg.swiglu_limit) for e in range(cfg.n_routed_experts)]
    x = bf16(np.random.default_rng(t * 10 + rank).standard_normal((t, cfg.hidden_size)).astype(np.float32))
    got = moe(x)
    want = _per_expert_loop(moe, experts, x)
    assert got.dtype == np.float32 and got.shape == (t, cfg.hidden_size)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if t > 1:   # a row's output does not depend on the batch it sits in
        assert np.array_equal(moe(x[t // 2:t // 2 + 1]).view(np.uint32), got[t // 2:t // 2 + 1].view(np.uint32))


@pytest.mark.parametrize("backend,rank,tp,t", [("numpy", 0, 1, 1), ("numpy", 1, 2, 16), ("sim", 0, 1, 1),
                                               ("sim", 1, 2, 9)])
def test_decode_moe_in_two_launches_equals_per_expert_gemm_loop(tiny_ckpt, backend, rank, tp, t, monkeypatch):
    """Decode rows take ops.moe_experts (on sim: routing, sort, gate/up SwiGLU in one launch, the down projections
    and the combine in the next): the bits of the per-expert loop of decode rows."""
    from cupyglm.kernels.ops import Kernels

    launched, launch = [], Kernels.launch
    monkeypatch.setattr(Kernels, "launch", lambda self, src, name, *a, **kw: (launched.append(name),
                                                                              launch(self, src, name, *a, **kw)))
    cfg = tiny_ckpt.config
    ops = NumpyOps() if backend == "numpy" else SimOps()
    prefix = next(n for n in tiny_ckpt.names() if ".mlp.experts.0.gate_proj.weight" in n).split(".experts.")[0]
    w = Weights(tiny_ckpt.shard(rank, tp), ops, prefix)
    moe = MoE(cfg, w, ops)
    experts = [MLP(w.sub(f"experts.{e}"), ops, cfg.swiglu_limit) for e in range(cfg.n_routed_experts)]
    x = bf16(np.random.default_rng(t * 7 + rank).standard_normal((t, cfg.hidden_size)).astype(np.float32))
    got = moe(x, decode=t)
    if backend == "sim":
        assert launched == ["gemv_multi_swiglu_lane16", "moe_route_swiglu_lane16", "moe_down_combine_lane16"]
    assert got.dtype == np.float32 and got.shape == (t, cfg.hidden_size)
    assert np.array_equal(got.view(np.uint32), _per_expert_loop(moe, experts, x, decode=True).view(np.uint32))
    if t > 1:   # a decode row's output does not depend on the rows beside it
        assert np.array_equal(moe(x[1:2], decode=1).view(np.uint32), got[1:2].view(np.uint32))
