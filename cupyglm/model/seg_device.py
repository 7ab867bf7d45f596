"""A segment's device-side row maps, uploaded once per forward call and shared by every layer.

A Segment lives for one forward call, so its `dev` dict is the cache: the page table, the positions and
their latent rows, and the pooled-key rows of the visible pools go to the device once, not once a layer.
Token lists stay on the device: latent rows of picked tokens are computed there (no read-back).
"""
from __future__ import annotations

import numpy as np

from cupyglm.model.batch import Segment


def positions(seg: Segment, xp):
    """[n] int32 positions of the segment's rows, on the device."""
    if "positions" not in seg.dev:
        seg.dev["positions"] = xp.asarray(seg.positions)
    return seg.dev["positions"]


def table(seg: Segment, xp):
    """[pages] int32 the sequence's page table, on the device (grown before the call)."""
    if "table" not in seg.dev:
        seg.dev["table"] = xp.asarray(np.asarray(seg.state.pages, dtype=np.int32))
    return seg.dev["table"]


def latent_rows(seg: Segment, kv, xp):
    """[n] int32 physical latent rows of the segment's positions, on the device."""
    if "latent" not in seg.dev:
        seg.dev["latent"] = xp.asarray(kv.rows(seg.state.pages, seg.positions))
    return seg.dev["latent"]


def pool_rows(seg: Segment, kv, xp, visible: int):
    """[visible] int32 pooled-key rows of pools 0..visible-1, on the device."""
    key = ("pools", visible)
    if key not in seg.dev:
        seg.dev[key] = xp.asarray(kv.pool_rows(seg.state.pages, np.arange(visible)))
    return seg.dev[key]


def token_rows(seg: Segment, kv, xp, tokens):
    """Latent rows of device token lists [n, W] int32 (-1 padded) through the page table; -1 stays -1.
    Integer arithmetic only, so every backend computes the same rows kv.rows computes on the host."""
    pt = np.int32(kv.page_tokens)
    safe = xp.maximum(tokens, np.int32(0))
    rows = table(seg, xp)[safe // pt] * pt + safe % pt
    return xp.where(tokens < 0, np.int32(-1), rows).astype(xp.int32, copy=False)


def call_token_rows(segs: list[Segment], kv, xp, tokens):
    """Latent rows of the call's token lists [T, W] int32 (-1 padded), row r through its own sequence's page
    table: one pass for every segment (a [T, max pages] table uploaded once per call, cached on segs[0])."""
    if len(segs) == 1:
        return token_rows(segs[0], kv, xp, tokens)
    dev = segs[0].dev
    if "call_table" not in dev:
        width = max(len(s.state.pages) for s in segs)
        table = np.zeros((sum(s.n for s in segs), width), dtype=np.int32)    # [T, max pages] int32
        for s in segs:
            table[s.rows, :len(s.state.pages)] = s.state.pages
        base = (np.arange(table.shape[0], dtype=np.int32) * np.int32(width))[:, None]
        dev["call_table"] = (xp.asarray(table.reshape(-1)), xp.asarray(base))
    flat, base = dev["call_table"]
    pt = np.int32(kv.page_tokens)
    safe = xp.maximum(tokens, np.int32(0))
    rows = flat[base + safe // pt] * pt + safe % pt
    return xp.where(tokens < 0, np.int32(-1), rows).astype(xp.int32, copy=False)
