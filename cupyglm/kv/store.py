"""The KV store: per KV layer, latent rows and pooled keys on pages, read and written through page tables.

A page of `page_tokens` tokens holds, per KV layer, latent rows [page_tokens, R] and pooled keys
[page_tokens / kpool, I], each array with its own page stride. Position p of a sequence lives at
row pages[p // page_tokens] * page_tokens + p % page_tokens. The arrays are those `cupyglm.memory.kv_arrays`
describes (the plan counts the same description). With `host_slots` (CUPYGLM_KV_HOST=1) the latent rows
live in host memory (`cupyglm.kv.host_rows`) and `host` gathers a call's picked rows into device slots; the model
reads latent rows only through `attend` (and notes its writes through `note_written`), wherever they live. Every
live sequence's index tails sit in `tails`, a slot per sequence (`cupyglm.kv.index_tails`). With `scratch` (CUDA
graphs) the device arrays hold `scratch_pages(page_tokens)` more pages past the pool's, never leased: the
padding rows of a captured decode call write their latent rows there and read their pooled keys there
(model/seg_device.py), so they touch no sequence's rows.
"""
from __future__ import annotations

import numpy as np

from cupyglm.config import ModelConfig
from cupyglm.kv.host_attend import attend_host, token_rows
from cupyglm.kv.host_rows import HostRows
from cupyglm.kv.index_tails import TAIL_SLOTS, IndexTails
from cupyglm.kv.pool import PagePool
from cupyglm.memory import alloc, latent_array, pooled_array, storage_of

PAD_ROWS = 16       # the rows of the largest captured bucket (an all-padding warm-up call included)


def scratch_pages(page_tokens: int) -> int:
    """Pages that hold PAD_ROWS latent rows (one row each, so no two padding rows write one row)."""
    return -(-PAD_ROWS // page_tokens)


class KVStore:
    def __init__(self, cfg: ModelConfig, ops, num_pages: int, page_tokens: int, poison: bool = False,
                 host_slots: int = 0, host_shared=None, tail_slots: int = TAIL_SLOTS, mtp: bool = True,
                 scratch: bool = False, host_writes=None):
        """tail_slots: the sequences whose index tails the store holds at once (kv/index_tails.py); mtp: the MTP
        layer writes tails (its head is built); scratch: the padding rows' pages past the pool's (device rows);
        host_writes: the host rows' write observer (HostRows)."""
        if page_tokens <= 0 or page_tokens % cfg.index_kpool:
            raise ValueError(f"page_tokens must be a positive multiple of {cfg.index_kpool}, got {page_tokens}")
        self.cfg = cfg
        self.page_tokens = page_tokens
        self.pool = PagePool(num_pages)
        xp, storage = ops.xp, storage_of(ops)
        rows = num_pages * page_tokens
        # the scratch pages' ids: num_pages .. (device arrays only; the host-rows path never captures a DSA layer)
        self.scratch = list(range(num_pages, num_pages + scratch_pages(page_tokens))) \
            if scratch and not host_slots else []
        drows = rows + len(self.scratch) * page_tokens
        pools = drows // cfg.index_kpool
        # latent[layer]: [pages * page_tokens, R] bf16; pooled[layer]: [pages * page_tokens / 4, I] bf16
        self.host = HostRows(cfg, ops, rows, host_slots, poison, pool=self.pool, shared=host_shared,
                             writes=host_writes) if host_slots else None
        if self.host is not None:
            self.latent = self.host.latent
        else:
            self.latent = {l: alloc(xp, latent_array(cfg, l, drows), storage, poison) for l in cfg.kv_layers}
        self.pooled = {l: alloc(xp, pooled_array(cfg, l, pools), storage, poison) for l in cfg.kv_layers}
        self.tails = IndexTails(cfg, xp, storage, tail_slots, cfg.kv_layers if mtp else cfg.dsa_layers)

    def pages_needed(self, length: int) -> int:
        return -(-length // self.page_tokens)

    def ensure(self, pages: list[int], length: int) -> None:
        """Grow a page table in place to hold `length` positions."""
        need = self.pages_needed(length) - len(pages)
        if need > 0:
            pages.extend(self.pool.lease(need))

    def rows(self, pages: list[int], positions: np.ndarray) -> np.ndarray:
        """Physical latent rows of positions (int32); -1 stays -1."""
        table = np.asarray(pages, dtype=np.int64)
        pos = np.asarray(positions, dtype=np.int64)
        safe = np.maximum(pos, 0)
        out = table[safe // self.page_tokens] * self.page_tokens + safe % self.page_tokens
        return np.where(pos < 0, -1, out).astype(np.int32)

    def pool_rows(self, pages: list[int], pools: np.ndarray) -> np.ndarray:
        """Physical pooled-key rows of pool indices (int32)."""
        per_page = self.page_tokens // self.cfg.index_kpool
        table = np.asarray(pages, dtype=np.int64)
        pools = np.asarray(pools, dtype=np.int64)
        return (table[pools // per_page] * per_page + pools % per_page).astype(np.int32)

    def attend(self, ops, layer: int, segs, maps, qa, tokens, counts, scale: float, chunk: int, written, decode: int):
        """Attention of a call's rows over their picked latent rows: qa [T, H, R] bf16, tokens [T, W] int32 picked
        positions (-1 padded), counts [T], maps the call's CallMaps (model/seg_device.py), written per segment the
        store rows it wrote -> [T, H, R] bf16. Host rows: per segment gathered into slots (kv/host_attend.py),
        else positions mapped through the page tables inside the kernel; the same bits either way."""
        xp = ops.xp
        if self.host is not None:
            rows = token_rows(maps, xp, tokens)                                    # [T, W] store rows
            return attend_host(ops, self.host, layer, segs, xp.ascontiguousarray(qa), tokens, rows, counts, scale,
                               chunk, written)
        return ops.attention_paged(xp.ascontiguousarray(qa), self.latent[layer], tokens, maps.table, maps.seg,
                                   maps.page_tokens, counts, scale, chunk, decode=decode)

    def note_written(self, ops, layer: int, segs, written) -> None:
        """The host rows' write-hash check mode (tests): each segment's written rows as stored; else nothing."""
        if self.host is None or self.host.write_hash is None:
            return
        for seg, ids in zip(segs, written):
            self.host.write_hash.note(layer, ids, ops.read_rows(self.latent[layer], ids), seg.state)
