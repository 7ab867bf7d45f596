"""DSA indexer: per-token index keys and gates, pooled keys of complete pools, pool scores, the pick.

The indexer is replicated on every rank, so every rank picks the same tokens.
"""
from __future__ import annotations

import numpy as np

from cupyglm.config import ModelConfig
from cupyglm.model.batch import Weights

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

    def write_pools(self, kv, layer: int, ik, ig, maps) -> None:
        """Every segment's index tail in place (its slot in the store's tails, kv/index_tails.py: the caller made
        each state's pair its slot's views) and the pools its rows complete pooled into the store: one launch for
        the call. ik, ig: the call's [T, I] bf16; maps: the call's CallMaps (the segment table and the completed
        pools' rows)."""
        tails = kv.tails
        self.ops.index_tail_pool(tails.ik[layer], tails.ig[layer], ik, ig, self.ape, kv.pooled[layer], maps.tail_seg,
                                 maps.done_rows, items=maps.tail_items)

    def pick(self, kv, layer: int, maps, qib, hwr):
        """Token lists (positions) for the call's rows: [T, max_pick] int32, -1 padded, and counts [T] int32, in one
        scores launch and one pick launch. Every row is scored against its segment's pool table (maps.pool_table
        [S, Pw], row t's through maps.seg [T]); the pick decides per row, from its position, whether it is
        dense (its scores never read) or sparse. qib: qn's wq_b projection [T, Hi * I] bf16; hwr: x's weights_proj
        projection [T, Hi] fp32, scaled by Hi^-0.5 inside the scores launch. maps: the call's row maps
        (model/seg_device.CallMaps)."""
        ops, c = self.ops, self.cfg
        qi = qib.reshape(-1, c.index_n_heads, c.index_head_dim)                           # [T, Hi, I] bf16
        scores = ops.index_scores_rows(qi, hwr, np.float32(c.index_n_heads ** -0.5), kv.pooled[layer],
                                       maps.pool_table, maps.seg)                         # [T, Pw] fp32
        return ops.pick(scores, maps.positions, c.index_pools, c.index_kpool, c.max_pick)
