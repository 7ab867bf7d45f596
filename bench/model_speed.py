"""Prefill and decode tokens/s of a model on one backend (a benchmark, not a test).

    python bench/model_speed.py [--backend numpy] [--prompt-tokens 256] [--decode-tokens 32]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from cupyglm.backend import make_ops, resolve
from cupyglm.checkpoint.loader import open_model
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.runner import ModelRunner
from cupyglm.model.glm import SeqInput


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--backend", default="numpy")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    backend, note = resolve(a.backend)
    ckpt = open_model(a.model)
    cfg = ckpt.config
    pt = cfg.page_tokens
    runner = ModelRunner(ckpt, make_ops(backend), LocalComm(), -(-(a.prompt_tokens + a.decode_tokens) // pt) + 1, pt)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size - 16, a.prompt_tokens).astype(np.int32)
    prefill, decode = [], []
    for _ in range(a.reps):
        st = runner.new_state()
        t0 = time.perf_counter()
        out = runner.forward([SeqInput(prompt, st)])
        t1 = time.perf_counter()
        tok = int(np.argmax(runner.ops.asnumpy(out[0].logits[-1])))
        for _ in range(a.decode_tokens):
            out = runner.forward([SeqInput(np.array([tok], np.int32), st, decode=True)])
            tok = int(np.argmax(runner.ops.asnumpy(out[0].logits[-1])))
        t2 = time.perf_counter()
        runner.release(st)
        prefill.append(a.prompt_tokens / (t1 - t0))
        decode.append(a.decode_tokens / (t2 - t1))
    print(f"{note}; model {ckpt.path.name}")
    print(f"prefill {a.prompt_tokens} tokens: {np.median(prefill):.1f} tok/s (median of {a.reps})")
    print(f"decode {a.decode_tokens} tokens: {np.median(decode):.1f} tok/s "
          f"({1000 / np.median(decode):.1f} ms/token, median of {a.reps})")


if __name__ == "__main__":
    main()
