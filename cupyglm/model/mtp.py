"""The MTP head: one DSA + MoE layer with plain residuals that predicts the token after next.

MTP row i pairs the final-normed main row h_i with the embedding of token i + 1 (zeroed at position 0)
and runs at MTP position i over the MTP layer's own KV. The last main row of a call waits in the state
(mtp_pending) until its next token is known.
"""
from __future__ import annotations

import numpy as np

from cupyglm.config import ModelConfig
from cupyglm.distributed.comm import summed
from cupyglm.model.batch import Segment, Weights, decode_rows
from cupyglm.model.dsa import DSALayer
from cupyglm.model.moe import MoE


class MTPLayer:
    def __init__(self, cfg: ModelConfig, w: Weights, ops, layer: int, tp: int):
        self.cfg, self.ops = cfg, ops
        self.enorm, self.hnorm = w("enorm.weight"), w("hnorm.weight")
        self.eh_proj = w("eh_proj.weight")                        # [D, 2D]
        self.in_norm = w("input_layernorm.weight")
        self.post_norm = w("post_attention_layernorm.weight")
        self.head_norm = w("shared_head.norm.weight")
        self.attn = DSALayer(cfg, w.sub("self_attn"), ops, layer, tp)
        self.mlp = MoE(cfg, w.sub("mlp"), ops)

    def rows(self, segs: list[Segment], tokens: np.ndarray, h):
        """MTP inputs of this call: per segment the rows whose next token is known.

        Returns (mtp segments, h rows [T', D], next-token ids [T'], MTP positions [T']).
        """
        xp = self.ops.xp
        new_segs, hs, ids, pos, off = [], [], [], [], 0
        for seg in segs:
            st = seg.state
            hrows = h[seg.rows]
            start = seg.start
            if st.mtp_pending is not None:
                hrows = xp.concatenate([st.mtp_pending[None], hrows])
                start -= 1
            n = hrows.shape[0] - 1                                 # the last row waits
            st.mtp_pending = hrows[-1].copy()
            if n <= 0:
                continue
            hs.append(hrows[:n])
            ids.append(tokens[seg.off + seg.n - n:seg.off + seg.n])      # tokens at positions start+1..
            pos.append(np.arange(start, start + n, dtype=np.int32))
            new_segs.append(Segment(st, start, n, off, seg.decode))
            off += n
        if not new_segs:
            return [], None, None, None
        return new_segs, xp.concatenate(hs), np.concatenate(ids), np.concatenate(pos)

    def __call__(self, embed, h, ids, positions, segs, kv, comm):
        """h: [T', D] final-normed main rows; ids: [T'] next tokens -> the MTP row before its head [T', D]."""
        ops, c = self.ops, self.cfg
        e = ops.read_rows(embed, ids)                                   # [T', D] bf16
        first = np.flatnonzero(positions == 0)
        if first.size:                                                  # position 0 has no previous token
            e[ops.xp.asarray(first)] = 0                                # +0.0 in both bf16 storages
        x = ops.xp.concatenate([ops.rmsnorm(e, self.enorm, c.rms_norm_eps),
                                ops.rmsnorm(h, self.hnorm, c.rms_norm_eps)], axis=1)
        d = decode_rows(segs)
        x = ops.gemm(x, self.eh_proj, out="bf16", decode=d)            # [T', D] bf16
        x = ops.residual_add(x, summed(comm, self.attn(ops.rmsnorm(x, self.in_norm, c.rms_norm_eps), segs, kv)))
        x = ops.residual_add(x, summed(comm, self.mlp(ops.rmsnorm(x, self.post_norm, c.rms_norm_eps), d)))
        return ops.rmsnorm(x, self.head_norm, c.rms_norm_eps)
