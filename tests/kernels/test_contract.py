"""The kernel contract on the CPU emulator: every registered case passes under forward, reverse and shuffled
thread orders with identical outputs across them, and every planted control comes out red. Also: the
checker itself reports failures and missed controls, and the CLI prints the SUMMARY line."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from cupyglm.cli import contract as cli
from cupyglm.contract import check, registry
from cupyglm.contract.check import ORDERS, run_case, run_contract
from cupyglm.contract.registry import Case

SUMMARY_RE = re.compile(r"^SUMMARY (\d+) kernels: (\d+) pass, (\d+) fail; (\d+) controls: (\d+) red as planted, "
                        r"(\d+) missed$")
LINE_RE = re.compile(r"^(PASS|FAIL) \S+ \S+  .*  control (red|MISSED.*)$")


@pytest.mark.parametrize("c", registry.load_all(), ids=lambda c: c.name)
def test_case_passes_in_every_order_and_its_control_is_red(c):
    r = run_case(c, "sim", ORDERS)
    assert r.ok, r.line()
    assert r.orders == ORDERS
    assert r.control_red, r.line()


# The CLI's lines, orders and SUMMARY on two kernels' cases; the in-process test above runs every case in every
# order, so a wider pattern here would only rerun those cases.
CLI_PATTERN = "rmsnorm,pick"


def test_cli_all_orders_prints_lines_and_summary():
    proc = subprocess.run([sys.executable, "-m", "cupyglm.cli.contract", "--backend", "sim", "--order", "all",
                           "--kernels", CLI_PATTERN], capture_output=True, text=True, timeout=900)
    lines = proc.stdout.strip().splitlines()
    m = SUMMARY_RE.match(lines[-1])
    assert m, lines[-1]
    n, p, f, c, r, miss = map(int, m.groups())
    cases = check.select(registry.load_all(), CLI_PATTERN)
    assert c == len(cases) == len(lines) - 1 >= 11
    assert n == len({k for case in cases for k in case.kernels}) < c        # kernels count once, cases each
    assert all(LINE_RE.match(s) for s in lines[:-1]), lines
    assert (p, f, r, miss) == (n, 0, c, 0), proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert all(" forward,reverse,shuffled  " in s for s in lines[:-1])


# ---- the checker catches what it must ---------------------------------------------------------------------
def _fake(name, run, control, ulps=0):
    def make(rng):
        return {"x": rng.standard_normal(8).astype(np.float32)}

    def replay(d):
        return {"y": d["x"] * np.float32(2)}

    return Case(name, (name.split("[")[0],), make, run, replay, control, ulps, "test" if ulps else "")


def _good(k, d):
    return {"y": d["x"] * np.float32(2)}


def _off_by_ulp(k, d):
    y = d["x"] * np.float32(2)
    return {"y": np.nextafter(y, np.float32(np.inf))}


def _order_dependent(k, d):
    y = d["x"] * np.float32(2)
    if k.order == "reverse":
        y = y.copy()
        y[0] = np.nextafter(y[0], np.float32(np.inf))
    return {"y": y}


def _raises(k, d):
    raise RuntimeError("boom")


@pytest.fixture
def fake_cases(monkeypatch):
    cases = [
        _fake("good[a]", _good, _off_by_ulp),
        _fake("wrong[a]", _off_by_ulp, _off_by_ulp),                 # fails; its control equals the replay? no
        _fake("tolerant[a]", _off_by_ulp, lambda k, d: {"y": d["x"]}, ulps=1),
        _fake("missed[a]", _good, _good),                            # control identical: missed
        _fake("racy[a]", _order_dependent, _off_by_ulp),
        _fake("crash[a]", _raises, _raises),
    ]
    monkeypatch.setattr(registry, "load_all", lambda: cases)
    return cases


def test_checker_reports_fail_and_missed(fake_cases):
    out = []
    rep = run_contract("sim", None, ORDERS, out=out.append)
    by = {r.case.name: r for r in rep.results}
    assert by["good[a]"].ok and by["good[a]"].control_red
    assert not by["wrong[a]"].ok and "1 ulps apart" in by["wrong[a]"].detail
    assert by["tolerant[a]"].ok and by["tolerant[a]"].control_red
    assert by["missed[a]"].ok and not by["missed[a]"].control_red
    assert not by["racy[a]"].ok and "reverse" in by["racy[a]"].detail
    assert not by["crash[a]"].ok and "boom" in by["crash[a]"].detail and not by["crash[a]"].control_red
    assert out[-1] == "SUMMARY 6 kernels: 3 pass, 3 fail; 6 controls: 4 red as planted, 2 missed"
    assert out[0] == "PASS good[a] forward,reverse,shuffled  max 0 ulps  control red"
    assert not rep.ok
    only = run_contract("sim", "good*", ("forward",), out=None)
    assert [r.case.name for r in only.results] == ["good[a]"] and only.ok


def test_cli_exit_status(fake_cases, capsys):
    assert cli.main(["--backend", "sim", "--kernels", "good"]) == 0
    assert cli.main(["--backend", "sim", "--kernels", "missed"]) == 1
    assert cli.main(["--backend", "sim", "--kernels", "wrong", "--order", "all"]) == 1
    assert cli.main(["--backend", "sim", "--kernels", "nothing-matches"]) == 1
    out = capsys.readouterr().out
    assert "SUMMARY 1 kernels: 1 pass, 0 fail; 1 controls: 1 red as planted, 0 missed" in out


def test_select_by_kernel_name_and_glob():
    cases = registry.load_all()
    assert {c.name for c in check.select(cases, "gemm_tc")} >= {"gemm[decode]", "gemm_heads[decode]"}
    assert all(c.name.startswith("pick[") for c in check.select(cases, "pick[*"))
    pick, picks = check.select(cases, "pick[*"), check.select(cases, "dsa_pick")
    unflagged = [c.name for c in picks if "flags" not in c.name]
    assert [c.name for c in check.select(cases, "dsa_pick,!*flags*")] == unflagged
    assert "pick.flags[edges]" in {c.name for c in picks} and len(pick) < len(picks)
    assert len(check.select(cases, "!pick[*")) == len(cases) - len(pick) > 0
    assert check.select(cases, "pick[*,!dsa_pick") == []             # a `!` item naming a kernel drops its cases too
