"""Restore speed of a kept prompt state against a plain memcpy of the same bytes, on this machine.

    python bench/kept_copy.py [--tokens 4000] [--tp 1] [--reps 20] [--host-cache]

A state of the tiny model at `--tokens` positions on shuffled pages (numpy backend): its bytes, the walk's
pieces, the restore time (every piece through the backend hook) and one memmove of the same byte count.
Prints one SUMMARY line.
"""
from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np


def measure(tokens: int, tp: int, reps: int, host: bool) -> dict:
    from cupyglm.backend.numpy_ops import NumpyOps
    from cupyglm.config import preset
    from cupyglm.kv.kept import KeptStore, indexed_layers, kept_state_bytes
    from cupyglm.kv.state import SeqState
    from cupyglm.kv.store import KVStore
    from cupyglm.kv.walk import each
    from cupyglm.memory import alloc, kda_state_arrays, kv_arrays, storage_of, total_bytes

    cfg, ops = preset("tiny"), NumpyOps()
    st = storage_of(ops)
    kv = KVStore(cfg, ops, kv_pages := -(-tokens // cfg.page_tokens) + 1, cfg.page_tokens)
    src = SeqState(length=tokens)
    kv.ensure(src.pages, tokens)
    src.pages[:] = [int(p) for p in np.random.default_rng(0).permutation(src.pages)]
    for layer in cfg.kda_layers:
        src.kda_state[layer], src.kda_conv[layer] = (alloc(np, a, st) for a in kda_state_arrays(cfg, tp, layer))
    for layer in indexed_layers(cfg, False):
        src.index_tail[layer] = tuple(np.zeros((cfg.index_kpool, cfg.index_head_dim), st.bf16)
                                      for _ in range(2))
    page = total_bytes(kv_arrays(cfg, 1, cfg.page_tokens), st)
    kept = KeptStore(cfg, ops, kv, tp, kept_state_bytes(cfg, tp, st, cfg.page_tokens, tokens) + page, host=host)
    entry = kept.keep(0, src, range(kept.pages_for(src.length)))
    pieces = []
    each(kept.parts(src, tokens), entry.kept, lambda d, s, n: pieces.append(n))

    def restore() -> None:
        dst = SeqState(pages=list(src.pages))
        dst.kda_state, dst.kda_conv = dict(src.kda_state), dict(src.kda_conv)
        kept.restore(0, dst)

    restore()
    t = time.perf_counter()
    for _ in range(reps):
        restore()
    t_restore = (time.perf_counter() - t) / reps
    a, b = np.ones(entry.nbytes, np.uint8), np.zeros(entry.nbytes, np.uint8)
    t = time.perf_counter()
    for _ in range(reps):
        ctypes.memmove(b.ctypes.data, a.ctypes.data, entry.nbytes)
    t_copy = (time.perf_counter() - t) / reps
    return dict(tokens=tokens, nbytes=entry.nbytes, pieces=len(pieces), restore_s=t_restore, memcpy_s=t_copy)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4000)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--host-cache", action="store_true", help="the kept state in the separate host arena")
    a = p.parse_args(argv)
    r = measure(a.tokens, a.tp, a.reps, a.host_cache)
    gbs = lambda s: r["nbytes"] / s / 1e9  # noqa: E731
    print(f"SUMMARY kept_copy: {r['tokens']} tokens, {r['nbytes']:,} bytes in {r['pieces']} pieces; restore "
          f"{gbs(r['restore_s']):.2f} GB/s ({r['restore_s'] * 1e3:.3f} ms), memcpy {gbs(r['memcpy_s']):.2f} GB/s "
          f"({r['memcpy_s'] * 1e3:.3f} ms), restore/memcpy {r['memcpy_s'] / r['restore_s']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
