"""Feed-forward sublayers: the dense SwiGLU MLP and the MoE (sigmoid router + correction bias, top-k,
one shared expert, SwiGLU with a limit). Outputs are this rank's down_proj partial (fp32).

The swiglu limit clamps routed and shared experts; the dense MLP of the first layers is plain SwiGLU.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.config import ModelConfig
from cupyglm.model.batch import Weights


class MLP:
    def __init__(self, w: Weights, ops, limit: float | None):
        self.ops, self.limit = ops, limit
        self.gate, self.up, self.down = w("gate_proj.weight"), w("up_proj.weight"), w("down_proj.weight")

    def __call__(self, x):
        """x: [T, D] bf16 -> [T, D] fp32 partial."""
        ops = self.ops
        a = ops.swiglu(bf16(ops.gemm(x, self.gate)), bf16(ops.gemm(x, self.up)), self.limit)
        return ops.gemm(a, self.down)


class MoE:
    def __init__(self, cfg: ModelConfig, w: Weights, ops):
        self.cfg, self.ops = cfg, ops
        self.router = w("gate.weight")                          # [E, D]
        self.bias = w("gate.e_score_correction_bias")           # [E]
        self.experts = [MLP(w.sub(f"experts.{e}"), ops, cfg.swiglu_limit) for e in range(cfg.n_routed_experts)]
        self.shared = MLP(w.sub("shared_experts"), ops, cfg.swiglu_limit)

    def __call__(self, x):
        ops, c = self.ops, self.cfg
        xp = ops.xp
        ids, weights = ops.moe_route(ops.gemm(x, self.router), self.bias, c.num_experts_per_tok,
                                     c.routed_scaling_factor)
        ids_host = ops.asnumpy(ids)
        y = xp.zeros((x.shape[0], c.num_experts_per_tok, x.shape[1]), dtype=xp.float32)   # [T, k, D]
        for e in np.unique(ids_host):
            rows, slots = np.nonzero(ids_host == e)
            y[rows, slots] = self.experts[int(e)](x[rows])
        return ops.moe_combine(y, weights, self.shared(x))
