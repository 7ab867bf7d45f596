"""NVRTC compile gate: every cuda_src/*.cu compiles for sm_80, sm_90 and sm_120 (no GPU needed).

Skipped only when cupy is not installed at all; if cupy is installed but NVRTC
cannot be loaded, the tests fail with the reason.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

if importlib.util.find_spec("cupy") is None:
    pytest.skip("cupy is not installed (pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12 "
                "nvidia-cuda-runtime-cu12)", allow_module_level=True)

from cupyglm.kernels import nvrtc_gate  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
FILES = nvrtc_gate.gate_files()


def test_nvrtc_loads_and_supports_sm120():
    version = nvrtc_gate.nvrtc_version()  # raises NvrtcUnavailable with the reason
    assert version >= (12, 8), f"NVRTC {version} cannot target sm_120 (needs >= 12.8)"
    assert (nvrtc_gate.cuda_include_dir() / "cuda_bf16.h").is_file()


def test_gate_has_files():
    assert any(f.name == "selftest.cu" for f in FILES)


@pytest.mark.parametrize("arch", nvrtc_gate.GATE_ARCHS)
@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_kernel_file_compiles(path, arch):
    # through the loader's disk cache, so the CuPy double and the speed model load this cubin, not compile it again
    from cupyglm.kernels import cuda

    try:
        assert cuda.compile_cubin(path, arch).stat().st_size > 0
    except cuda.CudaCompileError as e:
        pytest.fail(f"{path.name} does not compile for {arch}:\n{e}")


def test_broken_kernel_fails_with_log():
    ok, log = nvrtc_gate.compile_check(FIXTURES / "broken.cu", "sm_90")
    assert not ok
    assert "undefined_identifier_in_broken_kernel" in log
    assert "broken.cu(5)" in log, log  # the #line prefix makes NVRTC name the real file and line


def test_cli_matrix(capsys):
    rc = nvrtc_gate.main([str(FIXTURES / "broken.cu"), str(FILES[0]), "--arch", "sm_90"])
    out = capsys.readouterr()
    assert rc == 1
    assert "broken.cu" in out.out and "FAIL" in out.out and "ok" in out.out
    assert "undefined_identifier_in_broken_kernel" in out.err


def test_gpu_loader_compiles_cubin_without_a_device(tmp_path, monkeypatch):
    import sys

    monkeypatch.setenv("CUPYGLM_CACHE_DIR", str(tmp_path))
    from cupyglm.kernels import cuda

    p1 = cuda.compile_cubin(FILES[0], "sm_90")
    assert p1.read_bytes()[:4] == b"\x7fELF"
    assert cuda.compile_cubin(FILES[0], "sm_90") == p1  # disk cache hit
    with pytest.raises(cuda.CudaCompileError, match="undefined_identifier_in_broken_kernel"):
        cuda.compile_cubin(FIXTURES / "broken.cu", "sm_80")
    assert "cupyglm.kernels.cuda" in sys.modules


# the builds a launcher picks on GPUs with less shared memory a block (Kernels.shared_optin)
TILE_VARIANTS = [("gemm_tc.cu", "GTS_SMALL"), ("gemm_tc_q.cu", "GTQ_SMALL"), ("attention_tc.cu", "ATC_ONE_TILE")]


@pytest.mark.parametrize("arch", nvrtc_gate.GATE_ARCHS)
@pytest.mark.parametrize("name,define", TILE_VARIANTS, ids=[f"{n}-{d}" for n, d in TILE_VARIANTS])
def test_tile_variant_compiles(name, define, arch):
    from cupyglm.kernels import cuda

    try:
        assert cuda.compile_cubin(nvrtc_gate.CUDA_SRC / name, arch, (f"-D{define}",)).stat().st_size > 0
    except cuda.CudaCompileError as e:
        pytest.fail(f"{name} -D{define} does not compile for {arch}:\n{e}")
