"""Kept prompt states on one rank: the arena, its kept pages, and the parts of a sequence's state at a keep point.

A kept state at length L = the fixed parts (per KDA layer the recurrent state and conv window; per indexed KV
layer the incomplete pool's n % kpool index-key and gate rows; the MTP pending row when the head is built) and
the paged parts (per indexed KV layer the latent rows of positions 0..n-1 and the n // kpool pooled keys, each
with its own page stride), n = L for a DSA layer and L - 1 for the MTP layer (`written`). Every copy goes
through `cupyglm.kv.walk.each`; the backend gives only the hook.
With a page store (CUPYGLM_KV_SHARE, `cupyglm.kv.page_store`) the paged parts start after the whole pages the
store holds (the walk's `from`), so a kept state copies the fixed parts and a partly filled last page only.

What must stay true: no rank allocates kept pages: a keep (or a disk load) copies into the page ids rank 0's
prompt cache chose (`cupyglm.engine.prompt_cache`, carried by `cupyglm.engine.ops`); this rank's pool only
takes them, refusing an id it holds, so every rank holds the same entries on the same kept pages.
"""
from __future__ import annotations

import dataclasses

from cupyglm.config import ModelConfig
from cupyglm.kv.copy_hooks import address_of, hook_for, host_arena
from cupyglm.kv.page_store import PageStore
from cupyglm.kv.pool import PagePool
from cupyglm.kv.state import SeqState
from cupyglm.kv.walk import Kept, Part, each
from cupyglm.memory import BF16, alloc, kda_state_arrays, kv_arrays, prompt_cache_arena, storage_of, total_bytes


@dataclasses.dataclass(frozen=True)
class KeptEntry:
    entry_id: int
    length: int                          # positions the kept state holds
    kept: Kept
    nbytes: int


def indexed_layers(cfg: ModelConfig, mtp: bool) -> tuple[int, ...]:
    """KV layers a sequence writes (the MTP layer's only when its head is built)."""
    return cfg.kv_layers if mtp else cfg.dsa_layers


def written(cfg: ModelConfig, layer: int, length: int) -> int:
    """Positions a KV layer has written at sequence length `length`: the MTP layer's row L - 1 waits for the
    token at L (the pending row), so it has written L - 1."""
    return max(length - 1, 0) if layer == cfg.mtp_layer else length


def kept_state_bytes(cfg: ModelConfig, tp: int, storage, page_tokens: int, length: int, mtp: bool = False,
                     shared: int = 0) -> int:
    """Bytes of a kept state at `length` (what `KeptStore.parts` covers), computed without any state; `shared`:
    the leading pages a page store holds instead (their rows are not copied)."""
    total = 0
    for layer in cfg.kda_layers:
        total += sum(a.nbytes(storage) for a in kda_state_arrays(cfg, tp, layer))
    bf = storage.itemsize(BF16)
    for layer in indexed_layers(cfg, mtp):
        n = written(cfg, layer, length)
        total += 2 * (n % cfg.index_kpool) * cfg.index_head_dim * bf
        total += n * cfg.kv_lora_rank * bf + (n // cfg.index_kpool) * cfg.index_head_dim * bf
        total -= shared * (page_tokens * cfg.kv_lora_rank + page_tokens // cfg.index_kpool * cfg.index_head_dim) * bf
    if mtp and length:
        total += cfg.hidden_size * bf
    return total


class KeptStore:
    """The arena of one rank and the kept states on it, by entry id."""

    def __init__(self, cfg: ModelConfig, ops, kv, tp: int, cache_bytes: int, host: bool = False,
                 mtp: bool = False, share: int = 0):
        self.cfg, self.ops, self.kv, self.tp, self.mtp = cfg, ops, kv, tp, mtp
        # CUPYGLM_KV_SHARE: the whole KV pages before a keep point stay in the pool, held by the entry
        self.pages = PageStore(kv.pool, kv.page_tokens, share, mtp) if share else None
        self.storage = storage_of(ops)
        self.page_bytes = total_bytes(kv_arrays(cfg, 1, kv.page_tokens), self.storage)   # one KV page's bytes
        spec = prompt_cache_arena(cache_bytes, self.page_bytes)
        if spec.shape[0] < 1:
            raise ValueError(f"the prompt cache of {cache_bytes} bytes holds no kept page of {self.page_bytes} bytes")
        self.host = host
        # [kept pages, page bytes] u8: device memory, or pinned host memory mapped into the device
        self.arena, self.base = host_arena(ops, spec) if host else (alloc(ops.xp, spec, self.storage), None)
        if self.base is None:
            self.base = address_of(self.arena)
        self.pool = PagePool(spec.shape[0])     # which kept pages are held: it takes rank 0's ids, leases none
        self.hook = hook_for(ops)
        self.entries: dict[int, KeptEntry] = {}

    @property
    def nbytes(self) -> int:
        return self.pool.num_pages * self.page_bytes

    def shared_pages(self, length: int) -> int:
        """Leading KV pages of a state kept at `length` that the page store holds (the walk's `from`)."""
        return self.pages.shared_pages(length) if self.pages is not None else 0

    def state_bytes(self, length: int) -> int:
        return kept_state_bytes(self.cfg, self.tp, self.storage, self.kv.page_tokens, length, self.mtp,
                                self.shared_pages(length))

    def pages_for(self, length: int) -> int:
        return -(-self.state_bytes(length) // self.page_bytes)

    # ---- parts ---------------------------------------------------------------------------------------------------
    def parts(self, state: SeqState, length: int) -> list[Part]:
        """The parts of `state` at `length` positions, in kept order."""
        cfg, kv, xp = self.cfg, self.kv, self.ops.xp
        out = []
        for layer in cfg.kda_layers:
            for d in (state.kda_state, state.kda_conv):
                d[layer] = xp.ascontiguousarray(d[layer])        # an address needs one contiguous buffer
                out.append(Part(address_of(d[layer]), int(d[layer].nbytes)))
        for layer in indexed_layers(cfg, self.mtp):
            rows = written(cfg, layer, length) % cfg.index_kpool          # the tail's leading slots in use
            tail = state.index_tail.get(layer)
            if tail is None and rows == 0:                     # a layer that has not run yet: its slot's zeros
                tail = kv.tails.of(state, layer)
            want = (cfg.index_kpool, cfg.index_head_dim)
            if tail is None or any(a.shape != want or not a.flags.c_contiguous for a in tail):
                raise ValueError(f"layer {layer}'s index tail is not a contiguous {want} pair at length {length}")
            out += [Part(address_of(a), rows * int(a.nbytes) // cfg.index_kpool) for a in tail]
        pages, skip = tuple(state.pages), self.shared_pages(length)
        per_pool = kv.page_tokens // cfg.index_kpool
        for layer in indexed_layers(cfg, self.mtp):
            lat, pk = kv.latent[layer], kv.pooled[layer]
            row, prow = lat.shape[1] * lat.itemsize, pk.shape[1] * pk.itemsize
            n = written(cfg, layer, length)
            out.append(Part(address_of(lat), n * row, kv.page_tokens * row, pages, skip))
            out.append(Part(address_of(pk), (n // cfg.index_kpool) * prow, per_pool * prow, pages, skip))
        if self.mtp and length:
            state.mtp_pending = xp.ascontiguousarray(state.mtp_pending)
            out.append(Part(address_of(state.mtp_pending), int(state.mtp_pending.nbytes)))
        return out

    # ---- keep, restore, drop -------------------------------------------------------------------------------------
    def take(self, entry_id: int, length: int, nbytes: int, pages) -> KeptEntry:
        """Hold the kept pages `pages` (free here, as many as `nbytes` needs) for a new entry; its bytes are the
        caller's to copy. ValueError when they do not fit or are not free."""
        if entry_id in self.entries:
            raise ValueError(f"kept entry {entry_id} exists")
        ids = tuple(int(p) for p in pages)
        if len(ids) != -(-nbytes // self.page_bytes):
            raise ValueError(f"kept entry {entry_id} of {nbytes} bytes needs {-(-nbytes // self.page_bytes)} kept "
                             f"pages, it was given {len(ids)}")
        self.pool.take(ids)
        entry = KeptEntry(entry_id, length, Kept(self.base, page_bytes=self.page_bytes, pages=ids), nbytes)
        self.entries[entry_id] = entry
        return entry

    def keep(self, entry_id: int, state: SeqState, pages) -> KeptEntry:
        """Copy `state` (at its length) into the kept pages `pages` (rank 0's ids) under `entry_id`."""
        parts = self.parts(state, state.length)
        nbytes = sum(p.kept_len for p in parts)
        if nbytes != self.state_bytes(state.length):
            raise ValueError(f"a kept state at {state.length} covers {nbytes} bytes, its layout says "
                             f"{self.state_bytes(state.length)}")
        entry = self.take(entry_id, state.length, nbytes, pages)
        each(parts, entry.kept, self.hook)
        return entry

    def restore(self, entry_id: int, state: SeqState) -> None:
        """Fill a fresh `state` (its pages already hold the entry's positions) from the kept bytes."""
        entry = self.entries[entry_id]
        length, cfg, xp = entry.length, self.cfg, self.ops.xp
        if state.length or len(state.pages) < self.kv.pages_needed(length):
            raise ValueError(f"restore needs a fresh state with {self.kv.pages_needed(length)} pages")
        bf = self.storage.dtype(BF16)
        for layer in indexed_layers(cfg, self.mtp):    # into the state's slot: the leading rows restored, the rest 0
            for a in self.kv.tails.of(state, layer):
                a[...] = 0
        if self.mtp and length:
            state.mtp_pending = xp.empty((cfg.hidden_size,), dtype=bf)
        each(self.parts(state, length), entry.kept, self.hook, restore=True)
        state.length = length

    def drop(self, entry_id: int) -> None:
        entry = self.entries.pop(entry_id)
        self.pool.release(list(entry.kept.pages))
