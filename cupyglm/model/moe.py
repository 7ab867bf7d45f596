"""Feed-forward sublayers: the dense SwiGLU MLP and the MoE (sigmoid router + correction bias, top-k,
one shared expert, SwiGLU with a limit). Outputs are this rank's down_proj partial (fp32).

The swiglu limit clamps every SwiGLU alike: routed and shared experts and the dense MLP of the first layers.
"""
from __future__ import annotations

from cupyglm.config import ModelConfig
from cupyglm.model.batch import Weights


class MLP:
    def __init__(self, w: Weights, ops, limit: float | None):
        self.ops, self.limit = ops, limit
        self.gate, self.up, self.down = w("gate_proj.weight"), w("up_proj.weight"), w("down_proj.weight")

    def __call__(self, x, decode: int = 0):
        """x: [T, D] bf16, the leading `decode` rows decode/verify rows -> [T, D] fp32 partial."""
        ops = self.ops
        a = ops.gemm_swiglu(x, self.gate, self.up, self.limit, decode=decode)   # [T, inter] bf16, one kernel
        return ops.gemm(a, self.down, decode=decode)


class MoE:
    """Routed experts run as one grouped GEMM per projection over all (row, slot) pairs (ops.gemm_grouped, row-
    invariant: each pair's bits are those of its expert's own gemm), stacked once at init per rank shard."""

    def __init__(self, cfg: ModelConfig, w: Weights, ops):
        self.cfg, self.ops = cfg, ops
        self.router = w("gate.weight")                          # [E, D]
        self.bias = w("gate.e_score_correction_bias")           # [E] fp32 (stored F32)
        ex = range(cfg.n_routed_experts)
        self.gate = w.stack([f"experts.{e}.gate_proj.weight" for e in ex])    # [E, inter, D]
        self.up = w.stack([f"experts.{e}.up_proj.weight" for e in ex])        # [E, inter, D]
        self.down = w.stack([f"experts.{e}.down_proj.weight" for e in ex])    # [E, D, inter]
        self.limit = cfg.swiglu_limit
        self.shared = MLP(w.sub("shared_experts"), ops, cfg.swiglu_limit)

    def __call__(self, x, decode: int = 0):
        """x: [T, D] bf16, the leading `decode` rows decode/verify rows -> [T, D] fp32 partial. A call mixing
        roles runs each role's rows as their own call (rows are batch-invariant: the same bits), so the expert
        pairs of decode rows, sorted by expert, reach the grouped gemv and the prompt rows' the grouped gemm."""
        t = x.shape[0]
        if 0 < decode < t:
            return self.ops.xp.concatenate([self(x[:decode], decode), self(x[decode:], 0)])
        ops, c = self.ops, self.cfg
        sh = self.shared                                                      # router and shared gate/up: one op
        logits, sh_act = ops.gemm_and_swiglu(x, self.router, "f32", sh.gate, sh.up, sh.limit, decode=decode)
        # pairs p = (row p // k, slot p % k) sorted by expert, in pair order within one expert (on the device);
        # decode rows: routing, sort, the experts and the combine in two launches (ops.moe_experts)
        if decode:
            return ops.moe_experts(x, logits, self.bias, c.num_experts_per_tok, c.routed_scaling_factor, self.gate,
                                   self.up, self.down, self.limit, sh_act, sh.down)
        ids, weights = ops.moe_route(logits, self.bias, c.num_experts_per_tok, c.routed_scaling_factor)
        _, group, src, pos = ops.moe_sort(ids, c.n_routed_experts)
        xs = x[src]                                              # [T*k, D] bf16
        a = ops.gemm_grouped_swiglu(xs, self.gate, self.up, group, self.limit)    # [T*k, inter] bf16
        # [T*k, D] fp32 expert-sorted, and the shared expert's [T, D] fp32 output: one op
        ys, shared = ops.gemm_grouped_dense(a, self.down, group, sh_act, sh.down)
        return ops.moe_combine(ys, weights, shared, pos)         # slot j of row t: ys[pos[t*k + j]]
