"""The tiny model on the `cuda` backend's code path (CudaOps, xp = cupy, RawModule) through the CuPy double
(tests/cupy_double: every kernel an NVRTC cubin run by the emulator, CuPy's conversion rules) against numpy:

* teacher-forced greedy: at every step both backends get numpy's tokens; logits bit-identical, tokens equal;
* the engine on cuda with 4 concurrent mixed-sampling requests: each request's tokens equal to it alone, and
  equal to the numpy engine's.
"""
from __future__ import annotations

import numpy as np
import pytest

from cupy_double.fixtures import cuda_double_module  # noqa: F401
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.engine.sampling import SamplingParams
from cupyglm.model.glm import SeqInput

PROMPTS = [[5, 17, 300, 42], list(range(60, 100)), [7] * 13]      # the second past the sparse limit (35)
STEPS = 6


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def cuda_ops(cuda_double_module):
    from cupyglm.backend.cuda_ops import CudaOps

    return CudaOps()


def teacher_forced(ckpt, ops, steps):
    """Logits [steps, B, V] of the last row per sequence, fed numpy's greedy tokens."""
    ref = ModelRunner(ckpt, NumpyOps(), LocalComm(), 64, 16, poison=True)
    dev = ModelRunner(ckpt, ops, LocalComm(), 64, 16, poison=True)
    rs, ds = [ref.new_state() for _ in PROMPTS], [dev.new_state() for _ in PROMPTS]
    feed = [np.asarray(p, np.int32) for p in PROMPTS]
    out = []
    for step in range(steps):                  # the prompts, then decode rows (the gemv on the device)
        lr = np.stack([o.logits[-1] for o in ref.forward([SeqInput(f, s, decode=step > 0) for f, s in zip(feed, rs)])])
        got = dev.forward([SeqInput(f, s, decode=step > 0) for f, s in zip(feed, ds)])
        ld = np.stack([ops.asnumpy(o.logits[-1]) for o in got])
        out.append((lr, ld))
        feed = [np.array([int(np.argmax(r))], np.int32) for r in lr]
    return out


def test_cuda_logits_and_tokens_equal_numpy(tiny_ckpt, cuda_ops):
    run = teacher_forced(tiny_ckpt, cuda_ops, STEPS)
    for step, (lr, ld) in enumerate(run):
        assert np.isfinite(ld).all(), f"step {step}: non-finite logits (a poisoned buffer read?)"
        assert np.array_equal(bits(lr), bits(ld)), f"step {step}: max diff {np.abs(lr - ld).max()}"
    assert [[int(np.argmax(r)) for r in lr] for lr, _ in run] == [[int(np.argmax(r)) for r in ld] for _, ld in run]


def test_cuda_free_running_greedy_equals_numpy(tiny_ckpt, cuda_ops):
    ref = ModelRunner(tiny_ckpt, NumpyOps(), LocalComm(), 64, 16)
    dev = ModelRunner(tiny_ckpt, cuda_ops, LocalComm(), 64, 16)
    want = list(ref.greedy(PROMPTS[1], 8))
    assert list(dev.greedy(PROMPTS[1], 8)) == want


LENGTHS = [5, 40, 12, 20]
PARAMS = [SamplingParams(temperature=0, max_tokens=6),
          SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=6),
          SamplingParams(temperature=1.0, top_k=20, seed=5, max_tokens=5),
          SamplingParams(temperature=0.7, min_p=0.1, seed=9, max_tokens=6)]


def make_engine(ckpt, ops, parallel=4, pages=32, drafts=0):
    c = ckpt.config
    runner = ModelRunner(ckpt, ops, LocalComm(), pages, 16, mtp=drafts > 0, poison=True)
    cfg = EngineConfig(context=128, num_pages=pages, page_tokens=16, keep_grid=c.keep_grid, parallel=parallel,
                       seed=0, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size, poison=True,
                       mtp_drafts=drafts, draft_pricing=False)
    return Engine(runner, LocalComm(), cfg, ckpt.tokenizer)


def run(engine, prompts, params):
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    got = {i: [] for i in ids}
    most = 0
    while engine.has_work():
        most = max(most, engine.running)
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
    assert engine.free_pages == engine.total_pages
    return [got[i] for i in ids], most


def test_cuda_engine_concurrent_equals_solo_and_numpy(tiny_ckpt, cuda_ops):
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 496, n).tolist() for n in LENGTHS]
    together, most = run(make_engine(tiny_ckpt, cuda_ops), prompts, PARAMS)
    assert most == 4
    eng = make_engine(tiny_ckpt, cuda_ops)
    alone = [run(eng, [p], [sp])[0][0] for p, sp in zip(prompts, PARAMS)]
    assert together == alone
    reference, _ = run(make_engine(tiny_ckpt, NumpyOps()), prompts, PARAMS)
    assert together == reference


def test_cuda_engine_drafted_equals_numpy_serial(tiny_ckpt, cuda_ops):
    """MTP drafts on the cuda path (the chained proposer, verify groups, rollback replays): numpy's serial tokens."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 496, n).tolist() for n in LENGTHS]
    eng = make_engine(tiny_ckpt, cuda_ops, drafts=3)
    drafted, _ = run(eng, prompts, PARAMS)
    assert eng.verifier.replayed_rows > 0
    reference, _ = run(make_engine(tiny_ckpt, NumpyOps()), prompts, PARAMS)
    assert drafted == reference


def test_bench_cuda_counts_prints_the_per_token_baseline():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "cuda_counts.py"
    r = subprocess.run([sys.executable, str(script), "--tokens", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if "per token:" in line}
    assert set(rows) == {"model", "engine"}
    assert all("syncs" in v and "launches" in v and "cupy kernels" in v for v in rows.values())
    own = [float(v.split("less the emulated kernels ")[1].split()[0]) for v in rows.values()]
    host = [float(v.split(" host ")[1].split()[0]) for v in rows.values()]
    assert all(0 < o < h for o, h in zip(own, host)), rows          # the emulator's kernel time taken out


def test_a_decode_step_reads_back_once(tiny_ckpt, cuda_ops):
    """Past the dense limit (sparse DSA rows: token lists on the device), 4 requests decoding: one engine step
    is one device-to-host transfer (the sampled tokens with the device checks' flags)."""
    import cupy_double
    from cupyglm.engine.sampling import SamplingParams

    eng = make_engine(tiny_ckpt, cuda_ops)
    for i in range(4):
        eng.add_request(list(range(3 + i, 43 + i)), SamplingParams(temperature=0.7, seed=i, max_tokens=6,
                                                                   ignore_eos=True))
    started: set[int] = set()
    while len(started) < 4:
        started |= {o.request_id for o in eng.step() if o.new_token_ids}
    with cupy_double.counting() as c:
        outs = eng.step()
    assert sum(len(o.new_token_ids) for o in outs) == 4
    assert c.syncs == 1, c
    while eng.has_work():
        eng.step()


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_cuda_quantised_logits_equal_numpy(cuda_ops, tmp_path, fmt):
    """The quantised tiny on the cuda path: packed values and scales uploaded as stored (QWeight.to(cupy)), the
    fp8 / nvfp4 kernels dequantising in registers; logits bit-identical to numpy's twin."""
    from cupyglm.checkpoint.loader import Checkpoint
    from cupyglm.checkpoint.tiny import write_tiny

    run = teacher_forced(Checkpoint.open(write_tiny(tmp_path / fmt, quant=fmt)), cuda_ops, 3)
    for step, (lr, ld) in enumerate(run):
        assert np.isfinite(ld).all()
        assert np.array_equal(bits(lr), bits(ld)), f"{fmt} step {step}: max diff {np.abs(lr - ld).max()}"
