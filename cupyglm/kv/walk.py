"""The one walk every copy of a kept prompt state goes through (keep, restore, spill).

A kept state is a list of parts. A part is one live region:

    fixed   `span == 0`: `len` bytes at address `live`.
    paged   a sequence's rows on pages: live page `page[j]` holds `span` bytes of the part at
            `live + page[j] * span` (the array's page stride), so byte i of the part lives at
            `live + page[i // span] * span + i % span`. The first `from_` pages are skipped: a sharing store
            already holds them, so the kept state stores only bytes `from_ * span .. len`.

The kept bytes of all parts lie back to back, in part order, in a `Kept`: one buffer, or pages leased from a
pool (kept byte k at `base + pages[k // page_bytes] * page_bytes + k % page_bytes`). `each` copies every
part in order, splitting where a live page or a kept page ends, and hands each piece to a backend hook
`hook(dst, src, nbytes)`: addresses are plain integers (host or device), so the walk knows no driver.

What must stay true: the pieces cover each part's kept bytes exactly once, in increasing order, and no piece
crosses a live page end or a kept page end.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

Hook = Callable[[int, int, int], None]


@dataclasses.dataclass(frozen=True)
class Part:
    live: int                              # address of the fixed region, or of the live array's page 0
    len: int                               # bytes of the part (paged: the sequence's bytes, page after page)
    span: int = 0                          # paged: bytes one live page holds of this array; 0 = fixed region
    page: tuple[int, ...] = ()             # paged: the sequence's live page ids
    from_: int = 0                         # paged: first page the kept state stores (earlier: the store's)

    def __post_init__(self) -> None:
        if self.len < 0 or self.span < 0 or self.from_ < 0:
            raise ValueError(f"part lengths must be >= 0 (len {self.len}, span {self.span}, from {self.from_})")
        if self.span == 0:
            if self.page or self.from_:
                raise ValueError("a fixed part (span 0) has no pages and no from")
            return
        if len(self.page) * self.span < self.len:
            raise ValueError(f"a paged part of {self.len} bytes needs {-(-self.len // self.span)} pages of "
                             f"{self.span} bytes, its table has {len(self.page)}")

    @property
    def skipped(self) -> int:
        """Bytes a sharing store already holds (not in the kept state)."""
        return min(self.len, self.from_ * self.span)

    @property
    def kept_len(self) -> int:
        return self.len - self.skipped


@dataclasses.dataclass(frozen=True)
class Kept:
    """Where kept bytes go: one buffer at `base` (page_bytes 0), or leased pages of `page_bytes` each."""
    base: int
    size: int = 0                          # one buffer: its bytes
    page_bytes: int = 0                    # pages: bytes a kept page holds
    pages: tuple[int, ...] = ()            # pages: the leased page ids, in kept-byte order

    @property
    def capacity(self) -> int:
        return len(self.pages) * self.page_bytes if self.page_bytes else self.size

    def at(self, k: int) -> tuple[int, int]:
        """(address of kept byte k, bytes left before its kept page ends)."""
        if not self.page_bytes:
            return self.base + k, self.size - k
        j, off = divmod(k, self.page_bytes)
        return self.base + self.pages[j] * self.page_bytes + off, self.page_bytes - off


def kept_bytes(parts: Sequence[Part]) -> int:
    """Bytes a Kept must hold for `parts`."""
    return sum(p.kept_len for p in parts)


def each(parts: Sequence[Part], kept: Kept, hook: Hook, restore: bool = False) -> int:
    """Copy every part to `kept` (restore: from `kept` back to the live regions); returns the bytes copied."""
    need = kept_bytes(parts)
    if need > kept.capacity:
        raise ValueError(f"the kept state needs {need} bytes, its Kept holds {kept.capacity}")
    k = 0
    for part in parts:
        i = part.skipped
        while i < part.len:
            if part.span:
                j, off = divmod(i, part.span)
                live, live_room = part.live + part.page[j] * part.span + off, part.span - off
            else:
                live, live_room = part.live + i, part.len - i
            at, kept_room = kept.at(k)
            n = min(part.len - i, live_room, kept_room)
            if restore:
                hook(live, at, n)
            else:
                hook(at, live, n)
            i += n
            k += n
    return k
