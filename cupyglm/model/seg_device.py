"""A forward call's device-side row maps, built once per call on the host and uploaded in one int32 array, shared
by every DSA layer of the call (the MTP layer's call has its own segments, so its own maps).

Everything here is host arithmetic on the page tables the host already holds (kv/store.py's rows), so every
backend sees the same ids, and no layer computes a row map on the device: the latent rows each segment's new
rows are written to, the positions the pick takes, each row's page table (attention maps its picked positions
through it inside the kernels: ops.attention_paged), the pooled-key rows of a sparse segment's visible pools and
those of the pools each segment's rows complete.
The maps are cached on the call's first segment (`dev`), which lives for one forward call.
"""
from __future__ import annotations

import numpy as np

from cupyglm.model.batch import Segment


class CallMaps:
    """latent: [T] int32 store rows of the call's rows; positions: [T] int32; table: [T, width] int32 row t's page
    table (zero padded past its pages); base: [T, 1] int32 t * width (the host path's flat table index); pools:
    seg.off -> [visible] int32 pooled-key rows of pools 0..visible-1 (sparse segments only); done: seg.off -> [C]
    int32 pooled-key rows of the pools the segment's rows complete; tail_seg: [S, 5] int32 (row0, n, start, tail
    slot, done0) per segment and done_rows: [D] int32 every segment's completed pools' rows (index_tail_pool's seg
    and done; tail_items its work items). All views of one device array."""

    def __init__(self, segs: list[Segment], kv, xp):
        cfg, t = kv.cfg, sum(s.n for s in segs)
        width = max(len(s.state.pages) for s in segs)
        latent = np.concatenate([kv.rows(s.state.pages, s.positions) for s in segs])        # [T] int32
        if np.unique(latent).size != t:                                                    # pages shared by two rows
            raise ValueError("call maps: two rows of the call map to one latent row (a page table is corrupt)")
        positions = np.concatenate([s.positions for s in segs])                           # [T] int32
        table = np.zeros((t, width), dtype=np.int32)                                       # [T, width] int32
        for s in segs:
            table[s.rows, :len(s.state.pages)] = s.state.pages
        base = np.arange(t, dtype=np.int32) * np.int32(width)                              # [T] int32 row t's table
        parts, pool_at, done_at, at = [latent, positions, table.reshape(-1), base], {}, {}, 3 * t + t * width
        kp = cfg.index_kpool
        for s in segs:
            visible = (s.start + s.n) // kp
            if visible > cfg.index_pools:                                                   # the pick scores pools
                parts.append(kv.pool_rows(s.state.pages, np.arange(visible)))
                pool_at[s.off] = (at, visible)
                at += visible
        for s in segs:                                                  # the pools the segment's rows complete
            first, last = s.start // kp, (s.start + s.n) // kp
            parts.append(kv.pool_rows(s.state.pages, np.arange(first, last)))
            done_at[s.off] = (at, last - first)
            at += last - first
        # index_tail_pool's table: (row0, n, start, tail slot, done0) per segment, done0 into the done rows (the
        # segments' done blocks, consecutive in segment order)
        slots = [kv.tails.slot(s.state) for s in segs]
        if len(set(slots)) != len(slots):
            raise ValueError(f"call maps: two segments of the call hold one index-tail slot ({slots})")
        done0, ndone = done_at[segs[0].off][0], sum(c for _, c in done_at.values())
        if not ndone:                                      # no pool completes: one -1 (none), never an empty view
            parts.append(np.full(1, -1, dtype=np.int32))
            at, ndone = at + 1, 1
        tails = np.array([(s.off, s.n, s.start, slot, done_at[s.off][0] - done0) for s, slot in zip(segs, slots)],
                         dtype=np.int32).reshape(-1, 5)                                   # [S, 5] int32
        parts.append(tails.reshape(-1))
        tails_at, at = at, at + tails.size
        dev = xp.asarray(np.concatenate(parts).astype(np.int32, copy=False))              # the one upload
        self.latent, self.positions = dev[:t], dev[t:2 * t]
        self.table = dev[2 * t:2 * t + t * width].reshape(t, width)
        self.base = dev[2 * t + t * width:3 * t + t * width].reshape(t, 1)                  # [T, 1] int32
        self.pools = {off: dev[a:a + v] for off, (a, v) in pool_at.items()}
        self.done = {off: dev[a:a + c] for off, (a, c) in done_at.items()}
        self.page_tokens = kv.page_tokens
        self._empty = {}
        self.tail_seg, self.done_rows = dev[tails_at:tails_at + tails.size].reshape(-1, 5), dev[done0:done0 + ndone]
        self.tail_items = sum(max((s.start + s.n) // kp - s.start // kp, 1) for s in segs if s.n)   # its grid.y

    def latent_of(self, seg: Segment):
        """[n] int32 the store rows of the segment's new rows."""
        return self.latent[seg.rows]

    def positions_of(self, seg: Segment):
        """[n] int32 the segment's positions."""
        return self.positions[seg.rows]

    def pools_of(self, seg: Segment):
        """[visible] int32 pooled-key rows of the segment's visible pools (a sparse segment)."""
        return self.pools[seg.off]

    def done_of(self, seg: Segment):
        """[C] int32 pooled-key rows of the pools the segment's rows complete (index_tail_pool's pool_rows)."""
        return self.done[seg.off]

    def no_scores(self, seg: Segment, xp):
        """[n, 0] fp32: the scores of a segment whose rows are all dense (made once per call)."""
        if seg.off not in self._empty:
            self._empty[seg.off] = xp.zeros((seg.n, 0), dtype=xp.float32)
        return self._empty[seg.off]


def call_maps(segs: list[Segment], kv, xp) -> CallMaps:
    """The call's maps, built by the first layer that asks and cached on segs[0]."""
    dev = segs[0].dev
    if "maps" not in dev:
        dev["maps"] = CallMaps(segs, kv, xp)
    return dev["maps"]


def token_rows(maps: CallMaps, xp, tokens):
    """Latent rows of the call's token lists [T, W] int32 (positions, -1 padded) through each row's page table;
    -1 stays -1. Only the host-rows path needs them as an array (its gather marks store rows); attention on
    device rows maps positions inside the kernels. Integer arithmetic only, as kv.rows on the host."""
    pt = np.int32(maps.page_tokens)
    safe = xp.maximum(tokens, np.int32(0))
    rows = maps.table.reshape(-1)[maps.base + safe // pt] * pt + safe % pt
    return xp.where(tokens < 0, np.int32(-1), rows).astype(xp.int32, copy=False)
