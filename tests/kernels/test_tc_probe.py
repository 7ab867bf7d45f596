"""bench/tc_probe.py on the CPU: the emulator's mma against the model, 0 bits apart on every input set, layouts
and row invariance ok; and the probe goes red when compared with another architecture's model."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).resolve().parents[2] / "bench" / "tc_probe.py"
SMALL = ["--m", "32", "--n", "16", "--k", "64"]


def _run(*args):
    return subprocess.run([sys.executable, str(PROBE), "--backend", "sim", *SMALL, *args], capture_output=True,
                          text=True, timeout=600)


def test_emulator_matches_the_model_on_every_input_set():
    r = _run()
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    for name in ("random", "cancellation", "spread", "subnormal", "ties"):
        assert any(line.strip().startswith(f"{name}: 0/1024 bits differ from the sm_90 model") for line in lines), lines
    assert lines[-1] == ("RESULT tc_probe ok sim sm_90: 0/5120 bits differ; layout ok; "
                         "row invariance and determinism ok")


def test_the_probe_fails_against_another_architectures_model():
    r = _run("--arch", "sm_80")
    assert r.returncode == 1
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT tc_probe FAIL sim sm_80: ") and not last.startswith("RESULT tc_probe FAIL sim sm_80: 0/")
