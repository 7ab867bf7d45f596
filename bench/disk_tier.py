"""The disk tier of the prompt cache on the tiny model (numpy, one rank), two figures side by side:

1. restore bytes/s: loading one kept state from its file (read + checksum + the walk into kept pages) against a
   plain read of the same file's bytes into a buffer (both from the page cache; median of --reps);
2. decode tok/s with spilling on vs off: the same workload (prompts that overflow a small memory cache while other
   requests decode) on the same settings, with and without --prompt-cache-dir; tok/s over the steps whose rows
   are all decode rows, and over every step.

    python bench/disk_tier.py [--tokens 16384] [--reps 7] [--requests 12]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from cupyglm.backend.arithmetic import identity
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.checkpoint.loader import open_model
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.disk_tier import agree_index, planner_from
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams
from cupyglm.kv import disk_file as df
from cupyglm.kv.disk_store import DiskStore, layout
from cupyglm.kv.kept import KeptStore

PT = 16


def _fp():
    return df.state_fingerprint(model="builtin-tiny", backend="numpy", arithmetic=identity("numpy"), tp=1, rank=0,
                                page_tokens=PT, kv_cache="bf16", storage="bf16 in 2 bytes", mtp=False)


def restore_ratio(ckpt, tokens: int, reps: int) -> None:
    cfg, ops = ckpt.config, NumpyOps()
    runner = ModelRunner(ckpt, ops, LocalComm(), 8, PT)
    probe = KeptStore(cfg, ops, runner.kv, 1, 1 << 30)
    kept = KeptStore(cfg, ops, runner.kv, 1, (probe.pages_for(tokens) + 1) * probe.page_bytes)
    lay = layout(cfg, 1, kept.storage, tokens)
    body = np.random.default_rng(0).integers(0, 256, size=sum(n for _, n in lay), dtype=np.uint8)
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 400, size=tokens)]
    with tempfile.TemporaryDirectory() as d:
        salt = df.salt_digest("")
        key = df.state_key(salt, prompt)
        df.write_state(Path(d), df.file_name(_fp(), key, 0), _fp(), salt, prompt, lay, body)
        disk = DiskStore(d, _fp(), kept, 0, 1, print)
        disk.index()
        path = disk.states[key].path
        size = path.stat().st_size
        plain, crc, load = [], [], []
        buf = np.empty(size, dtype=np.uint8)
        for i in range(reps):
            t0 = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                f.readinto(memoryview(buf))
            plain.append(time.perf_counter() - t0)
            zlib.crc32(buf)
            crc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert disk.read(i, key, tokens)
            disk.commit(i, tokens, range(-(-body.size // kept.page_bytes)))
            load.append(time.perf_counter() - t0)
            got = np.empty(body.size, dtype=np.uint8)
            from cupyglm.kv.copy_hooks import address_of
            from cupyglm.kv.walk import Kept, each
            each(disk._arena_parts(kept.entries[i]), Kept(address_of(got), size=got.size), kept.hook)
            assert np.array_equal(got, body)                # byte for byte back
            kept.drop(i)
    p, c, q = statistics.median(plain), statistics.median(crc), statistics.median(load)
    print(f"restore from disk: {tokens} tokens, {body.size:,} body bytes ({size:,} in the file), "
          f"every load checked byte for byte against the body written")
    print(f"  plain file read {size / p / 1e9:.2f} GB/s ({p * 1e3:.2f} ms) | disk restore (read + crc32 + walk) "
          f"{body.size / q / 1e9:.2f} GB/s ({q * 1e3:.2f} ms) | ratio restore/plain {p / q:.2f} "
          f"(plain read + crc32 alone: {c * 1e3:.2f} ms, ratio {p / c:.2f})")


def _engine(ckpt, directory, kept_states):
    cfg, ops = ckpt.config, NumpyOps()
    pages = 96
    runner = ModelRunner(ckpt, ops, LocalComm(), pages, PT)
    probe = KeptStore(cfg, ops, runner.kv, 1, 1 << 30)
    kept = KeptStore(cfg, ops, runner.kv, 1, kept_states * probe.pages_for(70) * probe.page_bytes)
    disk = planner = None
    if directory is not None:
        disk = DiskStore(directory, _fp(), kept, 0, 1, print)
        disk.index()
        agree_index(disk, None)
        planner = planner_from(disk, 1 << 30, kept.state_bytes)
    ecfg = EngineConfig(context=pages * PT // 4, num_pages=pages, page_tokens=PT, keep_grid=cfg.keep_grid,
                        parallel=4, prefill_chunk=cfg.keep_grid, eos_token_ids=cfg.eos_token_ids,
                        vocab_size=cfg.vocab_size)
    return Engine(runner, LocalComm(), ecfg, None, kept=kept, disk=disk, planner=planner)


def decode_run(ckpt, directory, requests: int, kept_states: int):
    eng = _engine(ckpt, directory, kept_states)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(3, 400, size=70)] for _ in range(requests)]
    plans = []
    schedule = eng.scheduler.schedule

    def spy():
        plan = schedule()
        plans.append(plan)
        return plan

    eng.scheduler.schedule = spy
    for p in prompts:
        eng.add_request(p, params)
    times, tokens = [], []
    while eng.has_work():
        n = len(plans)
        t0 = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t0)
        plan = plans[n] if len(plans) > n else None
        decode_only = plan is not None and plan.groups and all(g.decode for g in plan.groups)
        tokens.append((decode_only, plan.rows if plan is not None else 0,
                       sum(g.logits for g in plan.groups) if plan is not None else 0))
    spilled = 0
    if eng.worker.store.disk is not None:
        eng.worker.store.disk.flush()
        spilled = eng.worker.store.disk.stats.files_written
    dec_t = sum(t for t, (d, _, _) in zip(times, tokens) if d)
    dec_n = sum(n for d, _, n in tokens if d)
    all_n = sum(n for _, _, n in tokens)
    return dec_n / dec_t, all_n / sum(times), spilled, eng.scheduler.cache.stats.evictions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3, help="alternating off/on runs (medians)")
    ap.add_argument("--kept-states", type=int, default=3, help="70-token states the memory cache holds")
    a = ap.parse_args()
    ckpt = open_model(None)
    restore_ratio(ckpt, a.tokens, a.reps)
    runs = {"off": [], "on": []}
    for _ in range(a.rounds):                               # alternating, medians: the machine may be shared
        with tempfile.TemporaryDirectory() as d:
            runs["off"].append(decode_run(ckpt, None, a.requests, a.kept_states))
            runs["on"].append(decode_run(ckpt, d, a.requests, a.kept_states))
    off, on = ([statistics.median(r[k] for r in runs[arm]) for k in range(4)] for arm in ("off", "on"))
    print(f"decode, {a.requests} requests of 70 prompt + 24 tokens, 4 streams, memory cache of {a.kept_states} states:")
    print(f"  spilling off: decode-only steps {off[0]:.1f} tok/s, all steps {off[1]:.1f} tok/s, "
          f"{off[3]:.0f} evictions")
    print(f"  spilling on:  decode-only steps {on[0]:.1f} tok/s, all steps {on[1]:.1f} tok/s, "
          f"{on[3]:.0f} evictions, {on[2]:.0f} files written")
    print(f"  ratio on/off: decode-only {on[0] / off[0]:.3f}, all steps {on[1] / off[1]:.3f}")


if __name__ == "__main__":
    main()
