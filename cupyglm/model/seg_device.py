"""A forward call's device-side row maps, built once per call on the host and uploaded in one int32 array, shared
by every DSA layer of the call (the MTP layer's call has its own segments, so its own maps).

Everything here is host arithmetic on the page tables the host already holds (kv/store.py's rows), so every
backend sees the same ids, and no layer computes a row map on the device: the latent rows each segment's new
rows are written to, the positions the pick takes, each row's segment, each segment's page table (attention maps
a row's picked positions through its segment's inside the kernels: ops.attention_paged) and pooled-key rows (the
indexer scores every row against its segment's: ops.index_scores_rows) and those of the pools each segment's rows
complete. The two tables' widths are width buckets (`width_bucket`), so the call's shapes follow buckets, not the exact
context length. The maps are cached on the call's first segment (`dev`), which lives for one forward call.
"""
from __future__ import annotations

import numpy as np

from cupyglm.model.batch import Segment


def width_bucket(n: int) -> int:
    """The smallest power of two >= n, at least 1: the width of a table of n entries."""
    return 1 << max(0, int(n) - 1).bit_length()


class CallMaps:
    """latent: [T] int32 store rows of the call's rows; positions: [T] int32; seg: [T] int32 row t's segment, its row
    of table and of pool_table (one table row per segment, not per row, so a prompt chunk uploads one of each);
    table: [S, width] int32 segment s's page table (its sequence's pages, zero padded; width = width_bucket(the most
    pages of a sequence)); pool_table: [S, Pw] int32 segment s's pooled-key rows: its sequence's pools 0..V-1, V
    the visible pools of the segment's last row (the segment's rows share it; its pools past a row's own visible
    count complete within the call, and the pick never reads them), then the sequence's pool 0 row;
    Pw = width_bucket(the call's largest V). tail_seg: [S, 5] int32 (row0, n, start, tail slot, done0) per segment
    and done_rows: [D] int32 every segment's completed pools' rows (index_tail_pool's seg and done; tail_items its
    work items). All views of one device array."""

    def __init__(self, segs: list[Segment], kv, xp):
        cfg, t = kv.cfg, sum(s.n for s in segs)
        width = width_bucket(max(len(s.state.pages) for s in segs))
        latent = np.concatenate([kv.rows(s.state.pages, s.positions) for s in segs])        # [T] int32
        if np.unique(latent).size != t:                                                    # pages shared by two rows
            raise ValueError("call maps: two rows of the call map to one latent row (a page table is corrupt)")
        positions = np.concatenate([s.positions for s in segs])                           # [T] int32
        table = np.zeros((len(segs), width), dtype=np.int32)                               # [S, width] int32
        kp = cfg.index_kpool
        visible = [(s.start + s.n) // kp for s in segs]                    # pools the segment's last row sees
        pw = width_bucket(max(visible))
        pool_table = np.empty((len(segs), pw), dtype=np.int32)                             # [S, Pw] int32
        seg = np.empty(t, dtype=np.int32)                                                  # [T] int32
        for j, (s, v) in enumerate(zip(segs, visible)):
            table[j, :len(s.state.pages)] = s.state.pages
            pool_table[j] = kv.pool_rows(s.state.pages, np.zeros(1))[0]
            pool_table[j, :v] = kv.pool_rows(s.state.pages, np.arange(v))
            seg[s.rows] = j
        parts = [latent, positions, seg, table.reshape(-1), pool_table.reshape(-1)]
        done_at, pool_at = {}, 3 * t + table.size
        at = pool_at + pool_table.size
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
        self.latent, self.positions, self.seg = dev[:t], dev[t:2 * t], dev[2 * t:3 * t]
        self.table = dev[3 * t:pool_at].reshape(-1, width)                                 # [S, width] int32
        self.pool_table = dev[pool_at:pool_at + pool_table.size].reshape(-1, pw)          # [S, Pw] int32
        self.page_tokens = kv.page_tokens
        self.tail_seg, self.done_rows = dev[tails_at:tails_at + tails.size].reshape(-1, 5), dev[done0:done0 + ndone]
        self.tail_items = sum(max((s.start + s.n) // kp - s.start // kp, 1) for s in segs if s.n)   # its grid.y

    def latent_of(self, seg: Segment):
        """[n] int32 the store rows of the segment's new rows."""
        return self.latent[seg.rows]

    def positions_of(self, seg: Segment):
        """[n] int32 the segment's positions."""
        return self.positions[seg.rows]


def call_maps(segs: list[Segment], kv, xp) -> CallMaps:
    """The call's maps, built by the first layer that asks and cached on segs[0]."""
    dev = segs[0].dev
    if "maps" not in dev:
        dev["maps"] = CallMaps(segs, kv, xp)
    return dev["maps"]


def token_rows(maps: CallMaps, xp, tokens):
    """Latent rows of the call's token lists [T, W] int32 (positions, -1 padded) through each row's segment's page
    table (table[seg[t]]); -1 stays -1. Only the host-rows path needs them as an array (its gather marks store
    rows); attention on device rows maps positions inside the kernels. Integer arithmetic only, as kv.rows on the
    host."""
    pt = np.int32(maps.page_tokens)
    safe = xp.maximum(tokens, np.int32(0))
    width = np.int32(maps.table.shape[1])
    rows = maps.table.reshape(-1)[maps.seg[:, None] * width + safe // pt] * pt + safe % pt
    return xp.where(tokens < 0, np.int32(-1), rows).astype(xp.int32, copy=False)
