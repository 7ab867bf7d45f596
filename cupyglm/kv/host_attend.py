"""Attention over latent rows in host memory: per call segment, its picked rows gathered once each into the
device slots (kv/host_rows.py), then the unchanged attention kernels over the slots with the token lists
rewritten to slot ids (same order, so the same bytes are attended in the same order: the same bits); a prompt
segment's rows keep their positions (the tensor core's key blocks sit on the position grid), mapped to slots
through a table of one-token pages.

Segments run one after another because they share the slots; each segment's distinct rows are bounded by
its own positions (host_rows.py states the bound), and its flag word is its index in the call.
"""
from __future__ import annotations

import numpy as np


def attend_host(ops, host, layer: int, segs, qa, tokens, rows, counts, scale: float, chunk: int, written):
    """qa: [T, H, R] bf16, tokens: [T, W] int32 positions and rows: [T, W] int32 their host-store row ids (-1
    padded), counts: [T] int32, written: per segment the [n] int32 store rows it wrote to this layer
    -> [T, H, R] bf16."""
    xp = ops.xp
    outs = []
    for i, seg in enumerate(segs):
        r, n = xp.ascontiguousarray(rows[seg.rows]), xp.ascontiguousarray(counts[seg.rows])
        ids = host.gather(layer, r, n, i, written[i])                                   # [n, W] int32 slot ids
        if seg.decode:
            outs.append(ops.attention(qa[seg.rows], host.slots, ids, n, scale, chunk, decode=seg.n))
            continue
        tok = xp.ascontiguousarray(tokens[seg.rows])
        outs.append(ops.attention_paged(qa[seg.rows], host.slots, tok, slot_table(xp, seg, tok, ids),
                                        xp.zeros(seg.n, xp.int32), 1, n, scale, chunk, decode=0))
    return outs[0] if len(outs) == 1 else xp.concatenate(outs)


def slot_table(xp, seg, tokens, ids):
    """A prompt segment's positions -> slot ids as a page table of one-token pages ([1, start + n + 1] int32), so
    its rows attend on the position grid (attention_paged); every listed position is below start + n, and the
    padding (-1) lands in the last entry, never read. A position's slots all hold its row's bytes."""
    end = seg.start + seg.n
    table = xp.full((1, end + 1), -1, dtype=xp.int32)
    table[0, xp.where(tokens >= 0, tokens, np.int32(end))] = ids
    return table


def token_rows(maps, xp, tokens):
    """Latent rows of a call's token lists [T, W] int32 (positions, -1 padded) through each row's segment's page
    table (maps.table[maps.seg[t]], model/seg_device.CallMaps); -1 stays -1. Only the host-rows path needs them as
    an array (its gather marks store rows); attention on device rows maps positions inside the kernels. Integer
    arithmetic only, as KVStore.rows on the host."""
    pt = np.int32(maps.page_tokens)
    safe = xp.maximum(tokens, np.int32(0))
    width = np.int32(maps.table.shape[1])
    rows = maps.table.reshape(-1)[maps.seg[:, None] * width + safe // pt] * pt + safe % pt
    return xp.where(tokens < 0, np.int32(-1), rows).astype(xp.int32, copy=False)
