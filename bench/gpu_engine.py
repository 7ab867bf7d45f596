"""Engine checks of a backend (launch/gpu-check runs these; numpy works for a dry run).

    python bench/gpu_engine.py concurrent --backend cuda [--ref numpy]
    python bench/gpu_engine.py tp --backend cuda [--ref numpy] [--tp N]

`concurrent`: the tiny model's engine with 4 concurrent mixed-sampling requests (greedy, top-p, top-k, min-p):
each request's tokens equal to it run alone, and to the reference backend's engine.
`tp`: `mpirun -n N cupyglm-generate --backend B` (N = 1: no mpirun, one rank through the engine) against the
same on the reference backend; identical output text required. --tp 0: 2 when the machine has 2 GPUs, else 1.
Each prints one `RESULT <name> ok|FAIL ...` line last; exit status 0 only when ok.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

LENGTHS = (5, 40, 12, 20)


def _params():
    from cupyglm.engine.sampling import SamplingParams

    return [SamplingParams(temperature=0, max_tokens=8),
            SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=8),
            SamplingParams(temperature=1.0, top_k=20, seed=5, max_tokens=8),
            SamplingParams(temperature=0.7, min_p=0.1, seed=9, max_tokens=8)]


def _engine(ckpt, backend: str):
    from cupyglm.backend import make_ops, resolve
    from cupyglm.distributed.comm import LocalComm
    from cupyglm.engine.config import EngineConfig
    from cupyglm.engine.engine import Engine
    from cupyglm.engine.runner import ModelRunner

    c = ckpt.config
    runner = ModelRunner(ckpt, make_ops(resolve(backend)[0]), LocalComm(), 32, 16)
    cfg = EngineConfig(context=128, num_pages=32, page_tokens=16, keep_grid=c.keep_grid, parallel=4, seed=0,
                       eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def _run(engine, prompts, params):
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    got = {i: [] for i in ids}
    most = 0
    while engine.has_work():
        most = max(most, engine.running)
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
    return [got[i] for i in ids], most


def concurrent(a) -> bool:
    from cupyglm.checkpoint.loader import open_model

    ckpt = open_model(None)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, ckpt.config.vocab_size - 16, n).tolist() for n in LENGTHS]
    t0 = time.perf_counter()
    together, most = _run(_engine(ckpt, a.backend), prompts, _params())
    eng = _engine(ckpt, a.backend)
    alone = [_run(eng, [p], [sp])[0][0] for p, sp in zip(prompts, _params())]
    ref, _ = _run(_engine(ckpt, a.ref), prompts, _params())
    for i, (t, s, r) in enumerate(zip(together, alone, ref)):
        print(f"request {i}: concurrent {t} solo {s} {a.ref} {r}")
    ok = together == alone == ref and most == 4
    print(f"RESULT engine {'ok' if ok else 'FAIL'} {a.backend}: 4 concurrent = solo = {a.ref} "
          f"({sum(map(len, together))} tokens, {time.perf_counter() - t0:.1f}s)")
    return ok


def _gpus() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no cupy or no driver: no GPU
        return 0


def _generate(backend: str, n: int) -> subprocess.CompletedProcess:
    gen = [sys.executable, "-m", "cupyglm.cli.generate", "--backend", backend, "--kv-pages", "64",
           "--prompt", "def fib(n):", "--max-tokens", "16"]
    mpirun = Path(sys.executable).parent / "mpirun"
    argv = gen if n == 1 else [str(mpirun), "-n", str(n), *gen]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def tp(a) -> bool:
    n = a.tp or (2 if _gpus() >= 2 else 1)
    t0 = time.perf_counter()
    runs = {b: _generate(b, n) for b in (a.backend, a.ref)}
    for b, r in runs.items():
        print(f"--- {b} (rc {r.returncode}) stdout: {r.stdout!r}\n{r.stderr[-2000:]}")
    ok = all(r.returncode == 0 for r in runs.values()) and runs[a.backend].stdout == runs[a.ref].stdout \
        and bool(runs[a.ref].stdout.strip())
    comm = "NCCL" if n > 1 and a.backend == "cuda" else "one rank, through the engine" if n == 1 else "MPI"
    print(f"RESULT tp {'ok' if ok else 'FAIL'} {a.backend} TP={n} ({comm}) = {a.ref} TP={n} "
          f"({time.perf_counter() - t0:.1f}s)")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("check", choices=("concurrent", "tp"))
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--ref", default="numpy")
    ap.add_argument("--tp", type=int, default=0)
    a = ap.parse_args(argv)
    return 0 if (concurrent if a.check == "concurrent" else tp)(a) else 1


if __name__ == "__main__":
    sys.exit(main())
