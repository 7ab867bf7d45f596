"""One rank's kept states: the arena (`cupyglm.kv.kept.KeptStore`), the kept prompts' pool pages
(`cupyglm.kv.page_store`, CUPYGLM_KV_SHARE) and the state files (`cupyglm.kv.disk_store.DiskStore`) behind one
object the step message's operations apply against (`cupyglm.engine.ops`); rank 0's decisions about them come
from `cupyglm.engine.prefix_store`, and a keep or a load names the kept pages it takes (no rank allocates them).

What must stay true: two ranks that applied the same messages hold the same kept entries, kept pages and pool
pages, so an operation naming a tier this rank lacks, or kept pages it holds, is refused (StepFormatError), never
skipped.
"""
from __future__ import annotations

import numpy as np

from cupyglm.distributed.step import StepFormatError
from cupyglm.engine.disk_tier import agree
from cupyglm.kv.page_store import NoPages, stop_line


class RankStore:
    def __init__(self, rank: int, kept=None, disk=None, host_comm=None):
        self.rank, self.kept, self.disk, self.host_comm = rank, kept, disk, host_comm
        self.pages = kept.pages if kept is not None else None      # its page store (CUPYGLM_KV_SHARE), or None
        self._pages = self.pages if self.pages is not None else NoPages()
        self.step = -1

    @property
    def pages_held(self) -> int | None:
        """KV pages this rank's kept prompts hold; None without a page store."""
        return None if self.pages is None else self.pages.held

    @property
    def disk_stats(self):
        """The state files' totals; None without a disk tier."""
        return None if self.disk is None else self.disk.stats

    def stop_line(self) -> str | None:
        """The page store's line at the stop (what it still holds); None without one."""
        return None if self.pages is None else stop_line(self.rank, self.pages)

    def begin(self, step: int) -> None:
        """A new step message (named in refusals)."""
        self.step = step

    def _arena(self):
        if self.kept is None:
            raise StepFormatError(f"rank {self.rank}: step {self.step} uses the prompt cache, this rank has none")
        return self.kept

    def _files(self):
        if self.disk is None:
            raise StepFormatError(f"rank {self.rank}: step {self.step} uses the disk tier, this rank has none")
        return self.disk

    # ---- memory and pool pages -----------------------------------------------------------------------------------
    def lend(self, entry_id: int) -> list[int]:
        """The entry's shared pool pages for a sequence restored from it (the leading ids of its table)."""
        self._arena()
        return self._pages.lend(entry_id)

    def restore(self, entry_id: int, state) -> None:
        """The kept bytes into `state` (its whole table already held)."""
        self._arena().restore(entry_id, state)

    def keep(self, entry_id: int, state, tokens: tuple[int, ...], kept_pages) -> None:
        """`state` kept under a new entry: its bytes copied into the kept pages rank 0 named, its whole pages
        before the keep point held, and with a disk tier its tokens noted (a later spill writes them into the
        file's header)."""
        arena = self._arena()
        try:
            arena.keep(entry_id, state, kept_pages)
        except ValueError as err:
            raise StepFormatError(f"rank {self.rank}: step {self.step} keeps entry {entry_id}: {err}") from None
        self._pages.hold(entry_id, state.pages[:arena.shared_pages(state.length)])
        if self.disk is not None:
            self.disk.tokens_of[entry_id] = tokens

    def drop(self, entry_id: int) -> None:
        """Let go of an entry in every tier of this rank's memory."""
        self._arena().drop(entry_id)
        self._pages.drop(entry_id)
        if self.disk is not None:
            self.disk.tokens_of.pop(entry_id, None)

    # ---- disk ------------------------------------------------------------------------------------------------------
    def spill(self, entry_id: int, key: bytes, salt: bytes) -> None:
        disk = self._files()
        if entry_id in self._arena().entries:
            disk.spill(entry_id, key.hex(), salt.hex())

    def load(self, entries) -> dict[int, bool]:
        """Read each (entry, length, key, kept pages) into a new kept entry on those pages; entry -> every rank
        read it (a collective: the entries are committed only where every rank's read succeeded, else
        discarded)."""
        disk = self._files()
        oks = np.array([disk.read(eid, key.hex(), length) for eid, length, key, _ in entries], dtype=np.uint8)
        every = agree(self.host_comm, oks)
        out = {}
        for (eid, length, _, pages), ok in zip(entries, every):
            if ok:
                try:
                    disk.commit(eid, length, pages)
                except ValueError as err:
                    raise StepFormatError(f"rank {self.rank}: step {self.step} loads entry {eid}: {err}") from None
            else:
                disk.discard(eid)
            out[eid] = bool(ok)
        return out

    def unlink(self, key: bytes) -> None:
        self._files().unlink(key.hex())

    def clear(self) -> None:
        self._files().clear()

    def sync(self) -> bool:
        """Every queued write finished; whether every rank's writes succeeded (a collective)."""
        disk = self._files()
        disk.flush()
        return bool(agree(self.host_comm, np.array([disk.failed is None], dtype=np.uint8))[0])
