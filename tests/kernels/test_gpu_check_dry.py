"""launch/gpu-check cannot run here (no GPU); its --dry-run runs the same python steps on the CPU."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launch" / "gpu-check"
STEPS = ("env", "contract", "tokens", "engine", "tp", "invariance", "speed-tiny", "speed-big", "speed-nvfp4")


def test_script_is_executable_bash():
    assert os.access(SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_dry_run_writes_every_step_and_a_summary(tmp_path):
    out = tmp_path / "gpu-check"
    env = dict(os.environ, OUT=str(out))
    env.pop("PYTHON", None)
    proc = subprocess.run([str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    summary = (out / "SUMMARY").read_text()
    assert proc.returncode == 0, proc.stdout + proc.stderr + summary
    lines = summary.strip().splitlines()
    for step in STEPS:
        line = next(x for x in lines if x.split()[0] == step)
        assert " ok " in line, line
    assert "SUMMARY 1 kernels: 1 pass, 0 fail; 7 controls: 7 red as planted, 0 missed" in summary
    assert "RESULT tokens ok" in (out / "tokens.txt").read_text()
    assert "RESULT engine ok numpy: 4 concurrent = solo = numpy" in (out / "engine.txt").read_text()
    assert "RESULT tp ok numpy TP=2 (MPI) = numpy TP=2" in (out / "tp.txt").read_text()
    assert "RESULT invariance ok sim" in (out / "invariance.txt").read_text()
    assert "prefill" in (out / "speed-big.txt").read_text()
    assert lines[-1].startswith("GPU-CHECK ok in ")
    for f in ("nvidia-smi.txt", "env.txt", "contract.txt", "run.txt"):
        assert (out / f).is_file()


def test_out_of_budget_steps_are_skipped_and_fail(tmp_path):
    out = tmp_path / "gc"
    env = dict(os.environ, OUT=str(out), GPU_CHECK_BUDGET_S="8")
    proc = subprocess.run([str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    summary = (out / "SUMMARY").read_text()
    assert "SKIP (out of time)" in summary and "GPU-CHECK FAIL" in summary
