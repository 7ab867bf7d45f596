"""What one decode token costs on the `cuda` code path, counted by the CuPy double (tests/cupy_double): device-to-
host syncs, RawKernel launches, CuPy's own kernels (elementwise ops, copies, reductions), host-to-device copies,
allocations, host time (the double's own cost included). No GPU needed; the baseline of decode-speed work.

    python bench/cuda_counts.py [--tokens 4] [--layers45] [--where] [--quant fp8|nvfp4]
    mpirun -n N python bench/cuda_counts.py --tp N [--tokens 2] [--layers45] [--where]

Rows: `model` is one GLMModel.forward of one sequence's decode token (the tiny checkpoint); `engine` one
Engine.step with 4 requests decoding (mixed sampling), per token; `model-45` the forward of a random model of
the real layer structure (45 layers: 34 KDA + 11 DSA, 3 dense MLPs) at tiny widths (--layers45). --quant: the
tiny checkpoint written quantised (make-tiny --quant) instead, with the gemm_* / quantised gemv launches named.

Each row runs with CUDA graphs off (the `per token:` lines) and on (CUPYGLM_CUDA_GRAPHS=1: every layer whole and
the ends replayed, engine/graph_forward.py, graph_capture.py, graph_ends.py); a table puts both side by side:
host launches (eager RawKernels, eager CuPy kernels, graph launches), the kernels run inside graphs, syncs, H2D
copies, host time (the emulator's time in the double, kernels inside graphs included) and own host time (host
time less the emulator's kernel time: the glue's Python, CuPy ops run by numpy at tiny widths, the double's
checks). One decode step before the counted ones captures the graphs (warm-up, uncounted, in both modes).

--tp N (under `mpirun -n N`): the same model rows with the weights split N ways, every rank on its own device of
the double and the collectives over its NCCL (carried over MPI); rank 0 prints. `collectives` counts the NCCL
calls a decode token makes (inside graph replays too); a sublayer's rank-order sum runs inside its hc_post launch,
so only the MTP layer's residual sums add launches of their own. The tiny checkpoint splits 2 ways (4 heads); `model-45` runs its 45 layers
with 8 heads of each kind (TP_HEADS) so that it splits 2 and 8 ways.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


# head counts of the --tp 45-layer row: 8 of each kind, so its weights split 2 and 8 ways
TP_HEADS = dict(num_attention_heads=8, kda_num_heads=8, index_n_heads=8)


def _model_row(ckpt, ops, tokens: int, where: bool, graphs: bool = False, comm=None):
    import cupy_double
    from cupyglm.distributed.comm import LocalComm
    from cupyglm.engine.runner import ModelRunner
    from cupyglm.model.glm import SeqInput

    runner = ModelRunner(ckpt, ops, comm or LocalComm(), 16, 16, graphs=graphs)
    st = runner.new_state()
    out = runner.forward([SeqInput(np.arange(5, 25, dtype=np.int32), st)])
    tok = int(np.argmax(_read_checked(ops, out[0].logits[-1])))
    out = runner.forward([SeqInput(np.array([tok], np.int32), st, decode=True)], check=False)     # warm-up (captures)
    with cupy_double.counting(trace=where) as c:
        t0 = time.perf_counter()
        for _ in range(tokens):
            tok = int(np.argmax(_read_checked(ops, out[0].logits[-1])))
            feed = [SeqInput(np.array([tok], np.int32), st, decode=True)]
            out = runner.forward(feed, check=False)                                 # checked with the read
        c.host_s = time.perf_counter() - t0
    _read_checked(ops, out[0].logits[-1])
    runner.release(st)
    return c


def _read_checked(ops, x):
    """The step's one read-back: x with the device checks' flags (a tree without asnumpy_checked: two reads)."""
    if hasattr(ops, "asnumpy_checked"):
        return ops.asnumpy_checked(x)
    ops.raise_device_errors()
    return ops.asnumpy(x)


def _engine_row(ckpt, ops, tokens: int, where: bool, graphs: bool = False):
    import cupy_double
    from cupyglm.distributed.comm import LocalComm
    from cupyglm.engine.config import EngineConfig
    from cupyglm.engine.engine import Engine
    from cupyglm.engine.runner import ModelRunner
    from cupyglm.engine.sampling import SamplingParams

    c = ckpt.config
    runner = ModelRunner(ckpt, ops, LocalComm(), 32, 16, graphs=graphs)
    cfg = EngineConfig(context=128, num_pages=32, page_tokens=16, keep_grid=c.keep_grid, parallel=4, seed=0,
                       eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size)
    eng = Engine(runner, LocalComm(), cfg, ckpt.tokenizer)
    params = [SamplingParams(temperature=0, max_tokens=tokens + 2, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=tokens + 2, ignore_eos=True),
              SamplingParams(temperature=1.0, top_k=20, seed=5, max_tokens=tokens + 2, ignore_eos=True),
              SamplingParams(temperature=0.7, min_p=0.1, seed=9, max_tokens=tokens + 2, ignore_eos=True)]
    for i, sp in enumerate(params):
        eng.add_request(list(range(10 + i, 30 + i)), sp)
    started: set[int] = set()
    while len(started) < len(params):                   # every prompt prefilled (its first token out)
        started |= {o.request_id for o in eng.step() if o.new_token_ids}
    eng.step()                                          # warm-up (captures)
    made = 0
    with cupy_double.counting(trace=where) as cnt:
        t0 = time.perf_counter()
        for _ in range(tokens):
            made += sum(len(o.new_token_ids) for o in eng.step())
        cnt.host_s = time.perf_counter() - t0
    while eng.has_work():
        eng.step()
    return cnt, made


def _print(name: str, c, per: int, where: bool) -> None:
    print(f"{name:<9} per token: syncs {c.syncs / per:g}, launches {c.launches / per:g}, cupy kernels "
          f"{c.kernels / per:g}, h2d copies {c.h2d / per:g} ({c.h2d_bytes / per:g} B), d2h {c.d2h_bytes / per:g} B, "
          f"allocs {c.allocs / per:g}, collectives {c.collectives / per:g}, host {1e3 * c.host_s / per:.1f} ms "
          f"(less the emulated kernels {_own_ms(c) / per:.2f} ms)")
    if where:
        for counter in ("syncs", "h2d", "kernels", "launches"):
            top = sorted(c.where.get(counter, {}).items(), key=lambda kv: -kv[1])
            print(f"    {counter}: " + ", ".join(f"{k} {v / per:g}" for k, v in top))


SIDE = (("host launches", lambda c: c.launches + c.kernels + c.graph_launches),
        ("raw kernels", lambda c: c.launches), ("cupy kernels", lambda c: c.kernels),
        ("graph launches", lambda c: c.graph_launches), ("collectives", lambda c: c.collectives),
        ("in graphs", lambda c: c.graph_kernels + c.graph_ops + c.graph_memcpys),
        ("syncs", lambda c: c.syncs), ("h2d", lambda c: c.h2d), ("host ms", lambda c: 1e3 * c.host_s),
        ("own host ms", lambda c: _own_ms(c)))


def _own_ms(c) -> float:
    """Host time less the emulator's kernel time: the Python glue's own work (CuPy ops run by numpy included)."""
    return 1e3 * c.host_s - 1e-6 * c.kernel_ns


def _side_by_side(rows) -> None:
    """rows: (name, counts off, counts on, tokens) -> one table, per decode token."""
    print("graphs off vs on, per decode token (host launches = eager RawKernels + eager CuPy kernels + graph "
          "launches; in graphs = the RawKernels and CuPy kernels those launches ran):")
    print(f"{'row':<9} {'graphs':<6} " + " ".join(f"{h:>14}" for h, _ in SIDE))
    for name, off, on, per in rows:
        for label, c in (("off", off), ("on", on)):
            print(f"{name:<9} {label:<6} " + " ".join(f"{f(c) / per:>14.2f}" for _, f in SIDE))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4, help="decode tokens counted (default 4)")
    ap.add_argument("--layers45", action="store_true", help="also the 45-layer structure at tiny widths")
    ap.add_argument("--where", action="store_true", help="break each count down by where it came from")
    ap.add_argument("--quant", choices=("fp8", "nvfp4"), help="the tiny checkpoint quantised in this format")
    ap.add_argument("--tp", type=int, default=0, help="run under `mpirun -n TP`: the weights split TP ways, NCCL")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "bench"))
    import cupy_double

    cupy_double.install()
    from cupyglm.backend.cuda_ops import CudaOps
    from cupyglm.checkpoint.loader import Checkpoint
    from cupyglm.checkpoint.tiny import default_tiny_dir

    ops = CudaOps()
    if a.quant:
        return _quant_rows(ops, a)
    if a.tp:
        return _tp_rows(ops, a)
    tiny = Checkpoint.open(default_tiny_dir())
    side = []
    off, on = (_model_row(tiny, ops, a.tokens, a.where, g) for g in (False, True))
    _print("model", off, a.tokens, a.where)
    side.append(("model", off, on, a.tokens))
    (off, made), (on, made_on) = (_engine_row(tiny, ops, a.tokens, a.where, g) for g in (False, True))
    if made != made_on:
        raise SystemExit(f"engine: {made} tokens with graphs off, {made_on} on")
    _print("engine", off, made, a.where)
    side.append(("engine", off, on, made))
    if a.layers45:
        from big_random import RandomCheckpoint, big_config

        ckpt = RandomCheckpoint(big_config("small", num_hidden_layers=45))
        off, on = (_model_row(ckpt, ops, a.tokens, a.where, g) for g in (False, True))
        _print("model-45", off, a.tokens, a.where)
        side.append(("model-45", off, on, a.tokens))
    _side_by_side(side)
    return 0


def _tp_rows(ops, a) -> int:
    """The model rows at TP = a.tp, one rank of `mpirun -n a.tp` each, over the double's NCCL; rank 0 prints."""
    from mpi4py import MPI

    from big_random import RandomCheckpoint, big_config
    from cupyglm.checkpoint import names
    from cupyglm.checkpoint.loader import Checkpoint
    from cupyglm.checkpoint.tiny import default_tiny_dir
    from cupyglm.distributed.comm import NcclComm

    world = MPI.COMM_WORLD
    if world.Get_size() != a.tp:
        raise SystemExit(f"--tp {a.tp}: run it under `mpirun -n {a.tp}` (this world has {world.Get_size()} ranks)")
    comm = NcclComm(world, world.Get_rank())
    say = print if comm.rank == 0 else (lambda *_: None)
    ckpts = [("model", Checkpoint.open(default_tiny_dir()))]
    if a.layers45:
        ckpts.append(("model-45", RandomCheckpoint(big_config("small", num_hidden_layers=45, **TP_HEADS))))
    side = []
    for name, ckpt in ckpts:
        try:
            [spec.shard_shape(a.tp) for spec in names.all_specs(ckpt.config)]
        except ValueError as e:
            say(f"{name:<9} tp{a.tp}: skipped, its weights do not split {a.tp} ways ({e})")
            continue
        off, on = (_model_row(ckpt, ops, a.tokens, a.where, g, comm) for g in (False, True))
        if comm.rank == 0:
            _print(f"{name} tp{a.tp}", off, a.tokens, a.where)
        side.append((f"{name}", off, on, a.tokens))
    if comm.rank == 0 and side:
        print(f"tp={a.tp}, rank 0:")
        _side_by_side(side)
    return 0


def _quant_rows(ops, a) -> int:
    """The quantised tiny's model row, and the GEMM kernels its decode tokens launch."""
    import tempfile

    from cupyglm.checkpoint.loader import Checkpoint
    from cupyglm.checkpoint.tiny import write_tiny

    with tempfile.TemporaryDirectory(prefix="cupyglm-counts-") as d:
        ckpt = Checkpoint.open(write_tiny(d, quant=a.quant))
        c = _model_row(ckpt, ops, a.tokens, True)
    _print(f"model {a.quant}", c, a.tokens, a.where)
    launches = c.where.get("launches", {})
    for prefix in ("gemm", "gemv"):
        named = {k: v for k, v in sorted(launches.items()) if k.startswith(prefix)}
        print(f"    {prefix}_* launches per token: " + (", ".join(f"{k} {v / a.tokens:g}" for k, v in named.items())
                                                      or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
