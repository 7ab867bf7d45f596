"""GPU checks of the whole model (launch/gpu-check runs these; any backend works, numpy for a dry run).

    python bench/gpu_tokens.py tokens     --backend cuda [--ref numpy] [--prompts 3] [--tokens 32] [--graphs both]
    python bench/gpu_tokens.py invariance --backend cuda [--max-batch 16]
    python bench/gpu_tokens.py speed      --backend cuda --model tiny|big|small [--quant bf16 nvfp4] [--graphs both]
                                          [--prompt-tokens 256] [--decode-tokens 32] [--batch 1 4 16]

`tokens`: greedy tokens of 3 prompts on the backend (eager, CUDA graphs, or both) and on the reference;
identical tokens required, and the largest logit difference over the steps where both ran the same tokens.
`invariance`: one row's GEMM output on the backend is bit-identical for batch sizes 1..max (and equals tc_rows).
`speed`: prefill and decode tokens/s (tiny checkpoint, or the ~1B random model of bench/big_random.py, built
once per weight format and memoized on disk), then decode of `--batch` sequences together, one runner per
graphs mode reused for every batch size. --graphs default: CUPYGLM_CUDA_GRAPHS.
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
from cupyglm.backend.lanes import bf16  # noqa: E402
from cupyglm.backend.tc_order import tc_rows  # noqa: E402
from cupyglm.checkpoint.loader import open_model  # noqa: E402
from cupyglm.distributed.comm import LocalComm  # noqa: E402
from cupyglm.engine.build import cuda_graphs  # noqa: E402
from cupyglm.engine.runner import ModelRunner  # noqa: E402
from cupyglm.model.glm import SeqInput  # noqa: E402


def _runner(ckpt, backend: str, tokens: int, seqs: int = 1, graphs: bool = False) -> ModelRunner:
    cfg = ckpt.config
    pt = cfg.page_tokens
    return ModelRunner(ckpt, make_ops(resolve(backend)[0]), LocalComm(), seqs * (-(-tokens // pt) + 2), pt,
                       graphs=graphs)


def _modes(a) -> list[bool]:
    """The graphs modes asked for: off, on or both (default: CUPYGLM_CUDA_GRAPHS on this backend)."""
    if a.graphs is None:
        return [cuda_graphs(resolve(a.backend)[0])]
    return {"off": [False], "on": [True], "both": [False, True]}[a.graphs]


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
    ref = _runner(ckpt, a.ref, total)
    wants = [_greedy(ref, p, a.tokens) for p in prompts]
    ok, worst, modes = True, 0.0, _modes(a)
    for graphs in modes:
        run, label = _runner(ckpt, a.backend, total, graphs=graphs), f"{a.backend}{' graphs' if graphs else ''}"
        for i, (p, (want, wlog)) in enumerate(zip(prompts, wants)):
            t0 = time.perf_counter()
            got, glog = _greedy(run, p, a.tokens)
            t1 = time.perf_counter()
            same = 0
            while same < len(got) and got[same] == want[same]:
                same += 1
            diff = max(float(np.max(np.abs(g - w))) for g, w in zip(glog[: same + 1], wlog[: same + 1]))
            worst = max(worst, diff)
            ok &= got == want
            print(f"{label} prompt {i} ({len(p)} tokens): {'identical' if got == want else f'DIFFER at step {same}'} "
                  f"{a.tokens} tokens, max |logit diff| {diff:.3g} ({t1 - t0:.2f}s)")
            print(f"  {label}: {got}")
            if got != want:
                print(f"  {a.ref}: {want}")
        del run
    names = "+".join("graphs" if g else "eager" for g in modes)
    print(f"RESULT tokens {'ok' if ok else 'FAIL'} {a.backend} ({names}) vs {a.ref}: {a.prompts} prompts x {a.tokens} "
          f"tokens {'identical' if ok else 'differ'}, max |logit diff| {worst:.3g}")
    return ok


def cmd_invariance(a) -> bool:
    ops = make_ops(resolve(a.backend)[0])
    rng = np.random.default_rng(5)
    ok = True
    for k, n in ((256, 256), (1024, 96), (4096, 64)):
        x = bf16(rng.standard_normal((a.max_batch, k)).astype(np.float32))
        w = bf16((rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32))
        want = tc_rows(x[:1], w)[0].view(np.uint32)
        wd = ops.weight(w)
        bad = []
        for m in range(1, a.max_batch + 1):
            row = np.asarray(ops.asnumpy(ops.gemm(ops.weight(x[:m]), wd))[0], np.float32).view(np.uint32)
            if not np.array_equal(row, want):
                bad.append(m)
        ok &= not bad
        print(f"K={k} N={n}: row 0 for batch sizes 1..{a.max_batch}: "
              f"{'bit-identical, equal to tc_rows' if not bad else f'DIFFERS at batch sizes {bad}'}")
    print(f"RESULT invariance {'ok' if ok else 'FAIL'} {a.backend}")
    return ok


def _batched_decode(runner: ModelRunner, a, batch: int, quant: str | None, label: str) -> float:
    """Decode tok/s of `batch` sequences stepping together, against the HBM roofline of bench/roofline.py (the
    bytes one step must read: weights once, KV and state per sequence) at a.hbm_gbs."""
    try:
        from bench.roofline import step_bytes
    except ImportError:                                   # roofline.py without the byte count: times alone
        step_bytes = None
    cfg = runner.cfg
    prompt = np.random.default_rng(1).integers(3, cfg.vocab_size - 16, a.prompt_tokens).astype(np.int32)
    sync = getattr(runner.ops, "cupy", None)
    states = [runner.new_state() for _ in range(batch)]
    outs = runner.forward([SeqInput(prompt, st) for st in states])
    toks = [int(np.argmax(runner.ops.asnumpy(o.logits[-1]))) for o in outs]
    steps = max(a.decode_tokens, 2)
    for i in range(steps + 1):                            # step 0 warms up this batch size (and captures)
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
    line = f"decode {label} batch {batch}: {batch / dt:.1f} tok/s ({1000 * dt:.2f} ms a step)"
    if step_bytes is not None:
        roof = sum(step_bytes(cfg, 1, batch, a.prompt_tokens + a.decode_tokens, quant).values()) / (a.hbm_gbs * 1e9)
        line += (f"; HBM roofline {1e6 * roof:.1f} us a step ({batch / roof:,.0f} tok/s) at {a.hbm_gbs:.0f} GB/s: "
                 f"{roof / dt:.1%} of it")
    print(line)
    return batch / dt


def _checkpoint(a, quant: str | None):
    if a.model == "tiny":
        from cupyglm.checkpoint.tiny import default_tiny_dir
        return open_model(default_tiny_dir(quant=quant) if quant else None)
    cfg = big_config(a.model)
    t0 = time.perf_counter()
    ckpt = RandomCheckpoint(cfg, quant=quant)
    made = ckpt.build()
    print(f"random model {a.model}: {param_count(cfg) / 1e9:.3f}B parameters, weights {quant or 'bf16'}: "
          f"{made} tensors generated, the others memoized ({time.perf_counter() - t0:.1f}s)")
    return ckpt


def _single(runner: ModelRunner, a) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of one sequence, medians of a.reps after one warm-up rep."""
    cfg = runner.cfg
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
    return float(np.median(pre)), float(np.median(dec))


def cmd_speed(a) -> bool:
    seqs = max([1, *a.batch])
    summary = []
    for q in a.quant:
        quant = None if q == "bf16" else q
        ckpt = _checkpoint(a, quant)
        for graphs in _modes(a):
            label = f"{a.model} {q} graphs={'on' if graphs else 'off'}"
            t0 = time.perf_counter()
            runner = _runner(ckpt, a.backend, a.prompt_tokens + a.decode_tokens, seqs, graphs)
            print(f"{label}: load {time.perf_counter() - t0:.1f}s")
            p, d = _single(runner, a)
            print(f"{label}: prefill {a.prompt_tokens} tokens {p:.1f} tok/s "
                  f"(TTFT {1000 * a.prompt_tokens / p:.0f} ms), "
                  f"decode {d:.1f} tok/s ({1000 / d:.1f} ms/token), median of {a.reps}")
            rates = [_batched_decode(runner, a, b, quant, label) for b in a.batch]
            summary.append(f"{q}/{'graphs' if graphs else 'eager'} " + "/".join(f"{r:.0f}" for r in rates or [d]))
            del runner
    print(f"RESULT speed ok {a.model} {a.backend} decode tok/s at batch {'/'.join(map(str, a.batch or [1]))}: "
          + ", ".join(summary))
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokens")
    t.add_argument("--backend", default="cuda")
    t.add_argument("--ref", default="numpy")
    t.add_argument("--prompts", type=int, default=3)
    t.add_argument("--tokens", type=int, default=32)
    t.add_argument("--graphs", choices=("off", "on", "both"), default=None)
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
    s.add_argument("--quant", choices=("bf16", "fp8", "nvfp4"), nargs="+", default=["bf16"],
                   help="weight formats, one model each")
    s.add_argument("--graphs", choices=("off", "on", "both"), default=None)
    s.add_argument("--hbm-gbs", type=float, default=4800.0, help="HBM bandwidth of the roofline (H200: 4,800)")
    a = ap.parse_args(argv)
    ok = {"tokens": cmd_tokens, "invariance": cmd_invariance, "speed": cmd_speed}[a.cmd](a)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
