"""The `numpy` backend: every op of the model as vectorised NumPy, row-invariant. It is the reference
the CUDA kernels in cuda_src/ are checked against.

Storage: every value the model keeps in bf16 (weights, KV rows, pooled keys, the bf16 parts of the state,
activations between ops) is an ml_dtypes.bfloat16 array (`bf16_dtype`); every op computes in float32 from the
widened values and rounds its bf16 outputs once, where the kernel rounds (its epilogue). Every sum over a
model dimension is in lane-16 order (backend/lanes.py) but the weight GEMMs' (backend/tc_order.py, tc_quant.py)
and the indexer's dots (backend/tc_index.py): the tensor core's chains, every row alike. Short fixed sums (4
streams, 4 taps) run left to right. Each output row is computed from that row's inputs alone.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import (BF16, bf16, exp_f32, f32, gemm, lane_sum, out_kind, rank_sum, rsqrt_f32, seq_sum,
                                   sigmoid_f32, stored_weight)
from cupyglm.backend import tc_attention
from cupyglm.backend.logits_ops import LogitsOps
from cupyglm.backend.numpy_gather import GatherOps
from cupyglm.backend.numpy_gemm import NumpyGemm, round_out as _round
from cupyglm.backend.numpy_kda import KDAOps
from cupyglm.backend.numpy_moe import MoEOps
from cupyglm.backend.numpy_vision import VisionOps
from cupyglm.backend.roles import decode_rows
from cupyglm.backend.tc_index import index_dots

NEG_INF = np.float32(-np.inf)


def expand_pools(pools: np.ndarray, q: int, kpool: int) -> np.ndarray:
    """Ascending pools -> their tokens, then the tail tokens of the incomplete pool up to position q."""
    pools = np.asarray(pools, dtype=np.int32)
    toks = (pools[:, None] * kpool + np.arange(kpool, dtype=np.int32)).reshape(-1)
    tail = np.arange((q + 1) // kpool * kpool, q + 1, dtype=np.int32)
    return np.concatenate([toks, tail])


def paged_rows(tokens: np.ndarray, table: np.ndarray, seg: np.ndarray, page_tokens: int) -> np.ndarray:
    """Store rows of token lists [T, W] (positions, -1 padded) through each row's segment's page table (table
    [S, width] int32 one row per segment, seg [T] int32 row t's): table[seg[t], p // page_tokens] * page_tokens +
    p % page_tokens in int32 (kv/store.py's rows); -1 stays -1."""
    tokens, table = np.asarray(tokens, dtype=np.int32), np.asarray(table, dtype=np.int32)
    seg = np.asarray(seg, dtype=np.int32)
    if table.ndim != 2 or seg.shape != tokens.shape[:1]:
        raise ValueError(f"paged_rows: table [S, width] and seg [T] for tokens {tokens.shape}, got table "
                         f"{table.shape} and seg {seg.shape}")
    pt = np.int32(page_tokens)
    safe = np.maximum(tokens, np.int32(0))
    rows = table[seg[:, None], safe // pt] * pt + safe % pt
    return np.where(tokens < 0, np.int32(-1), rows).astype(np.int32)


class NumpyOps(NumpyGemm, KDAOps, MoEOps, LogitsOps, GatherOps, VisionOps):
    """The ops interface (DESIGN §2). Backends subclass it and replace ops with kernels. The reference GEMMs live in
    cupyglm.backend.numpy_gemm, the ops on a step's fp32 logits rows (sample, logprobs, penalize, mask_tokens) in
    cupyglm.backend.logits_ops, the KV host-row gathers in cupyglm.backend.numpy_gather, the KDA recurrence's ops in
    cupyglm.backend.numpy_kda, the MoE routing and combine in cupyglm.backend.numpy_moe, the vision tower's own ops
    (bias_add, gelu, vision_attention) in cupyglm.backend.numpy_vision."""

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

    def write_rows_rmsnorm_keys(self, store: np.ndarray, rows: np.ndarray, x: np.ndarray, w: np.ndarray,
                                eps: float, keys: np.ndarray, kw: np.ndarray, kb: np.ndarray, keps: float,
                                distinct_on_host: bool = False) -> np.ndarray:
        """store[rows[i]] = rmsnorm(x[i], w, eps): a DSA layer's latent rows normed on their way into the store
        (x: [n, C] bf16, w: [C] bf16); returns the same rows' index keys layernorm(keys, kw, kb, keps) [n, I] bf16
        (keys: [n, I] bf16). distinct_on_host: the caller refused repeated ids on the host already."""
        self.write_rows(store, rows, self.rmsnorm(x, w, eps))
        return self.layernorm(keys, kw, kb, keps)

    def read_rows(self, store: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """store[rows] -> [n, C] bf16: KV rows through page tables, and the token embedding gather."""
        return store[rows]

    def sigmoid(self, x: np.ndarray, out: str = "f32") -> np.ndarray:
        """1 / (1 + exp(-x)) of fp32 x, elementwise; out="bf16" rounds it (beta = bf16(sigmoid(b)))."""
        return _round(sigmoid_f32(f32(x)), out_kind("sigmoid", out))

    def residual_add(self, x: np.ndarray, partial: np.ndarray) -> np.ndarray:
        """A plain residual (the MTP layer): bf16(x + bf16(partial)). x: [T, D] bf16, partial: [T, D] fp32
        (the sublayer's output summed across ranks) -> [T, D] bf16."""
        return bf16(f32(x) + f32(bf16(partial)))

    def rank_sum(self, parts: np.ndarray) -> np.ndarray:
        """A collective's gathered partials [R, ...] fp32 or bf16 -> their sum [...] added in rank order, in
        parts' dtype (bf16 rounds after every add): the all-reduce's one order (NcclComm runs the kernel)."""
        return rank_sum(parts)

    # ---- dense algebra: gemm, gemm_heads, gemm_grouped and the gate/up + SwiGLU forms (NumpyGemm) -------
    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        """Llama form per row: bf16(w * bf16(x * rsqrt(mean(x^2) + eps))). x: [..., D] bf16, w: [D] bf16."""
        x, w = f32(x), f32(w)
        ms = lane_sum(x * x) / np.float32(x.shape[-1])
        r = rsqrt_f32(ms + np.float32(eps))
        return bf16(w * f32(bf16(x * r[..., None])))

    def layernorm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
        """bf16(((x - mean) * rsqrt(var + eps)) * w + b), population variance, per row. x: [..., D] bf16."""
        x, w, b = f32(x), f32(w), f32(b)
        n = np.float32(x.shape[-1])
        mean = lane_sum(x) / n
        d = x - mean[..., None]
        var = lane_sum(d * d) / n
        return bf16(d * rsqrt_f32(var + np.float32(eps))[..., None] * w + b)

    # ---- hyper-connections -----------------------------------------------------------------------
    def hc_pre(self, X: np.ndarray, fn: np.ndarray, base: np.ndarray, scale: np.ndarray,
               norm_eps: float, hc_eps: float, iters: int):
        """X: [T, 4, D] bf16 streams -> (x [T, D] bf16 sublayer input, post [T, 4], comb [T, 4, 4]) fp32."""
        X, fn, base, scale = f32(X), f32(fn), f32(base), f32(scale)
        t, s, d = X.shape
        flat = X.reshape(t, s * d)
        r = rsqrt_f32(lane_sum(flat * flat) / np.float32(s * d) + np.float32(norm_eps))
        mix = gemm(flat, fn) * r[:, None]                                   # [T, 24]
        pre = sigmoid_f32(mix[:, 0:s] * scale[0] + base[0:s]) + np.float32(hc_eps)
        post = np.float32(2.0) * sigmoid_f32(mix[:, s:2 * s] * scale[1] + base[s:2 * s])
        logit = (mix[:, 2 * s:] * scale[2] + base[2 * s:]).reshape(t, s, s)
        comb = self._sinkhorn(logit, hc_eps, iters)
        x = bf16(seq_sum([pre[:, i:i + 1] * X[:, i, :] for i in range(s)]))
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
        rows = seq_sum([e[..., j:j + 1] for j in range(n)])
        c = e / rows + eps

        def norm_cols(c):
            return c / (seq_sum([c[..., i:i + 1, :] for i in range(n)]) + eps)

        def norm_rows(c):
            return c / (seq_sum([c[..., j:j + 1] for j in range(n)]) + eps)

        c = norm_cols(c)
        for _ in range(iters - 1):
            c = norm_cols(norm_rows(c))
        return c.astype(np.float32)

    def hc_post(self, X: np.ndarray, branch: np.ndarray, post: np.ndarray, comb: np.ndarray) -> np.ndarray:
        """X'[s] = bf16(post_s * b + sum_j comb[j, s] * X[j]), j left to right, b = bf16(branch): X [T, 4, D]
        bf16, branch [T, D] fp32 (the sublayer's output summed across ranks, rounded to bf16 as it is read),
        post [T, 4], comb [T, 4, 4] fp32 -> [T, 4, D] bf16. A branch [R, T, D] is the ranks' partials as gathered,
        added in rank order first (rank_sum)."""
        if branch.ndim == 3:
            branch = rank_sum(branch)
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
        return bf16(seq_sum([X[:, i, :] for i in range(X.shape[1])]) * np.float32(1.0 / X.shape[1]))

    # ---- DSA indexer -----------------------------------------------------------------------------
    def index_pool(self, ik: np.ndarray, ig: np.ndarray, ape: np.ndarray) -> np.ndarray:
        """Pooled keys of complete pools. ik, ig: [P, 4, I] bf16, ape: [4, I] -> [P, I] bf16.

        l_j = ig_j + ape_j; e_j = exp(l_j - max l); s = ((e0 + e1) + e2) + e3;
        pk = bf16(sum_j bf16(bf16(e_j / s) * ik_j)), j left to right.
        """
        ik, ig, ape = f32(ik), f32(ig), f32(ape)
        l = ig + ape[None]
        e = exp_f32(l - np.max(l, axis=1, keepdims=True)).astype(np.float32)
        s = seq_sum([e[:, j] for j in range(e.shape[1])])
        t = f32(bf16(f32(bf16(e / s[:, None])) * ik))
        return bf16(seq_sum([t[:, j] for j in range(t.shape[1])]))

    def index_tail_pool(self, tails_ik: np.ndarray, tails_ig: np.ndarray, ik: np.ndarray, ig: np.ndarray,
                        ape: np.ndarray, pooled: np.ndarray, seg: np.ndarray, done: np.ndarray,
                        items: int = 0) -> None:
        """A forward call's index tails in place and the pools its segments' rows complete: _index_tail_segment of
        each segment in order. tails_ik, tails_ig: [NS, KP, I] bf16, a slot per sequence; seg: [S, 5] int32
        (row0, n, start, slot, done0), distinct slots; done: [D] int32, segment s's completed pools' rows at
        done0.. (-1: none); items: the kernel's grid (no effect on the bits)."""
        kp = tails_ik.shape[1]
        for r0, n, start, slot, done0 in np.asarray(seg, dtype=np.int64).reshape(-1, 5):
            if n <= 0:
                continue
            complete = (start + n) // kp - start // kp
            self._index_tail_segment(tails_ik[slot], tails_ig[slot], ik, ig, ape, pooled,
                                     done[done0:done0 + complete], int(r0), int(n), int(start))

    def _index_tail_segment(self, tail_ik: np.ndarray, tail_ig: np.ndarray, ik: np.ndarray, ig: np.ndarray,
                            ape: np.ndarray, pooled: np.ndarray, pool_rows: np.ndarray, r0: int, n: int,
                            start: int) -> None:
        """A segment's index tail in place and the pools its rows complete. tail_ik, tail_ig: [KP, I] bf16 (slot s
        holds the latest written position = s mod KP); ik, ig: [T, I] bf16, rows r0..r0+n-1 at positions
        start..start+n-1; pooled: [R, I] bf16; pool_rows: [C] int32 rows of the C completed pools (-1: none).
        Each completed pool is index_pool of its members (the tail's before start, the rows' after)."""
        kp = tail_ik.shape[0]
        first, complete = start // kp, (start + n) // kp - start // kp
        if complete:
            pos = np.arange(first * kp, (first + complete) * kp)
            old = (pos < start)[:, None]
            row = np.clip(r0 + pos - start, 0, None)
            mk = np.where(old, tail_ik[pos % kp], ik[row]).reshape(complete, kp, -1)
            mg = np.where(old, tail_ig[pos % kp], ig[row]).reshape(complete, kp, -1)
            pk = self.index_pool(mk, mg, ape)
            keep = (pool_rows >= 0) & (pool_rows < pooled.shape[0])
            pooled[pool_rows[keep]] = pk[keep]
        for j in range(max(0, n - kp), n):                                  # each slot's latest position
            tail_ik[(start + j) % kp], tail_ig[(start + j) % kp] = ik[r0 + j], ig[r0 + j]

    def index_scores(self, qi: np.ndarray, hw: np.ndarray, pk: np.ndarray) -> np.ndarray:
        """Score of every pool for every row: s = sum_h hw_h * relu(I^-0.5 * qi_h . pk).

        qi: [T, Hi, I] bf16, hw: [T, Hi] fp32 (already scaled), pk: [P, I] bf16 -> [T, P] fp32.
        The dots are the tensor core's chains (backend/tc_index.py), the same for every row whatever its role.
        The caller masks pools a row cannot see.
        """
        hw = f32(hw)
        i = qi.shape[2]
        dots = index_dots(qi, pk)                                            # [T, Hi, P] the tensor core's chain
        r = np.maximum(dots * np.float32(i ** -0.5), np.float32(0.0)) * hw[:, :, None]
        return lane_sum(np.moveaxis(r, 1, 2))                                # sum over heads

    def index_scores_rows(self, qi: np.ndarray, hw: np.ndarray, hscale: float, pooled: np.ndarray,
                          tables: np.ndarray, seg: np.ndarray) -> np.ndarray:
        """Each row against its segment's pools: scores[t] = index_scores(qi[t], hw[t] * hscale,
        pooled[tables[seg[t]]]). tables: [S, Pw] int32 each segment's pooled-key rows (one outside [0, R) reads a
        zero key), seg: [T] int32 row t's segment (outside [0, S): every key zero), pooled: [R, I] bf16, hw: [T, Hi]
        fp32 before hscale -> [T, Pw] fp32. The rows of one segment score in one index_scores."""
        tables, seg = np.asarray(tables, dtype=np.int64), np.asarray(seg, dtype=np.int64).reshape(-1)
        hw = f32(hw) * np.float32(hscale)
        out = np.zeros((seg.shape[0], tables.shape[1]), dtype=np.float32)
        if not out.size:
            return out
        tables = np.where((tables >= 0) & (tables < pooled.shape[0]), tables, -1)
        seg = np.where((seg >= 0) & (seg < tables.shape[0]), seg, -1)
        for j in np.unique(seg).tolist():
            table = tables[j] if j >= 0 else np.full(tables.shape[1], -1, np.int64)
            keys = np.where((table >= 0)[:, None], f32(pooled[np.maximum(table, 0)]), np.float32(0.0))
            sel = seg == j
            out[sel] = self.index_scores(qi[sel], hw[sel], keys)
        return out

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
        decode/verify rows (backend/roles.py: the kernels split them by chunk; the same bits). Lists of store rows
        carry no positions, so every row here takes this order; the model's prompt rows go through
        attention_paged (the tensor core on the position grid).
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
                        seg: np.ndarray, page_tokens: int, counts: np.ndarray, scale: float, chunk: int,
                        decode: int = 0) -> np.ndarray:
        """attention over token lists tokens [T, W] int32 (positions, strictly ascending, -1 padded) mapped through
        each row's segment's page table (table [S, width] int32, seg [T] int32: paged_rows): the forward call's one
        row map serves every DSA layer. Rows [0, decode) (decode/verify rows) as `attention`; the prompt rows on the
        tensor core in key blocks on the absolute position grid (backend/tc_attention.py), so a prompt row's bits
        do not depend on where its chunk began."""
        d = decode_rows("attention_paged", decode, qa.shape[0])
        rows = paged_rows(tokens, table, seg, page_tokens)
        out = np.empty(qa.shape, dtype=BF16)
        out[:d] = self.attention(qa[:d], store, rows[:d], counts[:d], scale, chunk, d)
        if d < qa.shape[0]:
            out[d:] = tc_attention.attention_tc(qa[d:], store, tokens[d:], rows[d:], counts[d:], scale)
        return out
