"""The row cache of KV rows in host memory against the optimal (Belady) cache on a recorded decode trace.

    python bench/row_cache_trace.py [--model tiny|big] [--prompt 1000] [--steps 200] [--backend numpy]

Runs the tiny model (or the ~1B random model of bench/big_random.py, `--model big`) with CUPYGLM_KV_HOST's host
rows (a greedy generation through ModelRunner), records every decode gather's distinct rows per KV layer with
the pool's generation, and prints per layer: the engine's own policy (the cache keeps recent decode gathers'
rows, direct-mapped: row r in entry r % C, forgotten when pages change hands), simulated and measured
(HostRows.take_stats); the cache of the last call's rows alone, two policies that keep rows of several calls
(LRU over rows, a FIFO ring of entries: neither is independent of the kernels' atomics order) and the Belady
hit rate, all at the same cache size and forgetting points; and the bytes a decode token copies across the bus.
"""
from __future__ import annotations

import argparse
import heapq
import time

import numpy as np


def ours(calls, cap: int) -> tuple[int, int]:
    """Hits and accesses of 'keep the last call's rows' (the first `cap` of them), forgotten on a new generation."""
    hits = total = 0
    cache, gen = set(), None
    for g, rows in calls:
        if g != gen:
            cache, gen = set(), g
        cur = [int(r) for r in rows]
        hits += sum(r in cache for r in cur)
        total += len(cur)
        cache = set(cur[:cap])
    return hits, total


def lru(calls, cap: int) -> tuple[int, int]:
    """Keep the `cap` most recently gathered rows across calls (a call's rows all count as used), flushed on a new
    generation."""
    hits = total = 0
    cache, gen = {}, None                        # row -> last call index (insertion order = recency)
    for i, (g, rows) in enumerate(calls):
        if g != gen:
            cache, gen = {}, g
        cur = [int(r) for r in rows]
        hits += sum(r in cache for r in cur)
        total += len(cur)
        for r in cur:
            cache.pop(r, None)
            cache[r] = i
        while len(cache) > cap:
            del cache[next(iter(cache))]
    return hits, total


def ring(calls, cap: int) -> tuple[int, int]:
    """A FIFO ring of `cap` entries: a call's misses take the next entries (evicting their rows), hits stay
    where they are; flushed on a new generation."""
    hits = total = 0
    entries, where, at, gen = [-1] * cap, {}, 0, None
    for g, rows in calls:
        if g != gen:
            entries, where, at, gen = [-1] * cap, {}, 0, g
        cur = [int(r) for r in rows]
        miss = [r for r in cur if r not in where]
        hits += len(cur) - len(miss)
        total += len(cur)
        for r in miss[:cap]:
            old = entries[at]
            if old >= 0:
                del where[old]
            entries[at], where[r] = r, at
            at = (at + 1) % cap
    return hits, total


def direct(calls, cap: int) -> tuple[int, int]:
    """Direct-mapped: row r may only sit in entry r % cap; a call's misses take their entries (the largest row
    of a clash wins), hits stay; flushed on a new generation."""
    hits = total = 0
    entries, gen = {}, None
    for g, rows in calls:
        if g != gen:
            entries, gen = {}, g
        cur = [int(r) for r in rows]
        miss = [r for r in cur if entries.get(r % cap) != r]
        hits += len(cur) - len(miss)
        total += len(cur)
        for r in sorted(miss):
            entries[r % cap] = r
    return hits, total


def belady(calls, cap: int) -> tuple[int, int]:
    """Optimal offline hits at capacity `cap` (evict the row used farthest ahead), flushed on a new generation."""
    hits = total = 0
    groups, cur_gen, cur = [], None, []
    for g, rows in calls:                       # one flush segment per generation
        if g != cur_gen and cur:
            groups.append(cur)
            cur = []
        cur_gen = g
        cur.append([int(r) for r in rows])
    if cur:
        groups.append(cur)
    for seg in groups:
        seq = [r for call in seg for r in call]
        nxt, last = [0] * len(seq), {}
        for i in range(len(seq) - 1, -1, -1):
            nxt[i] = last.get(seq[i], 1 << 60)
            last[seq[i]] = i
        cache, heap = {}, []                    # row -> its next use; max-heap of (-next use, row)
        for i, r in enumerate(seq):
            total += 1
            if r in cache:
                hits += 1
            elif len(cache) >= cap:
                while True:
                    nu, victim = heapq.heappop(heap)
                    if cache.get(victim) == -nu:
                        del cache[victim]
                        break
            cache[r] = nxt[i]
            heapq.heappush(heap, (-nxt[i], r))
    return hits, total


def _checkpoint(model: str):
    if model == "big":
        from big_random import RandomCheckpoint, big_config

        return RandomCheckpoint(big_config()), "~1B random model"
    from cupyglm.checkpoint.loader import Checkpoint
    from cupyglm.checkpoint.tiny import default_tiny_dir

    return Checkpoint.open(default_tiny_dir()), "tiny model"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", choices=("tiny", "big"),
                    help="tiny checkpoint, or the ~1B random model of bench/big_random.py")
    ap.add_argument("--prompt", type=int, default=1000, help="prompt tokens (default 1000)")
    ap.add_argument("--steps", type=int, default=200, help="greedy decode steps (default 200)")
    ap.add_argument("--backend", default="numpy", choices=("numpy", "sim"))
    args = ap.parse_args(argv)

    from cupyglm.backend import make_ops
    from cupyglm.distributed.comm import LocalComm
    from cupyglm.engine.runner import ModelRunner
    from cupyglm.kv.host_rows import CACHED_ROWS, HostRows
    from cupyglm.memory import row_cache_rows
    from cupyglm.model.glm import SeqInput

    ckpt, label = _checkpoint(args.model)
    cfg = ckpt.config
    if args.prompt <= cfg.dense_limit:
        raise SystemExit(f"--prompt {args.prompt} is within the dense limit ({cfg.dense_limit}): no sparse picks")
    trace: dict[int, list] = {l: [] for l in cfg.kv_layers}
    orig = HostRows.gather

    def record(self, layer, rows, counts, which, *rest):
        if rows.shape[0] <= CACHED_ROWS:
            r, c = np.asarray(rows), np.asarray(counts)
            listed = r[np.arange(r.shape[1])[None, :] < c[:, None]]
            _, first = np.unique(listed, return_index=True)
            trace[layer].append((self.pool.generation, listed[np.sort(first)]))
        return orig(self, layer, rows, counts, which, *rest)

    HostRows.gather = record
    pt = cfg.page_tokens
    pages = -(-(args.prompt + args.steps) // pt)
    runner = ModelRunner(ckpt, make_ops(args.backend), LocalComm(), pages, pt, host_slots=pages * pt)
    st = runner.new_state()
    toks = np.random.default_rng(1).integers(3, min(480, cfg.vocab_size), args.prompt).astype(np.int32)
    t0 = time.perf_counter()
    for step in range(args.steps):
        lg = runner.forward([SeqInput(toks, st, decode=step > 0)])[0].logits
        toks = np.array([int(np.argmax(runner.ops.asnumpy(lg[-1])))], np.int32)
    took = time.perf_counter() - t0
    stats = runner.kv.host.take_stats()
    cap = row_cache_rows(cfg)
    print(f"{label}, prompt {args.prompt}, {args.steps} greedy steps ({took:.0f} s), index_topk {cfg.index_topk}, "
          f"row cache {cap} rows a layer, {pt}-token pages, {args.backend}")
    th = tt = 0
    names = ("last call", "direct-mapped", "LRU", "FIFO ring", "Belady")
    for layer, calls in trace.items():
        if not calls:
            continue
        got = [f(calls, cap) for f in (ours, direct, lru, ring, belady)]
        t = got[0][1]
        th, tt = th + got[1][0], tt + t
        rates = ", ".join(f"{n} {h / t:.3f}" for n, (h, _) in zip(names, got))
        moved = " / ".join(f"{(t - h) * cfg.kv_lora_rank * 2 / len(calls):,.0f}" for h, _ in got)
        print(f"layer {layer}: decode gathers {len(calls)}, rows {t}, hit rate: {rates}; bytes/token {moved}")
    print(f"measured (HostRows.take_stats): hits {stats['hits']}, misses {stats['misses']}, hit rate "
          f"{stats['hits'] / max(1, stats['hits'] + stats['misses']):.3f} (simulated direct-mapped {th / max(1, tt):.3f}); "
          f"bytes across the bus per decode token {stats['bytes_per_decode_token']:,.0f} "
          f"(every layer; {cfg.kv_lora_rank * 2} B a row)")
    runner.release(st)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
