"""launch/gpu-check's plan (bench/gpu_plan.py): the step limits fit the GPU machine's budget, the compile list
covers what the run compiles, and too slow a compile or too many result files fail the plan."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench import gpu_plan  # noqa: E402
from cupyglm.kernels import CUDA_SRC  # noqa: E402


def test_limits_fit_the_budget_and_files_come_back():
    assert sum(s.limit_s for s in gpu_plan.STEPS) + gpu_plan.OVERHEAD_S <= gpu_plan.BUDGET_S
    assert len(gpu_plan.OUT_FILES) <= gpu_plan.MAX_FILES
    fits, lines = gpu_plan.plan(3.0)
    assert fits and lines[-1] == "PLAN ok", "\n".join(lines)


def test_a_slow_compile_fails_the_plan():
    fits, lines = gpu_plan.plan(60.0)          # 6 rounds of 60 s cannot fit the warm step's limit
    assert not fits and lines[-1] == "PLAN FAIL"
    assert any(line.startswith("warm") and "OVER ITS LIMIT" in line for line in lines)


def test_too_many_files_fail_the_plan(monkeypatch):
    monkeypatch.setattr(gpu_plan, "OUT_FILES", tuple(f"f{i}" for i in range(9)))
    fits, lines = gpu_plan.plan(1.0)
    assert not fits and "files back: 9 of at most 8" in "\n".join(lines)


def test_compile_jobs_cover_every_file_and_every_planted_define():
    jobs = gpu_plan.compile_jobs()
    assert {f for f, o in jobs if not o} == {p.name for p in CUDA_SRC.glob("*.cu")}
    used = {o[0][2:] for _, o in jobs if o}
    tested = set()
    for f in [*CUDA_SRC.glob("*.cu"), *CUDA_SRC.glob("*.cuh")]:
        tested |= set(re.findall(r"#\s*if(?:def|ndef)?\s+\(?(?:defined\s*\(?)?\s*([A-Z][A-Z0-9_]+)", f.read_text()))
    assert gpu_plan.variant_defines() & tested <= used
    assert {"CONTROL_NIBBLE_SWAP", "SAMPLE_STATS", "GATHER_CONTROL_DROP_ROW"} <= used
    assert ("gemv.cu", ("-DCONTROL_TC_REVERSED",)) in jobs and ("gemv_q.cu", ("-DCONTROL_TC_IEEE",)) in jobs


def test_limits_output_is_what_the_script_reads():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_plan.py"), "--limits"], capture_output=True,
                         text=True, check=True).stdout.split("\n")
    rows = [line.split() for line in out if line]
    assert [r[0] for r in rows] == [s.name for s in gpu_plan.STEPS] + ["budget"]
    assert rows[-1] == ["budget", str(gpu_plan.BUDGET_S), "0", "0"]
    assert [r[0] for r in rows if r[3] == "1"] == ["sanitizer"]


def test_launch_plan_times_one_compile_and_prices_the_run():
    """The command times a real compile and prices the run with it; whether this machine's compile fits the budget
    is a speed, not a property (the pricing itself is tested above with the compile time injected)."""
    pytest.importorskip("cupy")
    proc = subprocess.run([str(ROOT / "launch" / "gpu-check"), "--plan"], capture_output=True, text=True,
                          timeout=300)
    m = re.search(r"one compile here (\d+\.\d) CPU-s \(gemv_q\.cu\)", proc.stdout)
    assert m, proc.stdout + proc.stderr
    fits, lines = gpu_plan.plan(float(m.group(1)))
    assert proc.stdout.rstrip().endswith(lines[-1]) and proc.returncode == (0 if fits else 1)
    assert "budget 540s" in proc.stdout
