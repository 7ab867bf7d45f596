"""The kernel contract on `--backend cuda` through the CuPy double: NVRTC cubins (the real compiler), CuPy's
launch rules, the emulator running each cubin's source with its -D defines; one test per case (so the suite's
workers share them), the CLI's SUMMARY on `--backend cuda`; and no temporary cubin left behind by the planted
controls' compiles."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cupy_double.fixtures import cuda_double_module  # noqa: F401
from cupyglm.contract import check, registry
from cupyglm.contract.check import run_case
from cupyglm.kernels import CUDA_SRC, kernel_names

RUN = Path(__file__).resolve().parents[1] / "cupy_double" / "run.py"
SUMMARY_RE = r"SUMMARY (\d+) kernels: (\d+) pass, 0 fail; (\d+) controls: (\d+) red as planted, 0 missed"

# The double proves the cuda glue (launch arguments, grids, CuPy's rules), which is the same at any vocabulary:
# sample_rows' grid is one block per row and V only its i32 argument, so its cases at V = 154,880 (run on the
# emulator in every order by test_contract) add nothing here that its cases at V = 512 .. 20,001 do not.
GLUE = check.select(registry.load_all(), "!*v154880*")


def test_glue_cases_leave_out_no_kernel():
    every = registry.load_all()
    assert len(GLUE) < len(every) and all("v154880" in c.name for c in every if c not in GLUE)
    assert {k for c in GLUE for k in c.kernels} == {k for c in every for k in c.kernels}


def _first_case_of_each_file(cases) -> set[str]:
    file_of = {k: p.name for p in sorted(CUDA_SRC.glob("*.cu")) for k in kernel_names(p)}
    seen: set[str] = set()
    names = set()
    for c in cases:
        files = {file_of[k] for k in c.kernels}
        if not files <= seen:
            names.add(c.name)
            seen |= files
    return names


# One planted control a kernel file here proves a planted build reaches NVRTC and the emulator runs that cubin's
# source; every case's own control comes out red on the emulator in every order (test_contract).
CONTROLLED = _first_case_of_each_file(GLUE)


def test_controlled_cases_cover_every_kernel_file():
    files = {p.name for p in CUDA_SRC.glob("*.cu") if p.name != "selftest.cu"}
    file_of = {k: p.name for p in sorted(CUDA_SRC.glob("*.cu")) for k in kernel_names(p)}
    assert {file_of[k] for c in GLUE if c.name in CONTROLLED for k in c.kernels} == files
    assert len(CONTROLLED) <= len(files) < len(GLUE)


@pytest.mark.parametrize("c", GLUE, ids=lambda c: c.name)
def test_case_on_cuda_through_the_double(cuda_double_module, c):
    control = c.name in CONTROLLED
    r = run_case(c, "cuda", ("forward",), control=control)
    assert r.ok, r.line()
    assert r.control_red or not control, r.line()


CLI_PATTERN = "rmsnorm,pick"          # the CLI's own path on cuda; every case runs above


def test_cli_on_cuda_through_the_double_prints_the_summary():
    r = subprocess.run([sys.executable, str(RUN), "cupyglm.cli.contract", "--backend", "cuda",
                        "--kernels", CLI_PATTERN],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    summary = [line for line in r.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.fullmatch(SUMMARY_RE, summary[-1])
    cases = check.select(registry.load_all(), CLI_PATTERN)
    assert m and m[1] == m[2] and m[3] == m[4], summary
    assert int(m[1]) == len({k for c in cases for k in c.kernels}) >= 2 and int(m[3]) == len(cases), summary
    assert sum(line.startswith("PASS ") for line in r.stdout.splitlines()) == len(cases), r.stdout


def test_control_compiles_leave_no_temporary_cubin(cuda_double_module, tmp_path, monkeypatch):
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
