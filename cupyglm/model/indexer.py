"""DSA indexer: per-token index keys and gates, pooled keys of complete pools, pool scores, the pick.

The indexer is replicated on every rank, so every rank picks the same tokens.
"""
from __future__ import annotations

import numpy as np

from cupyglm.config import ModelConfig
from cupyglm.model.batch import Segment, Weights

LN_EPS = 1e-6


class Indexer:
    def __init__(self, cfg: ModelConfig, w: Weights, ops):
        self.cfg, self.ops = cfg, ops
        self.wq_b = w("wq_b.weight")                              # [Hi * I, q_lora]
        self.wk = w("wk.weight")                                  # [I, D]
        self.k_norm_w, self.k_norm_b = w("k_norm.weight"), w("k_norm.bias")
        self.weights_proj = w("weights_proj.weight")              # [Hi, D]
        self.compress_gate = w("index_kpool_compress_gate")       # [I, D]
        self.ape = w("index_kpool_compress_ape")                  # [kpool, I]

    @property
    def key_norm(self):
        """The index keys' LayerNorm (weight [I] bf16, bias [I] bf16, eps): the layer norms x's wk projection
        [T, I] bf16 with it in the launch that writes its latent rows (ops.write_rows_rmsnorm_keys)."""
        return self.k_norm_w, self.k_norm_b, LN_EPS

    def queries(self, qib, hwr) -> "Queries":
        """The call's queries from qn's wq_b projection [T, Hi * I] bf16 and x's weights_proj projection [T, Hi]
        fp32."""
        c = self.cfg
        return Queries(qib.reshape(-1, c.index_n_heads, c.index_head_dim), hwr, np.float32(c.index_n_heads ** -0.5))

    def write_pools(self, kv, layer: int, seg: Segment, ik, ig) -> None:
        """Pool the segment's complete pools into the store; keep the incomplete pool's tail in state."""
        ops, kp = self.ops, self.cfg.index_kpool
        xp = ops.xp
        tail_ik, tail_ig = seg.state.index_tail.get(layer, (ik[:0], ig[:0]))
        first = seg.start - tail_ik.shape[0]                       # a multiple of kpool
        all_ik = xp.concatenate([tail_ik, ik[seg.rows]])
        all_ig = xp.concatenate([tail_ig, ig[seg.rows]])
        complete = all_ik.shape[0] // kp
        if complete:
            pk = ops.index_pool(all_ik[:complete * kp].reshape(complete, kp, -1),
                                all_ig[:complete * kp].reshape(complete, kp, -1), self.ape)
            pools = np.arange(first // kp, first // kp + complete)
            ops.write_rows(kv.pooled[layer], xp.asarray(kv.pool_rows(seg.state.pages, pools)), pk)
        seg.state.index_tail[layer] = (all_ik[complete * kp:].copy(), all_ig[complete * kp:].copy())

    def pick(self, kv, layer: int, seg: Segment, maps, qs: "Queries"):
        """Token lists (positions) for the segment's rows: [n, max_pick] int32, -1 padded, and counts. maps: the
        call's row maps (model/seg_device.CallMaps); qs: the call's queries."""
        ops, c = self.ops, self.cfg
        visible_last = (seg.start + seg.n) // c.index_kpool
        if visible_last > c.index_pools:
            pk = ops.read_rows(kv.pooled[layer], maps.pools_of(seg))          # [visible pools, I] bf16
            scores = ops.index_scores(qs.qi[seg.rows], qs.hw[seg.rows], pk)
        else:
            scores = maps.no_scores(seg, ops.xp)                           # every row is dense
        return ops.pick(scores, maps.positions_of(seg), c.index_pools, c.index_kpool, c.max_pick)


class Queries:
    """A call's indexer queries qi [T, Hi, I] bf16 and head weights hw [T, Hi] fp32 (the projection scaled by
    Hi^-0.5), scaled once, when a sparse segment first scores pools: dense rows never read them."""

    def __init__(self, qi, hwr, scale: np.float32):
        self.qi, self._hwr, self._scale, self._hw = qi, hwr, scale, None

    @property
    def hw(self):
        if self._hw is None:
            self._hw = self._hwr * self._scale
        return self._hw
