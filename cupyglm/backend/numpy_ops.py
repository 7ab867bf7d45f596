"""The `numpy` backend: every op of the model as vectorised NumPy, row-invariant. It is the reference
the CUDA kernels in cuda_src/ are checked against.

Storage: every value the model keeps in bf16 (weights, KV rows, pooled keys, the bf16 parts of the state,
activations between ops) is an ml_dtypes.bfloat16 array (`bf16_dtype`); every op computes in float32 from the
widened values and rounds its bf16 outputs once, where the kernel rounds (its epilogue). Every sum over a
model dimension is in lane-16 order (backend/lanes.py); short fixed sums (4 streams, 4 taps) run left to
right. Each output row is computed from that row's inputs alone.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import BF16, bf16, exp_f32, f32, gemm, lane_sum, out_kind, stored_weight
from cupyglm.backend.logits_ops import LogitsOps
from cupyglm.backend.numpy_gather import GatherOps
from cupyglm.backend.numpy_gemm import NumpyGemm, round_out as _round
from cupyglm.backend.roles import decode_rows

NEG_INF = np.float32(-np.inf)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (np.float32(1.0) / (np.float32(1.0) + exp_f32(-x))).astype(np.float32)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return (np.float32(1.0) / np.sqrt(x)).astype(np.float32)


def _seq_sum(parts) -> np.ndarray:
    """Left-to-right sum of a short list of arrays (streams, taps)."""
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return acc


def expand_pools(pools: np.ndarray, q: int, kpool: int) -> np.ndarray:
    """Ascending pools -> their tokens, then the tail tokens of the incomplete pool up to position q."""
    pools = np.asarray(pools, dtype=np.int32)
    toks = (pools[:, None] * kpool + np.arange(kpool, dtype=np.int32)).reshape(-1)
    tail = np.arange((q + 1) // kpool * kpool, q + 1, dtype=np.int32)
    return np.concatenate([toks, tail])


def paged_rows(tokens: np.ndarray, table: np.ndarray, page_tokens: int) -> np.ndarray:
    """Store rows of token lists [T, W] (positions, -1 padded) through each row's page table [T, width]:
    table[t, p // page_tokens] * page_tokens + p % page_tokens in int32 (kv/store.py's rows); -1 stays -1."""
    tokens, table = np.asarray(tokens, dtype=np.int32), np.asarray(table, dtype=np.int32)
    pt = np.int32(page_tokens)
    safe = np.maximum(tokens, np.int32(0))
    rows = np.take_along_axis(table, safe // pt, axis=1) * pt + safe % pt
    return np.where(tokens < 0, np.int32(-1), rows).astype(np.int32)


class NumpyOps(NumpyGemm, LogitsOps, GatherOps):
    """The ops interface (DESIGN §2). Backends subclass it and replace ops with kernels. The reference GEMMs live in
    cupyglm.backend.numpy_gemm, the ops on a step's fp32 logits rows (sample, logprobs, penalize, mask_tokens) in
    cupyglm.backend.logits_ops, the KV host-row gathers in cupyglm.backend.numpy_gather."""

    name = "numpy"
    xp = np
    bf16_dtype = BF16          # the storage dtype of a bf16 value on this backend

    # ---- storage ---------------------------------------------------------------------------------
    def weight(self, array: np.ndarray) -> np.ndarray:
        """A checkpoint tensor as the backend keeps it: in its stored dtype, bf16 or fp32. A C-contiguous array
        is returned as is (a shard stays a view over the memory-mapped file); other floats must hold bf16 values
        exactly (never rounded here: that would change the model)."""
        return np.ascontiguousarray(stored_weight(array))

    def bf16_full(self, shape, value: float) -> np.ndarray:
        """A new bf16 array filled with `value` (rounded to bf16): KV pools, zeroed state."""
        return np.full(shape, value, dtype=BF16)

    def asnumpy(self, x) -> np.ndarray:
        return np.asarray(x)

    def raise_device_errors(self) -> None:
        """Report the launchers' preconditions that failed on the device since the last call (the cuda
        backend's checks.cu flags, read once); host arrays are checked at the call, so nothing here."""

    def asnumpy_checked(self, x) -> np.ndarray:
        """x on the host after raise_device_errors: a step's one read-back (the cuda backend moves the
        checks' flags and x in a single device-to-host transfer)."""
        self.raise_device_errors()
        return self.asnumpy(x)

    def write_rows(self, store: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
        """store[rows[i]] = values[i]. store: [N, C] bf16, rows: [n] int32, values: [n, C] bf16."""
        store[rows] = values

    def write_rows_rmsnorm(self, store: np.ndarray, rows: np.ndarray, x: np.ndarray, w: np.ndarray,
                           eps: float, distinct_on_host: bool = False) -> None:
        """store[rows[i]] = rmsnorm(x[i], w, eps): a DSA layer's latent rows normed on their way into the store.
        x: [n, C] bf16, w: [C] bf16; distinct_on_host: the caller refused repeated ids on the host already."""
        self.write_rows(store, rows, self.rmsnorm(x, w, eps))

    def read_rows(self, store: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """store[rows] -> [n, C] bf16: KV rows through page tables, and the token embedding gather."""
        return store[rows]

    def sigmoid(self, x: np.ndarray, out: str = "f32") -> np.ndarray:
        """1 / (1 + exp(-x)) of fp32 x, elementwise; out="bf16" rounds it (beta = bf16(sigmoid(b)))."""
        return _round(_sigmoid(f32(x)), out_kind("sigmoid", out))

    def residual_add(self, x: np.ndarray, partial: np.ndarray) -> np.ndarray:
        """A plain residual (the MTP layer): bf16(x + bf16(partial)). x: [T, D] bf16, partial: [T, D] fp32
        (the sublayer's output summed across ranks) -> [T, D] bf16."""
        return bf16(f32(x) + f32(bf16(partial)))

    # ---- dense algebra: gemm, gemm_heads, gemm_grouped and the gate/up + SwiGLU forms (NumpyGemm) -------
    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        """Llama form per row: bf16(w * bf16(x * rsqrt(mean(x^2) + eps))). x: [..., D] bf16, w: [D] bf16."""
        x, w = f32(x), f32(w)
        ms = lane_sum(x * x) / np.float32(x.shape[-1])
        r = _rsqrt(ms + np.float32(eps))
        return bf16(w * f32(bf16(x * r[..., None])))

    def layernorm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
        """bf16(((x - mean) * rsqrt(var + eps)) * w + b), population variance, per row. x: [..., D] bf16."""
        x, w, b = f32(x), f32(w), f32(b)
        n = np.float32(x.shape[-1])
        mean = lane_sum(x) / n
        d = x - mean[..., None]
        var = lane_sum(d * d) / n
        return bf16(d * _rsqrt(var + np.float32(eps))[..., None] * w + b)

    # ---- hyper-connections -----------------------------------------------------------------------
    def hc_pre(self, X: np.ndarray, fn: np.ndarray, base: np.ndarray, scale: np.ndarray,
               norm_eps: float, hc_eps: float, iters: int):
        """X: [T, 4, D] bf16 streams -> (x [T, D] bf16 sublayer input, post [T, 4], comb [T, 4, 4]) fp32."""
        X, fn, base, scale = f32(X), f32(fn), f32(base), f32(scale)
        t, s, d = X.shape
        flat = X.reshape(t, s * d)
        r = _rsqrt(lane_sum(flat * flat) / np.float32(s * d) + np.float32(norm_eps))
        mix = gemm(flat, fn) * r[:, None]                                   # [T, 24]
        pre = _sigmoid(mix[:, 0:s] * scale[0] + base[0:s]) + np.float32(hc_eps)
        post = np.float32(2.0) * _sigmoid(mix[:, s:2 * s] * scale[1] + base[s:2 * s])
        logit = (mix[:, 2 * s:] * scale[2] + base[2 * s:]).reshape(t, s, s)
        comb = self._sinkhorn(logit, hc_eps, iters)
        x = bf16(_seq_sum([pre[:, i:i + 1] * X[:, i, :] for i in range(s)]))
        return x, post, comb

    def hc_pre_norm(self, X: np.ndarray, fn: np.ndarray, base: np.ndarray, scale: np.ndarray, norm_w: np.ndarray,
                    norm_eps: float, hc_eps: float, iters: int):
        """hc_pre, then the sublayer's rmsnorm(x, norm_w, norm_eps): (h [T, D] bf16, post, comb)."""
        x, post, comb = self.hc_pre(X, fn, base, scale, norm_eps, hc_eps, iters)
        return self.rmsnorm(x, norm_w, norm_eps), post, comb

    def hc_post_pre_norm(self, X: np.ndarray, branch: np.ndarray, post: np.ndarray, comb: np.ndarray,
                         fn: np.ndarray, base: np.ndarray, scale: np.ndarray, norm_w: np.ndarray, norm_eps: float,
                         hc_eps: float, iters: int):
        """hc_post of one sublayer, then hc_pre_norm of the next: (X', h, post', comb')."""
        X = self.hc_post(X, branch, post, comb)
        return (X, *self.hc_pre_norm(X, fn, base, scale, norm_w, norm_eps, hc_eps, iters))

    @staticmethod
    def _sinkhorn(logit: np.ndarray, eps: float, iters: int) -> np.ndarray:
        """Row softmax + eps, normalise columns once, then (rows, columns) iters - 1 times. [T, 4, 4]."""
        eps = np.float32(eps)
        n = logit.shape[-1]
        m = np.max(logit, axis=-1, keepdims=True)
        e = exp_f32(logit - m).astype(np.float32)
        rows = _seq_sum([e[..., j:j + 1] for j in range(n)])
        c = e / rows + eps

        def norm_cols(c):
            return c / (_seq_sum([c[..., i:i + 1, :] for i in range(n)]) + eps)

        def norm_rows(c):
            return c / (_seq_sum([c[..., j:j + 1] for j in range(n)]) + eps)

        c = norm_cols(c)
        for _ in range(iters - 1):
            c = norm_cols(norm_rows(c))
        return c.astype(np.float32)

    def hc_post(self, X: np.ndarray, branch: np.ndarray, post: np.ndarray, comb: np.ndarray) -> np.ndarray:
        """X'[s] = bf16(post_s * b + sum_j comb[j, s] * X[j]), j left to right, b = bf16(branch): X [T, 4, D]
        bf16, branch [T, D] fp32 (the sublayer's output summed across ranks, rounded to bf16 as it is read),
        post [T, 4], comb [T, 4, 4] fp32 -> [T, 4, D] bf16."""
        X, branch = f32(X), f32(bf16(branch))
        s = X.shape[1]
        out = np.empty(X.shape, dtype=BF16)
        for i in range(s):
            acc = post[:, i:i + 1] * branch
            for j in range(s):
                acc = acc + comb[:, j, i:i + 1] * X[:, j, :]
            out[:, i, :] = bf16(acc)
        return out

    def stream_mean(self, X: np.ndarray) -> np.ndarray:
        """[T, 4, D] bf16 -> [T, D] bf16(((X0 + X1) + X2) + X3) * 0.25)."""
        X = f32(X)
        return bf16(_seq_sum([X[:, i, :] for i in range(X.shape[1])]) * np.float32(1.0 / X.shape[1]))

    # ---- KDA -------------------------------------------------------------------------------------
    def kda_conv(self, x: np.ndarray, window: np.ndarray, w: np.ndarray):
        """Depthwise causal conv over [saved rows; new rows], taps oldest first, fp32, then SiLU, bf16.

        x: [n, C] bf16, window: [taps - 1, C] bf16 (oldest first), w: [C, taps] bf16 -> (y [n, C] bf16,
        window' [taps - 1, C] bf16).
        """
        x, window, w = f32(x), f32(window), f32(w)
        taps = w.shape[1]
        full = np.concatenate([window, x], axis=0)                           # [taps - 1 + n, C]
        n = x.shape[0]
        acc = _seq_sum([full[j:j + n] * w[:, j] for j in range(taps)])
        y = bf16(acc * _sigmoid(acc))
        return y, bf16(full[n:])

    def kda_gate(self, a: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray, lower: float) -> np.ndarray:
        """Per-channel decay g = exp(lower * sigmoid(exp(A_log) * (a + dt_bias))). a: [n, H, K] bf16,
        a_log: [H] bf16, dt_bias: [H, K] bf16 -> fp32."""
        a, a_log, dt_bias = f32(a), f32(a_log), f32(dt_bias)
        inner = exp_f32(a_log)[None, :, None] * (a + dt_bias)
        return exp_f32(np.float32(lower) * _sigmoid(inner)).astype(np.float32)

    def l2norm(self, x: np.ndarray, eps: float, scale: float | None = None) -> np.ndarray:
        """x / sqrt(sum(x^2) + eps) over the last axis: x bf16 -> fp32; then times scale (fp32) when given."""
        x = f32(x)
        y = (x * _rsqrt(lane_sum(x * x) + np.float32(eps))[..., None]).astype(np.float32)
        return y if scale is None else y * np.float32(scale)

    def kda_step(self, S: np.ndarray, x: np.ndarray, window: np.ndarray, w: np.ndarray, a: np.ndarray,
                 a_log: np.ndarray, dt_bias: np.ndarray, beta: np.ndarray, lower: float, eps: float, q_scale: float):
        """A segment's KDA step from its projections: conv = kda_conv(x, window, w), q = l2norm(q, eps, q_scale),
        k = l2norm(k, eps), g = kda_gate(a), then kda_recurrence. x: [n, 3HK] bf16 (q, k, v heads), a: [n, H, K]
        bf16 -> (y, S', window')."""
        n, h, k = a.shape
        conv, window = self.kda_conv(x, window, w)
        q, kk, v = (conv[:, i * h * k:(i + 1) * h * k].reshape(n, h, k) for i in range(3))
        y, S = self.kda_recurrence(S, self.l2norm(q, eps, q_scale), self.l2norm(kk, eps), v,
                                   self.kda_gate(a, a_log, dt_bias, lower), beta)
        return y, S, window

    def kda_step_slots(self, S: np.ndarray, x: np.ndarray, window: np.ndarray, w: np.ndarray, a: np.ndarray,
                       a_log: np.ndarray, dt_bias: np.ndarray, beta: np.ndarray, seg: np.ndarray, done: np.ndarray,
                       lower: float, eps: float, q_scale: float) -> np.ndarray:
        """kda_step per entry (row0, n, slot) of seg [E, 3] int32 on S[slot] [H, K, K] fp32 and window[slot]
        [taps - 1, 3HK] bf16, written back in place; n = 0: no rows; slot < 0: zero state and window, nothing
        written back. done [E, H] int32 stays zero (the kernel's counters). -> y [R, H, K] bf16 (rows in no entry
        zero)."""
        r, h, k = a.shape
        y = bf16(np.zeros((r, h, k), dtype=np.float32))
        for row0, n, slot in np.asarray(seg, dtype=np.int64).tolist():
            if n <= 0:
                continue
            rows = slice(row0, row0 + n)
            st = S[slot] if slot >= 0 else np.zeros(S.shape[1:], S.dtype)
            win = window[slot] if slot >= 0 else np.zeros(window.shape[1:], window.dtype)
            y[rows], st, win = self.kda_step(st, x[rows], win, w, a[rows], a_log, dt_bias, beta[rows], lower, eps,
                                             q_scale)
            if slot >= 0:
                S[slot], window[slot] = st, win
        return y

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
        r = _rsqrt(lane_sum(y * y) / np.float32(y.shape[-1]) + np.float32(eps))
        return bf16(w * (y * r[..., None]) * _sigmoid(gate))

    # ---- DSA indexer -----------------------------------------------------------------------------
    def index_pool(self, ik: np.ndarray, ig: np.ndarray, ape: np.ndarray) -> np.ndarray:
        """Pooled keys of complete pools. ik, ig: [P, 4, I] bf16, ape: [4, I] -> [P, I] bf16.

        l_j = ig_j + ape_j; e_j = exp(l_j - max l); s = ((e0 + e1) + e2) + e3;
        pk = bf16(sum_j bf16(bf16(e_j / s) * ik_j)), j left to right.
        """
        ik, ig, ape = f32(ik), f32(ig), f32(ape)
        l = ig + ape[None]
        e = exp_f32(l - np.max(l, axis=1, keepdims=True)).astype(np.float32)
        s = _seq_sum([e[:, j] for j in range(e.shape[1])])
        t = f32(bf16(f32(bf16(e / s[:, None])) * ik))
        return bf16(_seq_sum([t[:, j] for j in range(t.shape[1])]))

    def index_scores(self, qi: np.ndarray, hw: np.ndarray, pk: np.ndarray) -> np.ndarray:
        """Score of every pool for every row: s = sum_h hw_h * relu(I^-0.5 * qi_h . pk).

        qi: [T, Hi, I] bf16, hw: [T, Hi] fp32 (already scaled), pk: [P, I] bf16 -> [T, P] fp32.
        The caller masks pools a row cannot see.
        """
        hw = f32(hw)
        t, h, i = qi.shape
        dots = gemm(qi.reshape(t * h, i), pk).reshape(t, h, -1)             # [T, Hi, P]
        r = np.maximum(dots * np.float32(i ** -0.5), np.float32(0.0)) * hw[:, :, None]
        return lane_sum(np.moveaxis(r, 1, 2))                                # sum over heads

    def pick(self, scores: np.ndarray, positions: np.ndarray, npools: int, kpool: int, width: int):
        """Token lists for attention. scores: [T, P] fp32 (P >= visible pools), positions: [T] int.

        Visible pools v = (q + 1) // kpool. v <= npools: dense, tokens 0..q. Else the top npools pools by
        score (exact; ties to the lower pool), ascending, expanded to their tokens, then the tail tokens
        v*kpool..q. Returns (tokens [T, width] int32 padded with -1, counts [T] int32).
        """
        t = positions.shape[0]
        out = np.full((t, width), -1, dtype=np.int32)
        counts = np.zeros(t, dtype=np.int32)
        for r, q in enumerate(positions.tolist()):
            visible = (q + 1) // kpool
            if visible <= npools:
                toks = np.arange(q + 1, dtype=np.int32)
            else:
                top = np.argsort(-scores[r, :visible], kind="stable")[:npools]
                toks = expand_pools(np.sort(top), q, kpool)
            out[r, :toks.size] = toks
            counts[r] = toks.size
        return out, counts

    # ---- DSA attention ---------------------------------------------------------------------------
    def attention(self, qa: np.ndarray, store: np.ndarray, rows: np.ndarray, counts: np.ndarray,
                  scale: float, chunk: int, decode: int = 0) -> np.ndarray:
        """Absorbed MLA over latent rows read through row ids.

        qa: [T, H, R] bf16 (queries absorbed into latent space), store: [rows_total, R] bf16 (latent rows;
        keys equal values), rows: [T, W] int32 physical row ids (-1 padded), counts: [T] int32.
        Online softmax over `chunk`-key chunks of the row's list, merged in list order; fp32 m, l, o;
        P rounded to bf16 before P.V and the sum l. Returns [T, H, R] bf16 (o / l). Rows [0, decode) are
        decode/verify rows (backend/roles.py: the kernels split them by chunk; the same bits).
        """
        decode_rows("attention", decode, qa.shape[0])
        qa = f32(qa)
        t, h, r = qa.shape
        out = np.empty((t, h, r), dtype=np.float32)
        sc = np.float32(scale)
        for i in range(t):
            m = np.full(h, NEG_INF, dtype=np.float32)
            l = np.zeros(h, dtype=np.float32)
            o = np.zeros((h, r), dtype=np.float32)
            for c0 in range(0, int(counts[i]), chunk):
                ids = rows[i, c0:min(c0 + chunk, int(counts[i]))]
                kv = f32(store[ids])                                         # [n, R]
                s = gemm(qa[i], kv) * sc                                     # [H, n]
                m_new = np.maximum(m, np.max(s, axis=1))
                p = f32(bf16(exp_f32(s - m_new[:, None])))
                alpha = exp_f32(m - m_new).astype(np.float32)
                l = l * alpha + lane_sum(p)
                o = o * alpha[:, None] + gemm(p, np.ascontiguousarray(kv.T))  # [H, R]
                m = m_new
            out[i] = o / l[:, None]
        return bf16(out)

    def attention_paged(self, qa: np.ndarray, store: np.ndarray, tokens: np.ndarray, table: np.ndarray,
                        page_tokens: int, counts: np.ndarray, scale: float, chunk: int, decode: int = 0) -> np.ndarray:
        """attention over token lists tokens [T, W] int32 (positions, -1 padded) mapped through each row's page
        table table [T, width] int32 (paged_rows): the forward call's one row map serves every DSA layer."""
        return self.attention(qa, store, paged_rows(tokens, table, page_tokens), counts, scale, chunk, decode)

    # ---- MoE -------------------------------------------------------------------------------------
    def moe_route(self, logits: np.ndarray, bias: np.ndarray, k: int, scale: float):
        """Sigmoid scores; top k of (score + bias), ties to the lower id; weights renormalised in pick
        order and scaled. logits: [T, E] fp32, bias: [E] bf16 -> (ids [T, k] int32, weights [T, k] fp32)."""
        bias = f32(bias)
        score = _sigmoid(logits)
        order = np.argsort(-(score + bias), axis=1, kind="stable")[:, :k].astype(np.int32)
        chosen = np.take_along_axis(score, order, axis=1)
        total = _seq_sum([chosen[:, j] for j in range(k)]) + np.float32(1e-20)
        return order, (chosen / total[:, None] * np.float32(scale)).astype(np.float32)

    def swiglu(self, gate: np.ndarray, up: np.ndarray, limit: float | None) -> np.ndarray:
        """bf16(bf16(silu(min(gate, L))) * clip(up, -L, L)); no clamp when limit is None. gate, up bf16 -> bf16."""
        gate, up = f32(gate), f32(up)
        if limit is not None:
            gate = np.minimum(gate, np.float32(limit))
            up = np.clip(up, np.float32(-limit), np.float32(limit))
        return bf16(f32(bf16(gate * _sigmoid(gate))) * up)

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
