"""The numpy backend's KDA ops (short conv, gate, l2 norms, the delta rule, the decode step with its low-rank
second factors, the batched decode step on state slots, the gated output norm): part of NumpyOps, the reference
cuda_src/kda.cu and kda_step.cu are checked against."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16, exp_f32, f32, lane_sum, rsqrt_f32, seq_sum, sigmoid_f32


class KDAOps:
    def kda_conv(self, x: np.ndarray, window: np.ndarray, w: np.ndarray):
        """Depthwise causal conv over [saved rows; new rows], taps oldest first, fp32, then SiLU, bf16.

        x: [n, C] bf16, window: [taps - 1, C] bf16 (oldest first), w: [C, taps] bf16 -> (y [n, C] bf16,
        window' [taps - 1, C] bf16).
        """
        x, window, w = f32(x), f32(window), f32(w)
        taps = w.shape[1]
        full = np.concatenate([window, x], axis=0)                           # [taps - 1 + n, C]
        n = x.shape[0]
        acc = seq_sum([full[j:j + n] * w[:, j] for j in range(taps)])
        y = bf16(acc * sigmoid_f32(acc))
        return y, bf16(full[n:])

    def kda_gate(self, a: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray, lower: float) -> np.ndarray:
        """Per-channel decay g = exp(lower * sigmoid(exp(A_log) * (a + dt_bias))). a: [n, H, K] bf16,
        a_log: [H] bf16, dt_bias: [H, K] bf16 -> fp32."""
        a, a_log, dt_bias = f32(a), f32(a_log), f32(dt_bias)
        inner = exp_f32(a_log)[None, :, None] * (a + dt_bias)
        return exp_f32(np.float32(lower) * sigmoid_f32(inner)).astype(np.float32)

    def l2norm(self, x: np.ndarray, eps: float, scale: float | None = None) -> np.ndarray:
        """x / sqrt(sum(x^2) + eps) over the last axis: x bf16 -> fp32; then times scale (fp32) when given."""
        x = f32(x)
        y = (x * rsqrt_f32(lane_sum(x * x) + np.float32(eps))[..., None]).astype(np.float32)
        return y if scale is None else y * np.float32(scale)

    def kda_step(self, S: np.ndarray, x: np.ndarray, window: np.ndarray, w: np.ndarray, fa: np.ndarray,
                 ga: np.ndarray, f_b: np.ndarray, g_b: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray,
                 beta: np.ndarray, lower: float, eps: float, q_scale: float, out=None):
        """A segment's KDA step from its projections: a = gemm(fa, f_b, bf16) and gate = gemm(ga, g_b, bf16) (the
        low-rank second factors, viewed [n, H, K]), conv = kda_conv(x, window, w), q = l2norm(q, eps, q_scale),
        k = l2norm(k, eps), g = kda_gate(a), then kda_recurrence. x: [n, 3HK] bf16 (q, k, v heads), fa, ga: [n, r]
        bf16, f_b, g_b: [HK, r] bf16 -> (y [n, H, K] bf16, gate [n, H, K] bf16, S', window'); out: None, or
        (y, gate) views of the caller's rows [n, H, K] bf16, written and returned."""
        n, (h, k) = x.shape[0], dt_bias.shape
        a = self.gemm(fa, f_b, out="bf16").reshape(n, h, k)
        gate = self.gemm(ga, g_b, out="bf16").reshape(n, h, k)
        conv, window = self.kda_conv(x, window, w)
        q, kk, v = (conv[:, i * h * k:(i + 1) * h * k].reshape(n, h, k) for i in range(3))
        y, S = self.kda_recurrence(S, self.l2norm(q, eps, q_scale), self.l2norm(kk, eps), v,
                                   self.kda_gate(a, a_log, dt_bias, lower), beta)
        if out is not None:
            out[0][...], out[1][...] = y, gate
            y, gate = out
        return y, gate, S, window

    def kda_step_slots(self, S: np.ndarray, x: np.ndarray, window: np.ndarray, w: np.ndarray, fa: np.ndarray,
                       ga: np.ndarray, f_b: np.ndarray, g_b: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray,
                       beta: np.ndarray, seg: np.ndarray, done: np.ndarray, lower: float, eps: float,
                       q_scale: float):
        """kda_step per entry (row0, n, slot) of seg [E, 3] int32 on S[slot] [H, K, K] fp32 and window[slot]
        [taps - 1, 3HK] bf16, written back in place; n = 0: no rows; slot < 0: zero state and window, nothing
        written back. done [E, H] int32 stays zero (the kernel's counters). -> (y, gate) [R, H, K] bf16 (rows in
        no entry zero)."""
        r, (h, k) = x.shape[0], dt_bias.shape
        y = bf16(np.zeros((r, h, k), dtype=np.float32))
        gate = y.copy()
        for row0, n, slot in np.asarray(seg, dtype=np.int64).tolist():
            if n <= 0:
                continue
            rows = slice(row0, row0 + n)
            st = S[slot] if slot >= 0 else np.zeros(S.shape[1:], S.dtype)
            win = window[slot] if slot >= 0 else np.zeros(window.shape[1:], window.dtype)
            y[rows], gate[rows], st, win = self.kda_step(st, x[rows], win, w, fa[rows], ga[rows], f_b, g_b, a_log,
                                                         dt_bias, beta[rows], lower, eps, q_scale)
            if slot >= 0:
                S[slot], window[slot] = st, win
        return y, gate

    def kda_recurrence(self, S: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                       beta: np.ndarray):
        """The per-token delta rule, the same for prefill and decode.

        S: [H, V, K] fp32 (value rows x key columns); q, k, g: [n, H, K] fp32; v: [n, H, V] bf16;
        beta: [n, H] bf16.
        Per token: S *= g (along K); kv = S k; S += ((v - kv) * beta) outer k; y = S q.
        Returns (y [n, H, V] bf16, S').
        """
        S, v, beta = S.copy(), f32(v), f32(beta)
        n = q.shape[0]
        y = np.empty(v.shape, dtype=np.float32)
        for t in range(n):
            S *= g[t][:, None, :]
            kv = lane_sum(S * k[t][:, None, :])                              # [H, V]
            u = (v[t] - kv) * beta[t][:, None]
            S += u[:, :, None] * k[t][:, None, :]
            y[t] = lane_sum(S * q[t][:, None, :])
        return bf16(y), S

    def kda_out(self, y: np.ndarray, w: np.ndarray, gate: np.ndarray, eps: float) -> np.ndarray:
        """Per head: bf16(w * y * rsqrt(mean(y^2) + eps) * sigmoid(gate)). y, gate: [n, H, V] bf16, w: [V] bf16."""
        y, w, gate = f32(y), f32(w), f32(gate)
        r = rsqrt_f32(lane_sum(y * y) / np.float32(y.shape[-1]) + np.float32(eps))
        return bf16(w * (y * r[..., None]) * sigmoid_f32(gate))
