"""The copy oracle: the walk against a naive byte-by-byte copier on 20,000 random plans (paged and fixed parts,
shuffled page ids, one buffer or leased kept pages, both directions, shared prefixes skipped with `from`): the
same (dst, src, n) in the same order."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from cupyglm.kv.walk import Kept, Part, each, kept_bytes

PLANS = 20_000


def naive(parts, kept, restore):
    """Every kept byte's (live, kept) address, then runs cut wherever a part starts or a page ends."""
    live, at, cut = [], [], []
    k = 0
    for p in parts:
        idx = np.arange(p.skipped, p.len, dtype=np.int64)
        if p.span:
            table = np.asarray(p.page, dtype=np.int64)
            live.append(p.live + table[idx // p.span] * p.span + idx % p.span)
            c = idx % p.span == 0
        else:
            live.append(p.live + idx)
            c = np.zeros(idx.size, dtype=bool)
        if idx.size:
            c[0] = True
        kidx = np.arange(k, k + idx.size, dtype=np.int64)
        if kept.page_bytes:
            pages = np.asarray(kept.pages, dtype=np.int64)
            at.append(kept.base + pages[kidx // kept.page_bytes] * kept.page_bytes + kidx % kept.page_bytes)
            c |= kidx % kept.page_bytes == 0
        else:
            at.append(kept.base + kidx)
        cut.append(c)
        k += idx.size
    if not k:
        return []
    live, at, cut = np.concatenate(live), np.concatenate(at), np.concatenate(cut)
    inside = ~cut[1:]                                   # a run must be contiguous on both sides
    assert np.all(np.diff(live)[inside] == 1) and np.all(np.diff(at)[inside] == 1)
    starts = np.flatnonzero(cut)
    sizes = np.diff(np.append(starts, live.size)).tolist()
    dst, src = (live, at) if restore else (at, live)
    return list(zip(dst[starts].tolist(), src[starts].tolist(), sizes))


def random_plan(rng):
    parts = []
    for j in range(int(rng.integers(1, 7))):
        base = (1 << 40) + (j << 32)
        if rng.random() < 0.4:
            parts.append(Part(base, int(rng.integers(0, 300))))
            continue
        span = int(rng.integers(1, 40)) * int(rng.choice([1, 2, 4]))
        npages = int(rng.integers(1, 9))
        length = int(rng.integers(0, npages * span + 1))
        table = tuple(int(x) for x in rng.permutation(64)[:npages])
        start = int(rng.integers(0, npages + 1)) if rng.random() < 0.5 else 0
        parts.append(Part(base, length, span, table, start))
    need = kept_bytes(parts)
    if rng.random() < 0.3:
        kept = Kept(1 << 48, size=need + int(rng.integers(0, 50)))
    else:
        pb = int(rng.integers(1, 200))
        n = -(-need // pb)
        kept = Kept(1 << 48, page_bytes=pb, pages=tuple(int(x) for x in rng.permutation(n + 8)[:n]))
    return parts, kept, bool(rng.random() < 0.5)


def test_walk_matches_naive_copier():
    rng = np.random.default_rng(12)
    h = hashlib.sha256()
    count = total = 0
    for _ in range(PLANS):
        parts, kept, restore = random_plan(rng)
        got = []
        n = each(parts, kept, lambda d, s, b: got.append((d, s, b)), restore=restore)
        want = naive(parts, kept, restore)
        assert got == want
        assert n == kept_bytes(parts) == sum(b for _, _, b in got)
        for t in got:
            h.update(np.asarray(t, dtype="<u8").tobytes())
        count += len(got)
        total += n
    print(f"copy oracle: {PLANS} plans, {count:,} copies, {total:,} bytes, hash {h.hexdigest()[:16]}")
    assert count > PLANS


def test_walk_refuses_short_kept_and_short_table():
    with pytest.raises(ValueError, match="needs 10 bytes"):
        each([Part(0, 10)], Kept(0, size=9), lambda *a: None)
    with pytest.raises(ValueError, match="needs 3 pages"):
        Part(0, 10, 4, (0, 1))
    with pytest.raises(ValueError, match="no pages"):
        Part(0, 10, 0, (1,))


def test_walk_round_trip_bytes():
    """Keep then restore through real memory (ctypes.memmove hook) gives the live bytes back exactly."""
    import ctypes

    rng = np.random.default_rng(3)
    live = rng.integers(0, 256, size=4096, dtype=np.uint8)
    pages = (5, 2, 7)
    parts = [Part(live.ctypes.data, 100), Part(live.ctypes.data + 128, 3 * 64 + 20, 64, pages + (9,)),
             Part(live.ctypes.data, 300, 300, (3,))]
    arena = np.zeros(4096, dtype=np.uint8)
    kept = Kept(arena.ctypes.data, page_bytes=48, pages=tuple(range(40, 0, -1)))
    hook = lambda d, s, n: ctypes.memmove(d, s, n)
    before = live.copy()
    each(parts, kept, hook)
    live[:] = 0
    each(parts, kept, hook, restore=True)
    touched = np.zeros(4096, dtype=bool)
    for p in parts:
        for i in range(p.len):
            a = p.live - live.ctypes.data + (p.page[i // p.span] * p.span + i % p.span if p.span else i)
            touched[a] = True
    assert np.array_equal(live[touched], before[touched]) and not live[~touched].any()
