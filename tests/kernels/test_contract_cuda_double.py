"""The kernel contract on `--backend cuda` through the CuPy double: NVRTC cubins (the real compiler), CuPy's
launch rules, the emulator running each cubin's source with its -D defines; and no temporary cubin left behind
by the planted controls' compiles."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from cupy_double.fixtures import cuda_double  # noqa: F401

RUN = Path(__file__).resolve().parents[1] / "cupy_double" / "run.py"


def test_contract_on_cuda_through_the_double():
    r = subprocess.run([sys.executable, str(RUN), "cupyglm.cli.contract", "--backend", "cuda"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    summary = [line for line in r.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.fullmatch(r"SUMMARY (\d+) kernels: (\d+) pass, 0 fail; (\d+) controls: (\d+) red as planted, 0 missed",
                     summary[-1])
    assert m and m[1] == m[2] and m[3] == m[4] and int(m[1]) >= 20, summary


def test_control_compiles_leave_no_temporary_cubin(cuda_double, tmp_path, monkeypatch):
    import cupy

    from cupyglm.kernels.ops import Kernels

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    fn = Kernels("cuda", cupy).variant("CUPYGLM_PLANTED_NOTHING").fn("norm.cu", "rmsnorm_rows")
    assert fn.name == "rmsnorm_rows"
    assert list(scratch.iterdir()) == []
    from cupyglm.kernels.cuda import cache_dir

    assert any(p.name.startswith("norm-") for p in cache_dir().glob("*.cubin"))
