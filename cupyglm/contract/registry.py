"""The kernel contract: every `extern "C" __global__` kernel in cuda_src/ is registered here with the
shapes it runs at, its host replay (the NumPy reference), a tolerance, and a planted control.

Each `cases_<family>.py` module registers Case objects with `@case`. A case's `run(k, inputs)` launches the
kernel(s) through the typed launchers (backend `k.backend`); `replay(inputs)` computes the same outputs in
NumPy following the kernel's reduction order; `control(k, inputs)` runs a planted mistake (a mutated input,
e.g. a dropped row or a wrong page mapping, or a mutated kernel variant) whose outputs the checker must find
different from the replay. Outputs are dicts of numpy arrays.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path
from typing import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Case:
    name: str                               # what the line says, e.g. "rmsnorm[decode]"
    kernels: tuple[str, ...]                # the __global__ names this case exercises
    make: Callable[[np.random.Generator], dict]          # inputs (poisoned where unused)
    run: Callable[..., dict]                # (Kernels, inputs) -> outputs
    replay: Callable[[dict], dict]          # inputs -> outputs, NumPy
    control: Callable[..., dict]            # (Kernels, inputs) -> outputs of the planted mistake
    ulps: int = 0                           # allowed bf16/fp32 ULP distance; 0 = bit-identical
    why_ulps: str = ""                      # the reason when ulps > 0 (transcendentals)


CASES: list[Case] = []


def case(c: Case) -> Case:
    if any(x.name == c.name for x in CASES):
        raise ValueError(f"contract case {c.name!r} registered twice")
    CASES.append(c)
    return c


def load_all() -> list[Case]:
    pkg = Path(__file__).parent
    for m in pkgutil.iter_modules([str(pkg)]):
        if m.name.startswith("cases_"):
            importlib.import_module(f"cupyglm.contract.{m.name}")
    return CASES


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in float32 units in the last place (NaN vs NaN counts 0; NaN vs number is huge)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    if a.shape != b.shape:
        return 2**31
    na, nb = np.isnan(a), np.isnan(b)
    if (na != nb).any():
        return 2**31
    ia = a.view(np.int32).astype(np.int64)
    ib = b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(2**31) - ia, ia)          # map to a monotonic integer line
    ib = np.where(ib < 0, -(2**31) - ib, ib)
    d = np.abs(ia - ib)
    d[na & nb] = 0
    return int(d.max()) if d.size else 0


def compare(got: dict, want: dict, ulps: int) -> tuple[bool, str]:
    """Every output equal within `ulps` (integer outputs exactly)."""
    worst = 0
    for key, w in want.items():
        g = got.get(key)
        if g is None:
            return False, f"missing output {key}"
        g, w = np.asarray(g), np.asarray(w)
        if g.dtype != w.dtype:
            return False, f"{key}: dtype {g.dtype}, expected {w.dtype}"
        if w.dtype.kind in "iub":
            if g.shape != w.shape or not np.array_equal(g, w):
                return False, f"{key}: integer outputs differ"
            continue
        d = ulp_distance(g, w)
        worst = max(worst, d)
        if d > ulps:
            return False, f"{key}: {d} ulps apart (allowed {ulps})"
    return True, f"max {worst} ulps"
