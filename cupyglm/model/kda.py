"""KDA (Kimi Delta Attention) layer: projections, 4-tap short conv, the per-token delta rule, gated norm.

Heads are this rank's share (q/k/v, conv, f_b, g_b, b, A_log, dt_bias split by head); the output is this
rank's o_proj partial (fp32), summed across ranks by the caller.
"""
from __future__ import annotations

import numpy as np

from cupyglm.config import ModelConfig
from cupyglm.memory import alloc, kda_state_arrays, storage_of
from cupyglm.model.batch import Segment, Weights, decode_rows

L2_EPS = 1e-6


class KDALayer:
    def __init__(self, cfg: ModelConfig, w: Weights, ops, layer: int, tp: int):
        self.cfg, self.ops, self.layer, self.tp = cfg, ops, layer, tp
        self.heads = cfg.kda_num_heads // tp
        self.dk = cfg.kda_head_dim
        xp = ops.xp
        self.w_qkv = xp.concatenate([w("q_proj.weight"), w("k_proj.weight"), w("v_proj.weight")])
        conv = [w(f"{x}_conv1d.weight").reshape(-1, cfg.kda_conv_size) for x in "qkv"]   # stored [C, 1, taps]
        self.conv = xp.concatenate(conv)
        self.f_a, self.f_b = w("f_a_proj.weight"), w("f_b_proj.weight")
        self.g_a, self.g_b = w("g_a_proj.weight"), w("g_b_proj.weight")
        self.b = w("b_proj.weight")
        self.a_log = w("A_log")                                   # [H_rank] fp32 (stored F32)
        self.dt_bias = w("dt_bias").reshape(self.heads, self.dk)  # [H_rank, K] fp32 (stored F32)
        self.o_norm = w("o_norm.weight")                          # [K]
        self.o_proj = w("o_proj.weight")                          # [D, H_rank * K]

    def new_state(self) -> tuple[np.ndarray, np.ndarray]:
        """Zeroed ([H, V, K] fp32 state, [3, 3HK] bf16 conv window), as cupyglm.memory describes them."""
        state, conv = kda_state_arrays(self.cfg, self.tp, self.layer)
        storage = storage_of(self.ops)
        return alloc(self.ops.xp, state, storage), alloc(self.ops.xp, conv, storage)

    def __call__(self, x, segs: list[Segment] | None, slots=None):
        """x: [T, D] bf16 (normed). Returns this rank's o_proj partial [T, D] fp32. slots (the states in the caller's
        slots at fixed addresses): (S [slots, H, K, K] fp32, window [slots, taps - 1, 3HK] bf16, seg [E, 3] int32,
        done [E, H] int32): every row a decode/verify row, the sequences' states stepped in place in their slots
        (segs unused); None: per segment of segs, out of place."""
        ops, k = self.ops, self.dk
        d = x.shape[0] if slots is not None else decode_rows(segs)
        # every projection of x in one call: [T, 3HK], [T, r] x2, [T, H] bf16; the low-rank second factors (f_b,
        # g_b) of decode rows inside their step, of prompt rows in _segments
        qkv, fa, ga, beta = ops.gemm_multi((x, x, x, x), (self.w_qkv, self.f_a, self.g_a, self.b),
                                           ("bf16", "bf16", "bf16", "sigmoid_bf16"), decode=d)
        if slots is not None:
            S, window, seg, done = slots
            y, gate_out = ops.kda_step_slots(S, qkv, window, self.conv, fa, ga, self.f_b, self.g_b, self.a_log,
                                             self.dt_bias, beta, seg, done, self.cfg.kda_gate_lower_bound, L2_EPS,
                                             k ** -0.5)                                 # [T, H, V], [T, H, K] bf16
        else:
            y, gate_out = self._segments(x, qkv, fa, ga, beta, segs, d)
        # the gated output norm and o_proj (for decode rows one launch: the norm in the GEMV's prologue)
        return ops.kda_out_gemm(y, self.o_norm, gate_out, self.cfg.rms_norm_eps, self.o_proj, decode=d)

    def _segments(self, x, qkv, fa, ga, beta, segs: list[Segment], d: int):
        """Each segment's rows on its sequence's state, out of place (new state arrays) -> (y [T, H, V], gate_out
        [T, H, K]) bf16. The prompt rows [d, T) take a and gate_out from one gemm_multi of f_b and g_b."""
        ops, h, k = self.ops, self.heads, self.dk
        t = x.shape[0]
        if d < t:
            a_p, gate_p = (g.reshape(-1, h, k) for g in ops.gemm_multi((fa[d:], ga[d:]), (self.f_b, self.g_b),
                                                                        ("bf16", "bf16")))   # [T - d, H, K] bf16
        whole = len(segs) == 1 and segs[0].n == t                     # one sequence: its rows are all of y
        y = gate = None
        if not whole:
            y = ops.xp.empty((t, h, k), dtype=ops.bf16_dtype)        # [T, H, V] bf16
            gate = ops.xp.empty((t, h, k), dtype=ops.bf16_dtype)     # [T, H, K] bf16
            if d < t:
                gate[d:] = gate_p
        for seg in segs:
            S, window = seg.state.kda_state[self.layer], seg.state.kda_conv[self.layer]
            r = seg.rows
            if seg.decode:     # written into the call's rows in place (views of y and gate) when not whole
                ys, gs, S, window = self._step(S, qkv[r], window, fa[r], ga[r], beta[r],
                                               None if whole else (y[r], gate[r]))
            else:
                ys, S, window = self._prompt(S, qkv[r], window, a_p[r.start - d:r.stop - d], beta[r])
                gs = gate_p
                if not whole:
                    y[r] = ys
            if whole:
                y, gate = ys, gs
            seg.state.kda_state[self.layer], seg.state.kda_conv[self.layer] = S, window
        return y, gate

    def _step(self, S, x, window, fa, ga, beta, out=None):
        """Decode/verify rows: the low-rank second factors (a, gate_out), the short conv, q and k l2-normed (q
        scaled by K^-0.5), the decay of a and the delta rule as one op (each value-row block recomputes its head's
        a, conv and norms: cheap for a few rows) -> (y, gate_out, S', window'); out: (y, gate_out) views the op
        writes in place, or None."""
        return self.ops.kda_step(S, x, window, self.conv, fa, ga, self.f_b, self.g_b, self.a_log, self.dt_bias, beta,
                                 self.cfg.kda_gate_lower_bound, L2_EPS, self.dk ** -0.5, out=out)

    def _prompt(self, S, x, window, a, beta):
        """Prompt rows: the same steps as separate ops (each computed once per row), the same bits as _step."""
        ops, h, k = self.ops, self.heads, self.dk
        conv, window = ops.kda_conv(x, window, self.conv)
        q, kk, v = (conv[:, i * h * k:(i + 1) * h * k].reshape(-1, h, k) for i in range(3))
        decay = ops.kda_gate(a, self.a_log, self.dt_bias, self.cfg.kda_gate_lower_bound)  # [n, H, K] fp32
        y, S = ops.kda_recurrence(S, ops.l2norm(q, L2_EPS, k ** -0.5), ops.l2norm(kk, L2_EPS), v, decay, beta)
        return y, S, window
