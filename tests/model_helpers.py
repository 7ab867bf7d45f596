"""Test support (tests/ only, never imported by the package): tensor parallelism simulated with threads in one process,
and small model builders.

ThreadComm has the communicator interface of cupyglm.distributed.comm (rank, size, allreduce_sum in rank order,
allgather, concat_last) so the model code runs unchanged on N simulated shards.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.kv.store import KVStore
from cupyglm.model.glm import GLMModel


class ThreadGroup:
    def __init__(self, size: int):
        self.size = size
        self.slots: list = [None] * size
        self.barrier = threading.Barrier(size, timeout=120)

    def exchange(self, rank: int, value) -> list:
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class ThreadComm:
    def __init__(self, group: ThreadGroup, rank: int):
        self.group, self.rank, self.size = group, rank, group.size

    def allreduce_sum(self, x: np.ndarray) -> np.ndarray:
        parts = self.group.exchange(self.rank, x)
        acc = parts[0]
        for p in parts[1:]:
            acc = acc + p
        return acc

    def allgather(self, x: np.ndarray) -> np.ndarray:
        return np.stack(self.group.exchange(self.rank, x))

    def concat_last(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate(self.group.exchange(self.rank, x), axis=-1)


def build_models(ckpt, tp: int = 1, num_pages: int = 64, page_tokens: int | None = None, mtp: bool = False,
                 poison: bool = True, ops=None) -> list[GLMModel]:
    """One model per simulated rank, each with its own KV store (latent rows are replicated per rank)."""
    ops = ops or NumpyOps()
    group = ThreadGroup(tp)
    cfg = ckpt.config
    pt = page_tokens or cfg.page_tokens
    return [GLMModel(cfg, ckpt.shard(r, tp), ops, ThreadComm(group, r), KVStore(cfg, ops, num_pages, pt, poison),
                     mtp=mtp) for r in range(tp)]


def run_ranks(models: list[GLMModel], fn):
    """fn(rank, model) on every simulated rank at once; returns the per-rank results."""
    if len(models) == 1:
        return [fn(0, models[0])]
    with ThreadPoolExecutor(len(models)) as ex:
        futures = [ex.submit(fn, r, m) for r, m in enumerate(models)]
        return [f.result() for f in futures]


def prefill_and_decode(model: GLMModel, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """Greedy: prompts prefilled together, then decoded together; returns the new token ids per prompt."""
    from cupyglm.model.glm import SeqInput

    states = [model.new_state() for _ in prompts]
    outs = model.forward([SeqInput(np.asarray(p, np.int32), s) for p, s in zip(prompts, states)])
    tokens = [[int(np.argmax(o.logits[-1]))] for o in outs]
    for _ in range(steps - 1):
        outs = model.forward([SeqInput(np.array([t[-1]], np.int32), s, decode=True) for t, s in zip(tokens, states)])
        for t, o in zip(tokens, outs):
            t.append(int(np.argmax(o.logits[-1])))
    for s in states:
        model.release(s)
    return tokens


def bits(a) -> np.ndarray:
    """A float array's bit patterns, for bit-for-bit comparisons."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def prefill_all(model: GLMModel, seqs: list[list[int]]):
    """Prefill sequences together with every row's logits; frees their pages. -> (logits, mtp logits) lists."""
    from cupyglm.model.glm import SeqInput

    states = [model.new_state() for _ in seqs]
    outs = model.forward([SeqInput(np.asarray(s, np.int32), st, all_logits=True) for s, st in zip(seqs, states)])
    for st in states:
        model.release(st)
    return [o.logits for o in outs], [o.mtp_logits for o in outs]


def check_batch_invariant(model: GLMModel, target: list[int], others: list[list[int]], where: int) -> None:
    """target's logits (and MTP logits) alone equal, bit for bit, its row at `where` among others; no page kept."""
    alone, mtp_alone = prefill_all(model, [target])
    together, mtp_together = prefill_all(model, others[:where] + [target] + others[where:])
    assert np.array_equal(bits(alone[0]), bits(together[where]))
    if mtp_alone[0] is not None:
        assert np.array_equal(bits(mtp_alone[0]), bits(mtp_together[where]))
    assert model.kv.pool.free_count == model.kv.pool.num_pages


def tail_fill(cfg, layer: int, length: int) -> int:
    """Leading slots of a layer's index tail in use at `length` (the rest are stale rows, never read)."""
    from cupyglm.kv.kept import written

    return written(cfg, layer, length) % cfg.index_kpool


def snapshot(model: GLMModel, state) -> dict:
    """Everything a sequence has written: latent rows and pooled keys through its pages, and its fixed state."""
    kv, cfg = model.kv, model.cfg
    pos = np.arange(state.length)
    snap = {f"latent{l}": kv.latent[l][kv.rows(state.pages, pos)] for l in cfg.kv_layers}
    snap.update({f"pooled{l}": kv.pooled[l][kv.pool_rows(state.pages, np.arange(state.length // 4))]
                 for l in cfg.dsa_layers})
    snap.update({f"kda{l}": s for l, s in state.kda_state.items()})
    snap.update({f"conv{l}": s for l, s in state.kda_conv.items()})
    snap.update({f"tail{l}": np.concatenate([a[:tail_fill(cfg, l, state.length)] for a in t])
                 for l, t in state.index_tail.items()})
    snap["mtp_pending"] = state.mtp_pending
    return snap


def check_prefill_equals_decode(model: GLMModel, tokens: np.ndarray, splits: list[int]) -> None:
    """Feeding `tokens` in calls of `splits` sizes leaves bit-identical state, KV and last logits as one call."""
    from cupyglm.model.glm import SeqInput

    state = model.new_state()
    at, last = 0, None
    for n in splits:
        last = model.forward([SeqInput(tokens[at:at + n], state)])[0].logits[-1]
        at += n
    snap = snapshot(model, state)
    model.release(state)
    ref_state = model.new_state()
    ref_last = model.forward([SeqInput(tokens, ref_state)])[0].logits[-1]
    ref = snapshot(model, ref_state)
    model.release(ref_state)
    assert np.array_equal(bits(last), bits(ref_last)), "last logits differ"
    assert snap.keys() == ref.keys()
    for k in ref:
        assert np.array_equal(bits(snap[k]), bits(ref[k])), k
    assert not np.isnan(ref_last).any()


def run_engine(engine, prompts, params=None, salt=None, images=None):
    """Run prompts through an engine to the end: ([tokens per prompt], [(cached_tokens, miss reason) per prompt]);
    greedy, 4 tokens, ignore_eos unless `params` gives one SamplingParams per prompt (`images`: one tuple each)."""
    from cupyglm.engine.sampling import SamplingParams

    params = params or [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)] * len(prompts)
    images = images or [()] * len(prompts)
    ids = [engine.add_request(p, sp, cache_salt=salt, images=im) for p, sp, im in zip(prompts, params, images)]
    toks, info = {i: [] for i in ids}, {}
    while engine.has_work():
        for out in engine.step():
            toks[out.request_id] += out.new_token_ids
            if out.finished:
                info[out.request_id] = (out.cached_tokens, out.cache_miss_reason)
    return [toks[i] for i in ids], [info[i] for i in ids]


def random_prompt(n: int, seed: int = 0) -> list[int]:
    """n token ids in 3..399 (clear of the tiny model's specials), fixed by seed."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, 400, size=n)]
