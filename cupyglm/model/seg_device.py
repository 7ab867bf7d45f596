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
    work items). All views of one device array.
    Padded (`pad_to` B: a decode call run in a fixed B-row shape): the B - T padding rows write distinct scratch
    latent rows (the store's scratch pages, never a sequence's), sit at position 0 (a dense pick of one token: the
    scratch page's row 0) and each is a segment of its own past the real ones, whose table and pool-table rows hold
    the scratch pages; the tables have B rows, the B - S padding tail rows no rows (so no tail or pooled key is
    written for them); D is B (-1 padded). A real row's entries are those of the unpadded maps, so its bits are."""

    def __init__(self, segs: list[Segment], kv, xp, pad_to: int = 0, into: dict | None = None,
                 widths: tuple[int, int] | None = None):
        """pad_to: B >= T rows and table rows (the call's fixed row count; `padded` states what padding rows are);
        into: the fixed device buffers by `layout`, uploaded in place (the first call of a layout allocates it);
        widths: (width, Pw) given (an all-padding twin of a layout), else the buckets of segs'."""
        t, kp = sum(s.n for s in segs), kv.cfg.index_kpool
        b = pad_to or t                                                   # rows of the maps
        scratch = kv.scratch if pad_to else []                           # the store's padding pages
        if b < t or len(scratch) * kv.page_tokens < b - t or (pad_to and not scratch):
            raise ValueError(f"call maps: {t} rows padded to {b} need {b - t} scratch rows "
                             f"(the store has {len(scratch) * kv.page_tokens}: KVStore(scratch=True))")
        visible = [(s.start + s.n) // kp for s in segs]                   # pools the segment's last row sees
        width, pw = widths or (width_bucket(max(len(s.state.pages) for s in segs)), width_bucket(max(visible)))
        ns = b if pad_to else len(segs)                                   # table rows: padding segments past S
        pad = [kv.rows(scratch, np.arange(b - t))] if b > t else []       # the padding rows' scratch rows
        latent = np.concatenate([kv.rows(s.state.pages, s.positions) for s in segs] + pad).astype(np.int32)  # [B] int32
        if np.unique(latent).size != b:                                                    # pages shared by two rows
            raise ValueError("call maps: two rows of the call map to one latent row (a page table is corrupt)")
        positions = np.zeros(b, dtype=np.int32)                                            # [B] int32
        table = np.zeros((ns, width), dtype=np.int32)                                      # [S or B, width] int32
        pool_table = np.empty((ns, pw), dtype=np.int32)                                    # [S or B, Pw] int32
        seg = np.arange(b, dtype=np.int32) - np.int32(t) + np.int32(len(segs))             # [B] padding: their own
        for j, (s, v) in enumerate(zip(segs, visible)):
            positions[s.rows], seg[s.rows], table[j, :len(s.state.pages)] = s.positions, j, s.state.pages
            pool_table[j] = kv.pool_rows(s.state.pages, np.zeros(1))[0]
            pool_table[j, :v] = kv.pool_rows(s.state.pages, np.arange(v))
        if pad_to:                                                       # padding segments: the scratch pages
            table[len(segs):, :len(scratch)] = scratch[:width]
            pool_table[len(segs):] = kv.pool_rows(scratch, np.zeros(1))[0]
        parts = [latent, positions, seg, table.reshape(-1), pool_table.reshape(-1)]
        done_at, pool_at = [], 3 * b + table.size
        at = pool_at + pool_table.size
        done0 = at
        for s in segs:                                                  # the pools the segment's rows complete
            first, last = s.start // kp, (s.start + s.n) // kp
            parts.append(kv.pool_rows(s.state.pages, np.arange(first, last)))
            done_at.append(at - done0)
            at += last - first
        # index_tail_pool's table: (row0, n, start, tail slot, done0) per segment, done0 into the done rows (the
        # segments' done blocks, consecutive in segment order); padding segments have no rows (the kernel skips)
        slots = [kv.tails.slot(s.state) for s in segs]
        if len(set(slots)) != len(slots):
            raise ValueError(f"call maps: two segments of the call hold one index-tail slot ({slots})")
        ndone = max(at - done0, 1, b if pad_to else 0)    # -1 padded: never an empty view; a bucket's fixed size
        parts.append(np.full(done0 + ndone - at, -1, dtype=np.int32))
        at = done0 + ndone
        tails = np.zeros((ns, 5), dtype=np.int32)                                          # [S or B, 5] int32
        tails[len(segs):, 3] = -1
        for j, (s, slot, d0) in enumerate(zip(segs, slots, done_at)):
            tails[j] = (s.off, s.n, s.start, slot, d0)
        parts.append(tails.reshape(-1))
        tails_at, at = at, at + tails.size
        host = np.concatenate(parts).astype(np.int32, copy=False)
        self.layout = (b, width, pw)                                   # what the padded call's shapes follow
        dev = None if into is None else into.get(self.layout)
        if dev is None:
            dev = xp.asarray(host)                                     # the one upload
            if into is not None:
                into[self.layout] = dev
        else:
            dev.set(host)                                              # the one upload, in place
        self.latent, self.positions, self.seg = dev[:b], dev[b:2 * b], dev[2 * b:3 * b]
        self.table = dev[3 * b:pool_at].reshape(-1, width)                                 # [S or B, width] int32
        self.pool_table = dev[pool_at:pool_at + pool_table.size].reshape(-1, pw)          # [S or B, Pw] int32
        self.page_tokens = kv.page_tokens
        self.tail_seg, self.done_rows = dev[tails_at:tails_at + tails.size].reshape(-1, 5), dev[done0:done0 + ndone]
        # index_tail_pool's grid.y: the call's work items, or the bucket when padded (any value >= 1, same bits)
        self.tail_items = b if pad_to else sum(max((s.start + s.n) // kp - s.start // kp, 1) for s in segs if s.n)

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

