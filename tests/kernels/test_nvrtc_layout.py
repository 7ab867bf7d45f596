"""Where NVRTC and the CUDA headers are found (CUDA 12 and CUDA 13 wheels' layouts), and a compiled-kernel
cache key that names no absolute path."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from cupyglm.kernels import nvrtc_gate

HAVE_CUPY = importlib.util.find_spec("cupy") is not None


def _site(tmp_path: Path, *, cu12: bool, cu13: bool) -> Path:
    """A fake site-packages/nvidia holding the files the wheels install."""
    root = tmp_path / "site-packages" / "nvidia"
    layouts = [m for m, on in ((12, cu12), (13, cu13)) if on]
    for m in layouts:
        inc, lib = nvrtc_gate.WHEEL_LAYOUTS[m]
        (root / inc).mkdir(parents=True, exist_ok=True)
        (root / inc / "cuda_bf16.h").write_text(f"// cu{m}\n")
        (root / lib).parent.mkdir(parents=True, exist_ok=True)
        (root / lib).write_bytes(b"\x7fELF")
    return root


def test_cuda13_wheel_layout_is_the_real_one():
    assert nvrtc_gate.WHEEL_LAYOUTS[13] == ("cu13/include", "cu13/lib/libnvrtc.so.13")
    assert nvrtc_gate.WHEEL_LAYOUTS[12] == ("cuda_runtime/include", "cuda_nvrtc/lib/libnvrtc.so.12")


@pytest.mark.parametrize("major", [12, 13])
def test_include_dir_follows_the_nvrtc_major_version(tmp_path, monkeypatch, major):
    root = _site(tmp_path, cu12=True, cu13=True)
    monkeypatch.setattr(nvrtc_gate, "_nvidia_roots", lambda: [root])
    inc = nvrtc_gate.cuda_include_dir(major)
    assert inc == root / nvrtc_gate.WHEEL_LAYOUTS[major][0]
    assert (inc / "cuda_bf16.h").read_text() == f"// cu{major}\n"


def test_cuda13_only_site_packages(tmp_path, monkeypatch):
    root = _site(tmp_path, cu12=False, cu13=True)
    monkeypatch.setattr(nvrtc_gate, "_nvidia_roots", lambda: [root])
    assert nvrtc_gate.cuda_include_dir(12) == root / "cu13" / "include"      # the only headers there are
    assert nvrtc_gate.nvrtc_library_candidates() == [root / "cu13" / "lib" / "libnvrtc.so.13"]


def test_library_fallback_tries_so13_then_so12(tmp_path, monkeypatch):
    root = _site(tmp_path, cu12=True, cu13=True)
    monkeypatch.setattr(nvrtc_gate, "_nvidia_roots", lambda: [root])
    assert nvrtc_gate.nvrtc_library_candidates() == [root / "cu13/lib/libnvrtc.so.13",
                                                     root / "cuda_nvrtc/lib/libnvrtc.so.12"]


def test_no_wheel_no_cuda_path_names_both_wheels(tmp_path, monkeypatch):
    monkeypatch.setattr(nvrtc_gate, "_nvidia_roots", lambda: [tmp_path / "empty"])
    monkeypatch.setattr(nvrtc_gate.env, "cuda_homes", lambda: [])
    monkeypatch.setattr(nvrtc_gate.Path, "is_file", lambda self: False)
    with pytest.raises(nvrtc_gate.NvrtcUnavailable, match="nvidia-cuda-runtime-cu12 or nvidia-cuda-runtime 13"):
        nvrtc_gate.cuda_include_dir(13)
    assert nvrtc_gate.nvrtc_library_candidates() == []


def _copy_kernel(dst: Path, body: str = "") -> Path:
    dst.mkdir(parents=True)
    (dst / "part.cuh").write_text("__device__ inline float twice(float x) { return 2.0f * x; }\n" + body)
    (dst / "k.cu").write_text('#include "part.cuh"\n#include "common.cuh"\n'
                              'extern "C" __global__ void k(float* y) { y[threadIdx.x] = twice(y[threadIdx.x]); }\n')
    return dst / "k.cu"


@pytest.mark.skipif(not HAVE_CUPY, reason="cupy is not installed (the key holds NVRTC's version)")
def test_cache_key_holds_no_absolute_path(tmp_path):
    from cupyglm.kernels import cuda

    a, b = _copy_kernel(tmp_path / "one"), _copy_kernel(tmp_path / "elsewhere" / "two")
    assert cuda.cache_key(a, "sm_90") == cuda.cache_key(b, "sm_90")
    assert cuda.cache_key(a, "sm_90", ("-DX",)) == cuda.cache_key(b, "sm_90", ("-DX",))
    assert cuda.cache_key(a, "sm_90", (f"-I{a.parent}",)) == cuda.cache_key(b, "sm_90", (f"-I{b.parent}",))
    # what decides the cubin still changes it: arch, a define, an include's content, a cuda_src copy's place
    assert cuda.cache_key(a, "sm_90") != cuda.cache_key(a, "sm_120")
    assert cuda.cache_key(a, "sm_90") != cuda.cache_key(a, "sm_90", ("-DX",))
    c = _copy_kernel(tmp_path / "three", body="// edited\n")
    assert cuda.cache_key(c, "sm_90") != cuda.cache_key(a, "sm_90")


@pytest.mark.skipif(not HAVE_CUPY, reason="cupy is not installed (the key holds NVRTC's version)")
def test_cuda_src_copy_has_the_checkouts_key(tmp_path):
    from cupyglm.kernels import cuda

    copy = tmp_path / "cuda_src"
    shutil.copytree(nvrtc_gate.CUDA_SRC, copy, ignore=shutil.ignore_patterns("sim"))
    for name in ("gemv.cu", "sample.cu"):
        assert cuda.cache_key(copy / name, "sm_90") == cuda.cache_key(nvrtc_gate.CUDA_SRC / name, "sm_90")
