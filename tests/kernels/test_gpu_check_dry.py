"""launch/gpu-check cannot run here (no GPU); its --dry-run runs the same steps on the CPU, and its result files
stay within what comes back from the GPU machine."""
from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launch" / "gpu-check"
STEPS = ("env", "warm", "contract", "tokens", "invariance", "micro", "decode", "engine")


def _log(out: Path, name: str) -> str:
    with tarfile.open(out / "logs.tar.gz") as t:
        return t.extractfile(f"./{name}.txt").read().decode()


def test_script_is_executable_bash():
    assert os.access(SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_dry_run_writes_every_step_and_a_summary(tmp_path):
    out = tmp_path / "gpu-check"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier run\n")
    env = dict(os.environ, OUT=str(out), CUPYGLM_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("PYTHON", None)
    proc = subprocess.run([str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=400)
    summary = (out / "SUMMARY").read_text()
    assert proc.returncode == 0, proc.stdout + proc.stderr + summary
    lines = summary.strip().splitlines()
    for step in STEPS:
        line = next(x for x in lines if x.split()[0] == step)
        assert " ok " in line, line
    assert next(x for x in lines if x.startswith("predict")).split()[1] == "SKIP"
    assert "SUMMARY 1 kernels: 1 pass, 0 fail; 7 controls: 7 red as planted, 0 missed" in summary
    assert "RESULT warm ok sm_90: 2 compiles" in summary
    assert "RESULT tokens ok numpy (eager) vs numpy" in _log(out, "tokens")
    assert "RESULT engine ok numpy: 4 concurrent = solo = numpy" in _log(out, "engine")
    assert "RESULT invariance ok sim" in _log(out, "invariance")
    decode = (out / "decode.txt").read_text()
    assert "decode small bf16 graphs=off batch 4" in decode and "decode small nvfp4 graphs=off batch 4" in decode
    micro = (out / "micro.txt").read_text()
    assert '"form": "grouped", "role": "decode", "rows": 4, "dtype": "nvfp4"' in micro
    assert "RESULT micro ok numpy: 29 measured, 0 errors" in micro
    assert lines[-1].startswith("GPU-CHECK ok in ")
    files = sorted(p.name for p in out.iterdir())
    assert files == ["SUMMARY", "contract.txt", "decode.txt", "logs.tar.gz", "micro.txt"]     # the stale file gone
    assert len(files) <= 8


def test_out_of_budget_steps_are_skipped_and_fail(tmp_path):
    out = tmp_path / "gc"
    env = dict(os.environ, OUT=str(out), GPU_CHECK_BUDGET_S="12")
    proc = subprocess.run([str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    summary = (out / "SUMMARY").read_text()
    assert "SKIP (out of time)" in summary and "GPU-CHECK FAIL" in summary
