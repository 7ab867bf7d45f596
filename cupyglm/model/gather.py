"""Attention over latent rows in host memory: per call segment, its picked rows gathered once each into the
device slots (kv/host_rows.py), then the unchanged attention kernel over the slots with the token lists
rewritten to slot ids (same order, so the same bytes are attended in the same order: the same bits).

Segments run one after another because they share the slots; each segment's distinct rows are bounded by
its own positions (host_rows.py states the bound), and its flag word is its index in the call.
"""
from __future__ import annotations


def attend_host(ops, host, layer: int, segs, qa, rows, counts, scale: float, chunk: int, written):
    """qa: [T, H, R] bf16, rows: [T, W] int32 host-store row ids (-1 padded), counts: [T] int32, written: per
    segment the [n] int32 store rows it wrote to this layer -> [T, H, R] bf16."""
    xp = ops.xp
    outs = []
    for i, seg in enumerate(segs):
        r, n = xp.ascontiguousarray(rows[seg.rows]), xp.ascontiguousarray(counts[seg.rows])
        ids = host.gather(layer, r, n, i, written[i])                                   # [n, W] int32 slot ids
        outs.append(ops.attention(qa[seg.rows], host.slots, ids, n, scale, chunk,
                                  decode=seg.n if seg.decode else 0))
    return outs[0] if len(outs) == 1 else xp.concatenate(outs)
