"""The GEMMs of the numpy reference (NumpyOps inherits them): gemm, gemm_heads, gemm_grouped and the gate/up +
SwiGLU forms, each output row from its own input row.

Every row sums in the tensor core's order (bf16: backend/tc_order.py; quantised: backend/tc_quant.py), whatever
its role: a decode/verify row through the kernel backends' GEMVs (cuda_src/gemv_tc.cuh, gemv_q_tc.cuh), a prompt
row through their tiled GEMMs (gemm_tc.cu, gemm_tc_q.cu). `decode` (backend/roles.py) is checked here and picks
the kernels there; it never changes a bit.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16, out_kind
from cupyglm.backend.qweight import QWeight
from cupyglm.backend.roles import decode_rows
from cupyglm.backend.tc_order import tc_rows
from cupyglm.backend.tc_quant import quant_rows


def round_out(y: np.ndarray, out: str) -> np.ndarray:
    """The epilogue: fp32 as summed, or rounded once to bf16."""
    return bf16(y) if out == "bf16" else y


def tc_gemm(x, w) -> np.ndarray:
    """x [M, K] @ w [N, K]^T fp32 in the tensor core's order: tc_rows for bf16 w, quant_rows for a QWeight."""
    return quant_rows(x, w) if isinstance(w, QWeight) else tc_rows(x, w)


MULTI_OUTS = ("f32", "bf16", "sigmoid_bf16")    # gemm_multi's epilogues (kinds 0, 1, 2 of gemv_multi.cu)
MULTI_PARTS = 6                                  # GEMV_MULTI_PARTS


def multi_parts(name: str, xs, ws, outs) -> None:
    """Refuse a gemm_multi call the kernel cannot take: 1..6 parts, one out choice each, rows shared."""
    if not 0 < len(xs) <= MULTI_PARTS or len(ws) != len(xs) or len(outs) != len(xs):
        raise ValueError(f"{name}: 1..{MULTI_PARTS} parts, each an x, a w and an out; got {len(xs)}, {len(ws)}, "
                         f"{len(outs)}")
    for o in outs:
        if o not in MULTI_OUTS:
            raise ValueError(f"{name}: out must be one of {MULTI_OUTS}, got {o!r}")
    if len({x.shape[0] for x in xs}) != 1:
        raise ValueError(f"{name}: every part's x must have the same rows, got {[x.shape for x in xs]}")


class NumpyGemm:
    def gemm(self, x: np.ndarray, w: np.ndarray, out: str = "f32", decode: int = 0) -> np.ndarray:
        """[M, K] bf16 x [N, K] bf16 -> [M, N] fp32; out="bf16" rounds it once. Rows [0, decode) are decode/verify
        rows, the rest prompt rows (the same tensor-core order either way)."""
        decode_rows("gemm", decode, x.shape[0])
        return round_out(tc_gemm(x, w), out_kind("gemm", out))

    def gemm_heads(self, x: np.ndarray, w: np.ndarray, out: str = "f32", decode: int = 0) -> np.ndarray:
        """Per-head GEMM: [H, M, K] bf16 x [H, N, K] bf16 -> [H, M, N] fp32 (or bf16 with out="bf16")."""
        decode_rows("gemm_heads", decode, x.shape[1])
        out_kind("gemm_heads", out)
        if x.ndim != 3 or w.ndim != 3 or x.shape[0] != w.shape[0] or x.shape[2] != w.shape[2]:
            raise ValueError(f"gemm_heads: x {x.shape} and w {w.shape} disagree")
        y = np.empty((x.shape[0], x.shape[1], w.shape[1]), dtype=np.float32)
        for h in range(x.shape[0]):
            y[h] = tc_gemm(x[h], w[h])
        return round_out(y, out)

    def gemm_grouped(self, x: np.ndarray, w: np.ndarray, group: np.ndarray, out: str = "f32",
                     decode: int = 0) -> np.ndarray:
        """Grouped expert GEMM: x [M, K] bf16, w [E, N, K] bf16, group [M] int32 expert of each row -> [M, N]
        fp32 (or bf16 with out="bf16"). Row m is exactly gemm(x[m:m+1], w[group[m]]): one gemm per
        expert present on its rows, scattered back."""
        out_kind("gemm_grouped", out)
        m, k = x.shape
        e, n, k2 = w.shape
        if k != k2:
            raise ValueError(f"gemm_grouped: x has K={k} but w has K={k2}")
        group = np.asarray(group)
        if group.shape != (m,):
            raise ValueError(f"gemm_grouped: group must have shape ({m},), got {group.shape}")
        decode_rows("gemm_grouped", decode, m)
        y = np.empty((m, n), dtype=np.float32)
        if m == 0:
            return round_out(y, out)
        if int(group.min()) < 0 or int(group.max()) >= e:
            raise ValueError(f"gemm_grouped: group holds expert ids outside [0, {e})")
        if m == 1 or bool((group[1:] >= group[:-1]).all()):      # sorted by expert: one slice per expert
            cuts = np.flatnonzero(group[1:] != group[:-1]) + 1
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), m]):
                y[a:b] = tc_gemm(x[a:b], w[group[a]])
            return round_out(y, out)
        for ex in np.unique(group):
            rows = np.nonzero(group == ex)[0]
            y[rows] = tc_gemm(x[rows], w[ex])
        return round_out(y, out)

    def gemm_multi(self, xs: tuple, ws: tuple, outs: tuple, decode: int = 0) -> tuple:
        """Several GEMMs of the same rows in one call: part p is gemm(xs[p], ws[p], outs[p]) (every x [M, K_p]
        bf16, w [N_p, K_p] bf16); outs[p] "sigmoid_bf16" is sigmoid(gemm(x, w), out="bf16"). The same bits as
        the separate calls; the kernel backends run the decode rows of all parts in one launch."""
        multi_parts("gemm_multi", xs, ws, outs)
        return tuple(self.sigmoid(self.gemm(x, w, decode=decode), out="bf16") if o == "sigmoid_bf16"
                     else self.gemm(x, w, out=o, decode=decode) for x, w, o in zip(xs, ws, outs))

    def rmsnorm_gemm_multi(self, x, w_norm, eps: float, ws: tuple, outs: tuple, decode: int = 0) -> tuple:
        """gemm_multi of rmsnorm(x, w_norm, eps) against every ws[p] (x [M, K] bf16): DSA's q_b and the indexer's
        wq_b of the normed q_a. The kernel backends compute the norm in the decode rows' GEMV prologue (one
        launch, the same bits)."""
        xn = self.rmsnorm(x, w_norm, eps)
        return self.gemm_multi((xn,) * len(ws), ws, outs, decode=decode)

    def kda_out_gemm(self, y, w_norm, gate, eps: float, w, decode: int = 0) -> np.ndarray:
        """gemm(kda_out(y, w_norm, gate, eps) viewed [T, H * V], w) fp32: KDA's gated output norm and o_proj
        (y, gate [T, H, V] bf16, w [N, H * V]). The kernel backends compute the norm in the decode rows' GEMV
        prologue (one launch, the same bits)."""
        o = self.kda_out(y, w_norm, gate, eps)
        return self.gemm(o.reshape(o.shape[0], -1), w, decode=decode)

    def gemm_and_swiglu(self, x, w, out: str, w_gate, w_up, limit: float | None, decode: int = 0):
        """(gemm(x, w, out), gemm_swiglu(x, w_gate, w_up, limit)) of the same rows: the MoE router's logits and
        the shared expert's activation (one launch on the kernel backends)."""
        if out not in ("f32", "bf16"):
            raise ValueError(f"gemm_and_swiglu: out must be 'f32' or 'bf16', got {out!r}")
        return self.gemm(x, w, out=out, decode=decode), self.gemm_swiglu(x, w_gate, w_up, limit, decode=decode)

    def gemm_grouped_dense(self, x, w, group, x2, w2, decode: int = 0, decode2: int = 0):
        """(gemm_grouped(x, w, group), gemm(x2, w2)) fp32: the MoE's experts' and shared expert's down projections
        (one launch on the kernel backends when all rows are decode rows)."""
        return self.gemm_grouped(x, w, group, decode=decode), self.gemm(x2, w2, decode=decode2)

    def gemm_swiglu(self, x, w_gate, w_up, limit: float | None, decode: int = 0) -> np.ndarray:
        """swiglu(gemm(x, w_gate, bf16), gemm(x, w_up, bf16), limit): the dense MLP's [M, N] bf16 activation."""
        return self.swiglu(self.gemm(x, w_gate, out="bf16", decode=decode),
                           self.gemm(x, w_up, out="bf16", decode=decode), limit)

    def gemm_grouped_swiglu(self, x, w_gate, w_up, group, limit: float | None, decode: int = 0) -> np.ndarray:
        """The experts' [M, N] bf16 activation: swiglu of the two grouped GEMMs (w_*: [E, N, K] bf16)."""
        return self.swiglu(*(self.gemm_grouped(x, w, group, out="bf16", decode=decode) for w in (w_gate, w_up)),
                           limit)
