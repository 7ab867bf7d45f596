"""The contract checker: every registered Case on a backend, under the emulator's thread orders.

For every case (and every requested order): make the inputs, launch through the typed launchers, compare with
the host replay within the case's ULPs; under several orders also require bit-identical outputs across them;
then run the planted control once and require it to come out red (different from the replay). One line per
case (a kernel at one shape), then

    SUMMARY <n> kernels: <p> pass, <f> fail; <c> controls: <r> red as planted, <m> missed

    from cupyglm.contract.check import run_contract
    report = run_contract("sim", orders=ORDERS)      # report.ok, report.summary, report.results
"""
from __future__ import annotations

import dataclasses
import fnmatch
import traceback
import zlib
from typing import Callable, Iterable

import numpy as np

from cupyglm.backend.lanes import BF16, BF16_BITS, from_bits, to_bits
from cupyglm.contract import registry
from cupyglm.contract.registry import Case, compare
from cupyglm.kernels.ops import Kernels

ORDERS = ("forward", "reverse", "shuffled")


@dataclasses.dataclass
class Result:
    case: Case
    ok: bool
    orders: tuple[str, ...]
    detail: str                 # "max 0 ulps" or what failed
    control_red: bool
    control_detail: str

    def line(self) -> str:
        head = "PASS" if self.ok else "FAIL"
        ctl = "control red" if self.control_red else f"control MISSED ({self.control_detail})"
        tol = f" (allowed {self.case.ulps}: {self.case.why_ulps})" if self.case.ulps and self.ok else ""
        return f"{head} {self.case.name} {','.join(self.orders)}  {self.detail}{tol}  {ctl}"


@dataclasses.dataclass
class Report:
    results: list[Result]

    @property
    def passed(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def red(self) -> int:
        return sum(r.control_red for r in self.results)

    @property
    def ok(self) -> bool:
        return bool(self.results) and self.passed == len(self.results) and self.red == len(self.results)

    @property
    def summary(self) -> str:
        """Kernels count once each (a kernel passes when every case naming it passes); controls count per case."""
        kernels = {k for r in self.results for k in r.case.kernels}
        failed = {k for r in self.results if not r.ok for k in r.case.kernels}
        n, c = len(kernels), len(self.results)
        return (f"SUMMARY {n} kernels: {n - len(failed)} pass, {len(failed)} fail; "
                f"{c} controls: {self.red} red as planted, {c - self.red} missed")


def select(cases: Iterable[Case], pattern: str | None) -> list[Case]:
    """Cases whose name or one of whose kernels matches `pattern` (a glob; plain text matches a substring), less
    those matching a `!`-prefixed item (only `!` items: every case but those)."""
    cases = list(cases)
    if not pattern:
        return cases
    items = [p.strip() for p in pattern.split(",") if p.strip()]
    pats = [p for p in items if not p.startswith("!")]
    drop = [p[1:] for p in items if p.startswith("!")]

    def hit(name: str, among: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(name, p) if any(ch in p for ch in "*?[") else p in name for p in among)

    def named(c: Case, among: list[str]) -> bool:
        return hit(c.name, among) or any(hit(k, among) for k in c.kernels)

    return [c for c in cases if (not pats or named(c, pats)) and not (drop and named(c, drop))]


def _xp(backend: str):
    if backend == "sim":
        return np
    if backend == "cuda":
        import cupy
        return cupy
    raise ValueError(f"contract backend must be sim or cuda, got {backend!r}")


def _to_backend(xp, d: dict) -> dict:
    """A fresh copy of the inputs on the backend (kernels may write into them: write_rows' store). bf16 inputs
    go to cupy as their uint16 bit patterns (the cuda storage)."""
    def put(v):
        if not isinstance(v, np.ndarray):
            return v
        if xp is not np and v.dtype == BF16:
            v = to_bits(v)
        return xp.array(v)
    return {k: put(v) for k, v in d.items()}


def _to_host(xp, d: dict) -> dict:
    """Outputs on the host; a cupy uint16 output is bf16 storage and comes back as bf16."""
    out = {}
    for k, v in d.items():
        if xp is not np and isinstance(v, xp.ndarray):
            v = xp.asnumpy(v)
            if v.dtype == BF16_BITS:
                v = from_bits(v)
        out[k] = np.array(v)
    return out


def _same_bits(a: dict, b: dict) -> str | None:
    for key in a:
        x, y = np.ascontiguousarray(a[key]), np.ascontiguousarray(b.get(key))
        if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
            return key
    return None


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def run_case(c: Case, backend: str = "sim", orders: tuple[str, ...] = ("forward",), control: bool = True) -> Result:
    """The case in each order, then (when `control`) its planted mistake once."""
    xp = _xp(backend)
    inputs = c.make(np.random.default_rng(_seed(c.name)))
    want = _to_host(np, c.replay(_to_backend(np, inputs)))
    ok, detail, first = True, "", None
    ran: list[str] = []
    for order in orders:
        k = Kernels(backend, xp, order=order if backend == "sim" else None)
        try:
            got = _to_host(xp, c.run(k, _to_backend(xp, inputs)))
        except Exception as e:                                   # noqa: BLE001 (reported as a failure)
            ok, detail = False, f"{order}: {type(e).__name__}: {e}".splitlines()[0]
            break
        ran.append(order)
        good, msg = compare(got, want, c.ulps)
        if not good:
            ok, detail = False, f"{order}: {msg}"
            break
        detail = msg if not detail else max(detail, msg, key=lambda s: int(s.split()[1]))
        if first is None:
            first = got
        else:
            key = _same_bits(first, got)
            if key is not None:
                ok, detail = False, f"{order}: output {key} differs from {orders[0]} (order-dependent: a race)"
                break
    if not control:
        return Result(c, ok, tuple(ran) if ok else tuple(orders), detail, False, "not run")
    try:
        k = Kernels(backend, xp, order=orders[0] if backend == "sim" else None)
        bad = _to_host(xp, c.control(k, _to_backend(xp, inputs)))
        same, msg = compare(bad, want, c.ulps)
        red, cdetail = (not same), msg
    except Exception as e:                                       # noqa: BLE001
        red, cdetail = False, f"control raised {type(e).__name__}: {e}".splitlines()[0]
    return Result(c, ok, tuple(ran) if ok else tuple(orders), detail, red, cdetail)


def run_contract(backend: str = "sim", pattern: str | None = None, orders: tuple[str, ...] = ("forward",),
                 out: Callable[[str], None] | None = print) -> Report:
    cases = select(registry.load_all(), pattern)
    results = []
    for c in cases:
        try:
            r = run_case(c, backend, orders)
        except Exception as e:                                   # noqa: BLE001 (make/replay broke)
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            r = Result(c, False, tuple(orders), f"error: {tb}", False, "not run")
        results.append(r)
        if out:
            out(r.line())
    rep = Report(results)
    if out:
        out(rep.summary)
    return rep
