"""GPU checks of the whole model (launch/gpu-check runs these; any backend works, numpy for a dry run).

    python bench/gpu_tokens.py tokens     --backend cuda [--ref numpy] [--prompts 3] [--tokens 32]
    python bench/gpu_tokens.py invariance --backend cuda [--max-batch 16]
    python bench/gpu_tokens.py speed      --backend cuda --model tiny|big|small [--prompt-tokens 256] [--decode-tokens 32]

`tokens`: greedy tokens of 3 prompts on the backend and on the reference; identical tokens required, and the
largest logit difference over the steps where both ran the same tokens is reported.
`invariance`: one row's GEMM output on the backend is bit-identical for batch sizes 1..max (and equals lanes.gemm).
`speed`: prefill and decode tokens/s (tiny checkpoint, or the ~1B random model of bench/big_random.py).
Each prints one `RESULT <name> ok|FAIL ...` line last; exit status 0 only when ok.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.big_random import RandomCheckpoint, big_config, param_count  # noqa: E402
from cupyglm.backend import make_ops, resolve  # noqa: E402
from cupyglm.backend.lanes import bf16, gemm as lanes_gemm  # noqa: E402
from cupyglm.checkpoint.loader import open_model  # noqa: E402
from cupyglm.dist.comm import LocalComm  # noqa: E402
from cupyglm.engine.build import cuda_graphs  # noqa: E402
from cupyglm.engine.runner import ModelRunner  # noqa: E402
from cupyglm.model.glm import SeqInput  # noqa: E402


def _runner(ckpt, backend: str, tokens: int, seqs: int = 1) -> ModelRunner:
    cfg = ckpt.config
    pt = cfg.page_tokens
    name = resolve(backend)[0]
    return ModelRunner(ckpt, make_ops(name), LocalComm(), seqs * (-(-tokens // pt) + 2), pt,
                       graphs=cuda_graphs(name))              # CUPYGLM_CUDA_GRAPHS=1: decode layers replayed


def _greedy(runner: ModelRunner, prompt: np.ndarray, n: int):
    """(tokens, last-position logits of every step as host float32 arrays)."""
    st = runner.new_state()
    toks, logits = [], []
    try:
        feed = prompt
        for step in range(n):                   # the prompt, then decode rows
            lg = np.asarray(runner.ops.asnumpy(runner.forward([SeqInput(feed, st, decode=step > 0)])[0].logits[-1]),
                            np.float32)
            tok = int(np.argmax(lg))
            toks.append(tok)
            logits.append(lg)
            feed = np.array([tok], np.int32)
    finally:
        runner.release(st)
    return toks, logits


def cmd_tokens(a) -> bool:
    ckpt = open_model(None)
    vocab = ckpt.config.vocab_size
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, vocab - 16, size=L).astype(np.int32) for L in (5, 23, 47)][: a.prompts]
    total = max(len(p) for p in prompts) + a.tokens
    run, ref = _runner(ckpt, a.backend, total), _runner(ckpt, a.ref, total)
    ok, worst = True, 0.0
    for i, p in enumerate(prompts):
        t0 = time.perf_counter()
        got, glog = _greedy(run, p, a.tokens)
        t1 = time.perf_counter()
        want, wlog = _greedy(ref, p, a.tokens)
        same = 0
        while same < len(got) and got[same] == want[same]:
            same += 1
        diff = max(float(np.max(np.abs(g - w))) for g, w in zip(glog[: same + 1], wlog[: same + 1]))
        worst = max(worst, diff)
        ok &= got == want
        print(f"prompt {i} ({len(p)} tokens): {'identical' if got == want else f'DIFFER at step {same}'} "
              f"{a.tokens} tokens, max |logit diff| {diff:.3g} ({a.backend} {t1 - t0:.2f}s)")
        print(f"  {a.backend}: {got}")
        if got != want:
            print(f"  {a.ref}: {want}")
    print(f"RESULT tokens {'ok' if ok else 'FAIL'} {a.backend} vs {a.ref}: {a.prompts} prompts x {a.tokens} tokens "
          f"{'identical' if ok else 'differ'}, max |logit diff| {worst:.3g}")
    return ok


def cmd_invariance(a) -> bool:
    ops = make_ops(resolve(a.backend)[0])
    rng = np.random.default_rng(5)
    ok = True
    for k, n in ((256, 256), (1024, 96), (4096, 64)):
        x = bf16(rng.standard_normal((a.max_batch, k)).astype(np.float32))
        w = bf16((rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32))
        want = lanes_gemm(x[:1], w)[0].view(np.uint32)
        wd = ops.weight(w)
        bad = []
        for m in range(1, a.max_batch + 1):
            row = np.asarray(ops.asnumpy(ops.gemm(ops.weight(x[:m]), wd))[0], np.float32).view(np.uint32)
            if not np.array_equal(row, want):
                bad.append(m)
        ok &= not bad
        print(f"K={k} N={n}: row 0 for batch sizes 1..{a.max_batch}: "
              f"{'bit-identical, equal to lanes.gemm' if not bad else f'DIFFERS at batch sizes {bad}'}")
    print(f"RESULT invariance {'ok' if ok else 'FAIL'} {a.backend}")
    return ok


def _batched_decode(ckpt, a, batch: int, runner=None) -> None:
    """Decode tok/s of `batch` sequences stepping together, against the HBM roofline of bench/roofline.py (the
    bytes one step must read: weights once, KV and state per sequence) at a.hbm_gbs."""
    from bench.roofline import step_bytes

    cfg = ckpt.config
    runner = runner or _runner(ckpt, a.backend, a.prompt_tokens + a.decode_tokens, batch)
    prompt = np.random.default_rng(1).integers(3, cfg.vocab_size - 16, a.prompt_tokens).astype(np.int32)
    sync = getattr(runner.ops, "cupy", None)
    states = [runner.new_state() for _ in range(batch)]
    outs = runner.forward([SeqInput(prompt, st) for st in states])
    toks = [int(np.argmax(runner.ops.asnumpy(o.logits[-1]))) for o in outs]
    steps = max(a.decode_tokens, 2)
    for i in range(steps + 1):                            # step 0 warms up this batch size
        if i == 1:
            if sync is not None:
                sync.cuda.Device().synchronize()
            t0 = time.perf_counter()
        outs = runner.forward([SeqInput(np.array([t], np.int32), st, decode=True) for t, st in zip(toks, states)],
                              check=False)
        logits = runner.ops.asnumpy_checked(runner.ops.xp.stack([o.logits[-1] for o in outs]))
        toks = [int(t) for t in np.argmax(logits, axis=1)]
    if sync is not None:
        sync.cuda.Device().synchronize()
    dt = (time.perf_counter() - t0) / steps
    for st in states:
        runner.release(st)
    quant = getattr(a, "quant", None)
    roof = sum(step_bytes(cfg, 1, batch, a.prompt_tokens + a.decode_tokens, quant).values()) / (a.hbm_gbs * 1e9)
    print(f"decode batch {batch}: {batch / dt:.1f} tok/s ({1000 * dt:.2f} ms a step); HBM roofline "
          f"{1e6 * roof:.1f} us a step ({batch / roof:,.0f} tok/s) at {a.hbm_gbs:.0f} GB/s: {roof / dt:.1%} of it")


def cmd_speed(a) -> bool:
    if a.model == "tiny":
        from cupyglm.checkpoint.tiny import default_tiny_dir
        ckpt = open_model(default_tiny_dir(quant=a.quant) if a.quant else None)
    else:
        cfg = big_config(a.model)
        t0 = time.perf_counter()
        ckpt = RandomCheckpoint(cfg, quant=a.quant)
        print(f"random model {a.model}: {param_count(cfg) / 1e9:.3f}B parameters, weights {a.quant or 'bf16'}")
    cfg = ckpt.config
    t0 = time.perf_counter()
    runner = _runner(ckpt, a.backend, a.prompt_tokens + a.decode_tokens)
    print(f"load {time.perf_counter() - t0:.1f}s")
    prompt = np.random.default_rng(0).integers(3, cfg.vocab_size - 16, a.prompt_tokens).astype(np.int32)
    sync = getattr(runner.ops, "cupy", None)
    pre, dec = [], []
    for rep in range(a.reps + 1):                         # rep 0 warms up (compiles, allocates)
        st = runner.new_state()
        t0 = time.perf_counter()
        out = runner.forward([SeqInput(prompt, st)])
        tok = int(np.argmax(runner.ops.asnumpy(out[0].logits[-1])))
        t1 = time.perf_counter()
        for _ in range(a.decode_tokens):
            out = runner.forward([SeqInput(np.array([tok], np.int32), st, decode=True)])
            tok = int(np.argmax(runner.ops.asnumpy(out[0].logits[-1])))
        if sync is not None:
            sync.cuda.Device().synchronize()
        t2 = time.perf_counter()
        runner.release(st)
        if rep:
            pre.append(a.prompt_tokens / (t1 - t0))
            dec.append(a.decode_tokens / (t2 - t1))
    p, d = float(np.median(pre)), float(np.median(dec))
    for b in a.batch:
        _batched_decode(ckpt, a, b, runner if b == 1 else None)
    print(f"RESULT speed ok {a.model} {a.quant or 'bf16'} {a.backend}: prefill {a.prompt_tokens} tokens {p:.1f} tok/s (TTFT "
          f"{1000 * a.prompt_tokens / p:.0f} ms), decode {d:.1f} tok/s ({1000 / d:.1f} ms/token), median of {a.reps}")
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokens")
    t.add_argument("--backend", default="cuda")
    t.add_argument("--ref", default="numpy")
    t.add_argument("--prompts", type=int, default=3)
    t.add_argument("--tokens", type=int, default=32)
    i = sub.add_parser("invariance")
    i.add_argument("--backend", default="cuda")
    i.add_argument("--max-batch", type=int, default=16)
    s = sub.add_parser("speed")
    s.add_argument("--backend", default="cuda")
    s.add_argument("--model", choices=("tiny", "big", "small"), default="tiny")
    s.add_argument("--prompt-tokens", type=int, default=256)
    s.add_argument("--decode-tokens", type=int, default=32)
    s.add_argument("--reps", type=int, default=2)
    s.add_argument("--batch", type=int, nargs="*", default=[], help="also decode this many sequences together")
    s.add_argument("--quant", choices=("fp8", "nvfp4"), default=None, help="quantised weights (default bf16)")
    s.add_argument("--hbm-gbs", type=float, default=4800.0, help="HBM bandwidth of the roofline (H200: 4,800)")
    a = ap.parse_args(argv)
    ok = {"tokens": cmd_tokens, "invariance": cmd_invariance, "speed": cmd_speed}[a.cmd](a)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
