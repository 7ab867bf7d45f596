"""Engine benchmark on the tiny checkpoint (in-process, TP=1): engine overhead per decode step, decode tokens/s
at several parallel levels, and decode ms per token at several context lengths.

    python bench/engine_bench.py [--levels 1,4,16] [--contexts 128,1024,4096] [--backend numpy] [--json]

Overhead = a step's wall time minus the model's forward (scheduling, the step message encode/decode, page
leases, sampling, detokenization). A benchmark, not a test: numbers depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def make_engine(ckpt, backend: str, parallel: int, context: int):
    from cupyglm.backend import make_ops
    from cupyglm.distributed.comm import LocalComm
    from cupyglm.engine.config import EngineConfig
    from cupyglm.engine.engine import Engine
    from cupyglm.engine.runner import ModelRunner

    c = ckpt.config
    pages = parallel * -(-context // c.page_tokens)
    runner = ModelRunner(ckpt, make_ops(backend), LocalComm(), pages, c.page_tokens)
    cfg = EngineConfig(context=context, num_pages=pages, page_tokens=c.page_tokens, keep_grid=c.keep_grid,
                       parallel=parallel, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size)
    engine = Engine(runner, LocalComm(), cfg, ckpt.tokenizer)
    timer = {"forward": 0.0}
    forward = runner.forward

    def timed(batch):
        t0 = time.perf_counter()
        try:
            return forward(batch)
        finally:
            timer["forward"] += time.perf_counter() - t0

    runner.forward = timed
    return engine, timer


def decode_run(ckpt, backend: str, parallel: int, prompt_len: int, tokens: int, sampled: bool) -> dict:
    from cupyglm.engine.sampling import SamplingParams

    engine, timer = make_engine(ckpt, backend, parallel, prompt_len + tokens + 1)
    rng = np.random.default_rng(0)
    for i in range(parallel):
        sp = SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=tokens, ignore_eos=True) if sampled \
            else SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        engine.add_request(rng.integers(0, 496, prompt_len).tolist(), sp)
    while engine.running < parallel or any(r.prefilling for r in engine.scheduler.running):
        engine.step()                                           # admission and prefill, not timed
    steps, overhead, generated = [], [], 0
    while engine.has_work():
        timer["forward"] = 0.0
        t0 = time.perf_counter()
        outs = engine.step()
        wall = time.perf_counter() - t0
        generated += sum(len(o.new_token_ids) for o in outs)
        if outs:
            steps.append(wall)
            overhead.append(wall - timer["forward"])
    return {"parallel": parallel, "context": prompt_len, "steps": len(steps),
            "step_ms": 1e3 * statistics.median(steps),
            "overhead_ms": 1e3 * statistics.median(overhead),
            "tok_per_s": generated / sum(steps),
            "ms_per_token": 1e3 * sum(steps) / generated}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="engine_bench", description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="numpy")
    p.add_argument("--levels", default="1,4,16", help="parallel levels for tokens/s")
    p.add_argument("--contexts", default="128,1024,4096", help="context lengths for decode ms/token")
    p.add_argument("--tokens", type=int, default=16, help="decode tokens per request")
    p.add_argument("--sampled", action="store_true", help="seeded top-p sampling instead of greedy")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from cupyglm.checkpoint.loader import open_model

    ckpt = open_model(None)
    results = {"throughput": [], "context": []}
    for n in [int(x) for x in args.levels.split(",") if x]:
        r = decode_run(ckpt, args.backend, n, 32, args.tokens, args.sampled)
        results["throughput"].append(r)
        print(f"parallel {n:3d}: {r['tok_per_s']:7.1f} tok/s, step {r['step_ms']:7.2f} ms, engine overhead "
              f"{r['overhead_ms']:.3f} ms/step", file=sys.stderr, flush=True)
    for ctx in [int(x) for x in args.contexts.split(",") if x]:
        t0 = time.perf_counter()
        r = decode_run(ckpt, args.backend, 1, ctx, args.tokens, args.sampled)
        results["context"].append(r)
        print(f"context {ctx:6d}: decode {r['ms_per_token']:7.2f} ms/token (overhead {r['overhead_ms']:.3f} ms; "
              f"run {time.perf_counter() - t0:.0f} s with its prefill)", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
