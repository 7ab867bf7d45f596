"""token_sha and final-logits sha of fixed prompts, greedy, on one backend: a storage or kernel change that
must not change the numbers prints the same lines before and after.

    python bench/token_sha.py --backend numpy [--steps 32] [--model DIR]

One line per (prompt, variant): solo TP=1, solo TP=1 with the MTP head, TP=2 (ranks as threads), and the
three prompts batched together. The long prompt (48 tokens) reaches sparse attention on the tiny model.
"""
from __future__ import annotations

import argparse
import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cupyglm.backend import make_ops, resolve
from cupyglm.checkpoint.loader import open_model
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.runner import ModelRunner
from cupyglm.model.glm import SeqInput
from cupyglm.server.responses import token_sha

PROMPTS = {
    "short": [1, 2, 3],
    "mid": [17, 250, 3, 99, 42, 7, 311, 5, 128, 64, 8, 200, 13],
    "long": [(i * 37 + 11) % 500 for i in range(48)],
}


class _Group:
    def __init__(self, size: int):
        self.size, self.slots, self.barrier = size, [None] * size, threading.Barrier(size, timeout=600)

    def exchange(self, rank: int, value):
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class _ThreadComm:
    """Ranks as threads in one process: the sum and the gather in rank order, as the real comm does."""

    def __init__(self, group: _Group, rank: int):
        self.group, self.rank, self.size = group, rank, group.size

    def allreduce_sum(self, x):
        parts = self.group.exchange(self.rank, x)
        acc = parts[0]
        for p in parts[1:]:
            acc = acc + p
        return acc

    def allgather(self, x):
        return np.stack(self.group.exchange(self.rank, x))

    def concat_last(self, x):
        return np.concatenate(self.group.exchange(self.rank, x), axis=-1)


def _logits_sha(ops, logits) -> str:
    """sha of the float32 bytes (with the MTP head: the main logits' bytes, then the MTP logits' bytes)."""
    parts = logits if isinstance(logits, tuple) else (logits,)
    h = hashlib.sha256()
    for part in parts:
        h.update(np.ascontiguousarray(ops.asnumpy(part), dtype=np.float32).tobytes())
    return h.hexdigest()[:12]


def greedy(runner: ModelRunner, prompts: list[list[int]], steps: int):
    """Prompts prefilled together, then `steps` greedy tokens each, decoded together -> (ids, last logits)."""
    ops = runner.ops
    states = [runner.new_state() for _ in prompts]
    feed = [np.asarray(p, np.int32) for p in prompts]
    ids: list[list[int]] = [[] for _ in prompts]
    last = [None] * len(prompts)
    for step in range(steps):
        outs = runner.forward([SeqInput(f, s, decode=step > 0) for f, s in zip(feed, states)])   # prompt, then decode
        for i, o in enumerate(outs):
            last[i] = o.logits[-1] if o.mtp_logits is None else (o.logits[-1], o.mtp_logits)
            tok = int(np.argmax(ops.asnumpy(o.logits[-1])))
            ids[i].append(tok)
            feed[i] = np.array([tok], np.int32)
    for s in states:
        runner.release(s)
    return ids, last


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="numpy")
    p.add_argument("--model", default=None)
    p.add_argument("--steps", type=int, default=32)
    a = p.parse_args()
    backend, _ = resolve(a.backend)
    ckpt = open_model(a.model)
    cfg = ckpt.config
    pt = cfg.page_tokens
    pages = 3 * (-(-(max(map(len, PROMPTS.values())) + a.steps) // pt) + 1)

    def line(tag, ops, ids, last):
        print(f"{backend} {tag}: token_sha {token_sha(ids)} logits_sha {_logits_sha(ops, last)}", flush=True)

    ops = make_ops(backend)
    for mtp in (False, True):
        runner = ModelRunner(ckpt, ops, LocalComm(), pages, pt, mtp=mtp)
        for name, prompt in PROMPTS.items():
            ids, last = greedy(runner, [prompt], a.steps)
            line(f"{name} tp1{' mtp' if mtp else ''}", ops, ids[0], last[0])
    runner = ModelRunner(ckpt, ops, LocalComm(), pages, pt)
    ids, last = greedy(runner, list(PROMPTS.values()), a.steps)
    for (name, _), i, lg in zip(PROMPTS.items(), ids, last):
        line(f"{name} tp1 batched", ops, i, lg)
    group = _Group(2)

    def rank(r):
        rops = make_ops(backend)
        runner = ModelRunner(ckpt, rops, _ThreadComm(group, r), pages, pt)
        return rops, [greedy(runner, [prompt], a.steps) for prompt in PROMPTS.values()]

    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(rank, range(2)))
    rops, outs = results[0]
    for name, (ids, last) in zip(PROMPTS, outs):
        line(f"{name} tp2", rops, ids[0], last[0])


if __name__ == "__main__":
    main()
