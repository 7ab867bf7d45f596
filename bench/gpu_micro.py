"""Kernel micro-benchmarks at the full model's shapes: GB/s of each GEMV form (dense, grouped, multi, swiglu) at
decode rows 1 / 4 / 16 for bf16 / fp8 / nvfp4 weights, TFLOP/s of the prompt GEMM at M = 2048, and the DSA
attention's decode rows; then, when bench/sass_model.py's predictions are given, predicted beside measured.

    python bench/gpu_micro.py --backend cuda [--config glm-5.3-flash] [--m 2048] [--predictions P.json]

Each measurement is one `MEASURED {json}` line with the keys of sass_model.py --json (kernel, role, rows,
dtype) and measured_us, GB/s (weight bytes read once a call) or TFLOP/s; `kernel` is the __global__ the call
launched (the form's name on numpy). Weights are random on the backend (drawn on the device on cuda). The
last line: `RESULT micro ok|FAIL <n> measured, <e> errors`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.micro_inputs import attention_inputs, bf16_weight, qweight, weight_bytes  # noqa: E402
from bench.micro_join import join_lines  # noqa: E402
from cupyglm.backend import make_ops, resolve  # noqa: E402
from cupyglm.config import preset  # noqa: E402
from cupyglm.kernels import ops as kops  # noqa: E402

FORMS = ("dense", "grouped", "multi", "swiglu")
DTYPES = ("bf16", "fp8", "nvfp4")


@contextlib.contextmanager
def launched():
    """The __global__ names launched inside the block (the kernel backends' Kernels.launch)."""
    names: list[str] = []
    orig = kops.Kernels.launch

    def spy(self, source, name, *args, **kw):
        names.append(name)
        return orig(self, source, name, *args, **kw)
    kops.Kernels.launch = spy
    try:
        yield names
    finally:
        kops.Kernels.launch = orig


def timed_us(ops, fn, reps: int) -> tuple[float, list[str]]:
    """Median microseconds of fn() over reps calls after one warm-up call; the kernels the warm-up launched."""
    sync = getattr(ops, "cupy", None)
    with launched() as names:
        fn()
    times = []
    for _ in range(reps):
        if sync is not None:
            sync.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        if sync is not None:
            sync.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    return 1e6 * float(np.median(times)), sorted(set(names))


def gemv_call(ops, cfg, form: str, dtype: str, rows: int, rng):
    """(fn, weight bytes one call reads) of one GEMV form at the model's shapes."""
    d, xp = cfg.hidden_size, ops.xp
    w = (lambda n, k, e=None: bf16_weight(ops, (n, k) if e is None else (e, n, k), rng)) if dtype == "bf16" else \
        (lambda n, k, e=None: qweight(ops, dtype, n, k, e, rng))
    x = bf16_weight(ops, (rows, d), rng, std=1.0)
    if form == "dense":                          # the dense MLP's down_proj: [D, I]
        xi = bf16_weight(ops, (rows, cfg.intermediate_size), rng, std=1.0)
        wd = w(d, cfg.intermediate_size)
        return (lambda: ops.gemm(xi, wd, decode=rows)), weight_bytes(wd)
    if form == "grouped":                        # routed experts' gate: rows on distinct experts
        e = max(rows, 16)
        wg = w(cfg.moe_intermediate_size, d, e)
        group = xp.asarray(np.arange(rows, dtype=np.int32))
        return (lambda: ops.gemm_grouped(x, wg, group, decode=rows)), weight_bytes(wg) * rows // e
    if form == "multi":                          # DSA q_a and kv_a of the same rows in one call
        wa, wb = w(cfg.q_lora_rank, d), w(cfg.kv_lora_rank, d)
        return (lambda: ops.gemm_multi((x, x), (wa, wb), ("f32", "f32"), decode=rows)), \
            weight_bytes(wa) + weight_bytes(wb)
    wg, wu = w(cfg.moe_intermediate_size, d), w(cfg.moe_intermediate_size, d)     # the shared expert's gate/up
    return (lambda: ops.gemm_swiglu(x, wg, wu, cfg.swiglu_limit, decode=rows)), weight_bytes(wg) + weight_bytes(wu)


def measure(ops, cfg, a) -> tuple[list[dict], list[str]]:
    rng = np.random.default_rng(0)
    rows_out, errors = [], []

    def record(key: dict, fn, reps: int, per: tuple[str, float]) -> None:
        try:
            us, names = timed_us(ops, fn, reps)
        except Exception as e:  # noqa: BLE001 (a form a dtype has no kernel for is reported, not fatal)
            errors.append(f"{key}: {type(e).__name__}: {e}".splitlines()[0])
            print(f"ERROR {errors[-1]}")
            return
        unit, amount = per
        r = {"kernel": ",".join(names) or key["form"], **key, "measured_us": round(us, 2),
             unit: round(amount / us / (1e3 if unit == "GB/s" else 1e6), 3)}
        rows_out.append(r)
        print("MEASURED " + json.dumps(r), flush=True)

    for dtype in DTYPES:
        for form in FORMS:
            for rows in a.rows:
                try:
                    fn, nbytes = gemv_call(ops, cfg, form, dtype, rows, rng)
                except Exception as e:  # noqa: BLE001
                    errors.append(f"{form} {dtype} rows {rows} setup: {type(e).__name__}: {e}".splitlines()[0])
                    print(f"ERROR {errors[-1]}")
                    continue
                record({"form": form, "role": "decode", "rows": rows, "dtype": dtype}, fn, a.reps, ("GB/s", nbytes))
    for dtype in DTYPES:                         # the prompt GEMM: the dense MLP's gate at M rows
        x = bf16_weight(ops, (a.m, cfg.hidden_size), rng, std=1.0)
        w = bf16_weight(ops, (cfg.intermediate_size, cfg.hidden_size), rng) if dtype == "bf16" else \
            qweight(ops, dtype, cfg.intermediate_size, cfg.hidden_size, None, rng)
        flops = 2.0 * a.m * cfg.intermediate_size * cfg.hidden_size
        record({"form": "prompt", "role": "prompt", "rows": a.m, "dtype": dtype},
               (lambda x=x, w=w: ops.gemm(x, w)), max(2, a.reps // 4), ("TFLOP/s", flops))
    for rows in a.rows:                          # DSA attention over index_topk latent rows a decode row
        args, nbytes = attention_inputs(ops, cfg, rows, rng)
        record({"form": "attention", "role": "decode", "rows": rows, "dtype": "bf16"},
               (lambda args=args, rows=rows: ops.attention(*args, decode=rows)), a.reps, ("GB/s", nbytes))
    return rows_out, errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--config", default="glm-5.3-flash", help="preset whose shapes are measured (tiny: a dry run)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--m", type=int, default=2048, help="prompt GEMM rows")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--predictions", type=Path, default=None, help="bench/sass_model.py --json output, if any")
    a = ap.parse_args(argv)
    ops = make_ops(resolve(a.backend)[0])
    cfg = preset(a.config)
    t0 = time.perf_counter()
    measured, errors = measure(ops, cfg, a)
    print(f"{len(measured)} measurements in {time.perf_counter() - t0:.1f}s at {a.config}'s shapes on {ops.name}")
    if a.predictions is not None and a.predictions.is_file():
        print("\n".join(join_lines(json.loads(a.predictions.read_text()), measured)))
    elif a.predictions is not None:
        print(f"no predictions ({a.predictions} absent)")
    ok = bool(measured) and not math.isnan(sum(r["measured_us"] for r in measured))
    print(f"RESULT micro {'ok' if ok else 'FAIL'} {ops.name}: {len(measured)} measured, {len(errors)} errors")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
