"""The numpy backend's MoE ops (routing, the pair sort, SwiGLU, the combine, the decode rows' experts): part of
NumpyOps, the reference cuda_src/moe*.cu are checked against. The grouped GEMMs live in numpy_gemm."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16, f32, seq_sum, sigmoid_f32


class MoEOps:
    def moe_route(self, logits: np.ndarray, bias: np.ndarray, k: int, scale: float):
        """Sigmoid scores; top k of (score + bias), ties to the lower id; weights renormalised in pick
        order and scaled. logits: [T, E] fp32, bias: [E] bf16 -> (ids [T, k] int32, weights [T, k] fp32)."""
        bias = f32(bias)
        score = sigmoid_f32(logits)
        order = np.argsort(-(score + bias), axis=1, kind="stable")[:, :k].astype(np.int32)
        chosen = np.take_along_axis(score, order, axis=1)
        total = seq_sum([chosen[:, j] for j in range(k)]) + np.float32(1e-20)
        return order, (chosen / total[:, None] * np.float32(scale)).astype(np.float32)

    def swiglu(self, gate: np.ndarray, up: np.ndarray, limit: float | None) -> np.ndarray:
        """bf16(bf16(silu(min(gate, L))) * clip(up, -L, L)); no clamp when limit is None. gate, up bf16 -> bf16."""
        gate, up = f32(gate), f32(up)
        if limit is not None:
            gate = np.minimum(gate, np.float32(limit))
            up = np.clip(up, np.float32(-limit), np.float32(limit))
        return bf16(f32(bf16(gate * sigmoid_f32(gate))) * up)

    def moe_sort(self, ids: np.ndarray, n_experts: int):
        """ids [T, k] -> (order, group, src, pos) [T*k] int32: pairs p = (row p // k, slot p % k) by expert (ids
        outside [0, E) last), pair order within one; group = ids at order, src = order // k, pos = order's inverse."""
        flat = ids.reshape(-1).astype(np.int64)
        order = np.argsort(np.where((flat >= 0) & (flat < n_experts), flat, n_experts), kind="stable").astype(np.int32)
        pos = np.argsort(order).astype(np.int32)                  # the inverse permutation
        return order, flat[order].astype(np.int32), (order // ids.shape[1]).astype(np.int32), pos

    def moe_route_sort(self, logits: np.ndarray, bias: np.ndarray, k: int, scale: float, n_experts: int):
        """moe_route, then moe_sort of its ids: (ids, weights, order, group, src, pos)."""
        ids, weights = self.moe_route(logits, bias, k, scale)
        return (ids, weights, *self.moe_sort(ids, n_experts))

    def moe_combine(self, y: np.ndarray, weights: np.ndarray, shared: np.ndarray, pos=None) -> np.ndarray:
        """sum_k w_k y_k in slot order, then + shared; fp32. y: [T, k, D] (with pos: [T*k, D], slot j at pos[t*k+j])."""
        y = y if pos is None else y[pos].reshape(weights.shape + (y.shape[1],))
        acc = np.zeros_like(shared)
        for j in range(y.shape[1]):
            acc = acc + weights[:, j:j + 1] * y[:, j]
        return acc + shared

    def moe_experts(self, x, logits, bias, k: int, scale: float, w_gate, w_up, w_down, limit: float | None, sh_act,
                    sh_down) -> np.ndarray:
        """The routed experts of decode/verify rows x [T, D]: moe_route_sort, the grouped gate/up SwiGLU of x[src],
        the experts' down projection and the shared expert's (of sh_act [T, Ns]), moe_combine -> [T, D] fp32."""
        t = x.shape[0]
        ids, weights, _, group, src, pos = self.moe_route_sort(logits, bias, k, scale, logits.shape[1])
        pairs = t * ids.shape[1]
        a = self.gemm_grouped_swiglu(x[src], w_gate, w_up, group, limit, decode=pairs)
        ys, shared = self.gemm_grouped_dense(a, w_down, group, sh_act, sh_down, decode=pairs, decode2=t)
        return self.moe_combine(ys, weights, shared, pos)
