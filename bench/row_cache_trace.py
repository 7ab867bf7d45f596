"""The row cache of KV rows in host memory against the optimal (Belady) cache on a recorded decode trace.

    python bench/row_cache_trace.py [--prompt 1000] [--steps 200] [--backend numpy]

Runs the tiny model with CUPYGLM_KV_HOST's host rows (a greedy generation through ModelRunner), records every
decode gather's distinct rows per KV layer with the pool's generation, and prints per layer: the engine's own
policy (the cache holds the last decode gather's rows, forgotten when pages change hands), simulated and
measured (HostRows.take_stats), the Belady hit rate at the same cache size and forgetting points, and the
bytes a decode token copies across the bus.
"""
from __future__ import annotations

import argparse
import heapq

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=1000, help="prompt tokens (default 1000)")
    ap.add_argument("--steps", type=int, default=200, help="greedy decode steps (default 200)")
    ap.add_argument("--backend", default="numpy", choices=("numpy", "sim"))
    args = ap.parse_args(argv)

    from cupyglm.backend import make_ops
    from cupyglm.checkpoint.loader import Checkpoint
    from cupyglm.checkpoint.tiny import default_tiny_dir
    from cupyglm.dist.comm import LocalComm
    from cupyglm.engine.runner import ModelRunner
    from cupyglm.kv.host_rows import CACHED_ROWS, HostRows
    from cupyglm.memory import row_cache_rows
    from cupyglm.model.glm import SeqInput

    ckpt = Checkpoint.open(default_tiny_dir())
    cfg = ckpt.config
    trace: dict[int, list] = {l: [] for l in cfg.kv_layers}
    orig = HostRows.gather

    def record(self, layer, rows, counts, which):
        if rows.shape[0] <= CACHED_ROWS:
            r, c = np.asarray(rows), np.asarray(counts)
            listed = r[np.arange(r.shape[1])[None, :] < c[:, None]]
            _, first = np.unique(listed, return_index=True)
            trace[layer].append((self.pool.generation, listed[np.sort(first)]))
        return orig(self, layer, rows, counts, which)

    HostRows.gather = record
    pt = cfg.page_tokens
    pages = -(-(args.prompt + args.steps) // pt)
    runner = ModelRunner(ckpt, make_ops(args.backend), LocalComm(), pages, pt, host_slots=pages * pt)
    st = runner.new_state()
    toks = np.random.default_rng(1).integers(3, 480, args.prompt).astype(np.int32)
    for _ in range(args.steps):
        lg = runner.forward([SeqInput(toks, st)])[0].logits
        toks = np.array([int(np.argmax(runner.ops.asnumpy(lg[-1])))], np.int32)
    stats = runner.kv.host.take_stats()
    cap = row_cache_rows(cfg)
    print(f"tiny model, prompt {args.prompt}, {args.steps} greedy steps, row cache {cap} rows a layer, "
          f"{pt}-token pages")
    th = tt = 0
    for layer, calls in trace.items():
        if not calls:
            continue
        (h, t), (bh, bt) = ours(calls, cap), belady(calls, cap)
        th, tt = th + h, tt + t
        print(f"layer {layer}: decode gathers {len(calls)}, rows {t}, last-call cache hit rate {h / t:.3f}, "
              f"Belady {bh / bt:.3f} ({bh}/{bt})")
    print(f"measured (HostRows.take_stats): hits {stats['hits']}, misses {stats['misses']}, hit rate "
          f"{stats['hits'] / max(1, stats['hits'] + stats['misses']):.3f} (simulated {th / max(1, tt):.3f}); "
          f"bytes across the bus per decode token {stats['bytes_per_decode_token']:,.0f} "
          f"(every layer; {cfg.kv_lora_rank * 2} B a row)")
    runner.release(st)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
