"""NVRTC compile gate: every ``cuda_src/*.cu`` must compile for sm_80, sm_90 and sm_120.

Uses cupy's low-level NVRTC binding (``cupy.cuda.nvrtc``: createProgram /
compileProgram / getProgramLog), which needs no GPU.  libnvrtc comes from the
NVRTC wheel: CUDA 12's ``nvidia-cuda-nvrtc-cu12`` keeps it at
``site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12``, CUDA 13's ``nvidia-cuda-nvrtc``
at ``site-packages/nvidia/cu13/lib/libnvrtc.so.13``.  cupy's loader (cuda-pathfinder)
finds it by itself; if that ever fails, :func:`nvrtc_module` preloads the wheel's
library (.so.13, then .so.12) with RTLD_GLOBAL and retries.  ``cuda_bf16.h`` comes
from the runtime wheel: ``nvidia/cuda_runtime/include`` (cu12) or
``nvidia/cu13/include`` (cu13), the one matching NVRTC's major version first.
sm_120 needs NVRTC >= 12.8.

CLI: ``cupyglm-nvrtc-gate [FILE.cu ...] [--arch sm_XY ...]`` prints the
file x arch matrix and exits non-zero if any cell fails.
"""

from __future__ import annotations

from cupyglm import env
import argparse
import ctypes
import functools
import importlib.util
import os
import sys
from pathlib import Path

CUDA_SRC = Path(__file__).resolve().parents[2] / "cuda_src"
GATE_ARCHS = ("sm_80", "sm_90", "sm_120")
# Fixed options shared with the GPU loader (cupyglm/kernels/cuda.py).
NVRTC_OPTIONS = ("--fmad=false", "-std=c++17")


class NvrtcUnavailable(RuntimeError):
    """cupy is installed but libnvrtc cannot be loaded."""


# The wheels' layouts under site-packages/nvidia, by CUDA major version: (include dir, libnvrtc).
WHEEL_LAYOUTS = {13: ("cu13/include", "cu13/lib/libnvrtc.so.13"),
                 12: ("cuda_runtime/include", "cuda_nvrtc/lib/libnvrtc.so.12")}


def _nvidia_roots() -> list[Path]:
    """The site-packages/nvidia folders of the installed NVIDIA wheels (a namespace package)."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(loc) for loc in spec.submodule_search_locations]


def _nvidia_dir(sub: str) -> Path | None:
    for root in _nvidia_roots():
        p = root / sub
        if p.exists():
            return p
    return None


def _majors(first: int | None) -> list[int]:
    """CUDA major versions to look under, `first` (NVRTC's own) before the others."""
    return sorted(WHEEL_LAYOUTS, key=lambda m: (m != first, -m))


def nvrtc_library_candidates() -> list[Path]:
    """The wheels' libnvrtc files that exist, .so.13 before .so.12."""
    found = (_nvidia_dir(WHEEL_LAYOUTS[m][1]) for m in _majors(None))
    return [p for p in found if p is not None and p.is_file()]


def _loaded_major() -> int | None:
    try:
        return nvrtc_version()[0]
    except Exception:  # noqa: BLE001  (no NVRTC: any wheel's headers will do for the error message)
        return None


def cuda_include_dir(major: int | None = None) -> Path:
    """Directory holding cuda_bf16.h: a CUDA runtime wheel's (NVRTC's major version first; default: the loaded
    NVRTC's), else $CUDA_PATH/include."""
    for m in _majors(_loaded_major() if major is None else major):
        p = _nvidia_dir(WHEEL_LAYOUTS[m][0])
        if p is not None and (p / "cuda_bf16.h").is_file():
            return p
    for home in env.cuda_homes():
        if (home / "include" / "cuda_bf16.h").is_file():
            return home / "include"
    if Path("/usr/local/cuda/include/cuda_bf16.h").is_file():
        return Path("/usr/local/cuda/include")
    raise NvrtcUnavailable("cuda_bf16.h not found: install nvidia-cuda-runtime-cu12 or nvidia-cuda-runtime 13 "
                           "(or set CUDA_PATH)")


@functools.lru_cache(maxsize=None)
def nvrtc_module():
    """cupy's NVRTC binding with libnvrtc loaded; raises NvrtcUnavailable with the reason."""
    from cupy.cuda import nvrtc  # noqa: F401  (the import itself does not load libnvrtc)

    try:
        nvrtc.getVersion()
        return nvrtc
    except Exception as first:  # noqa: BLE001
        libs = nvrtc_library_candidates()
        if not libs:
            raise NvrtcUnavailable(f"libnvrtc could not be loaded ({first}) and no NVRTC wheel is installed "
                                   "(nvidia-cuda-nvrtc-cu12, or nvidia-cuda-nvrtc 13)") from first
        errors = []
        for lib in libs:
            try:
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
                nvrtc.getVersion()
                return nvrtc
            except Exception as e:  # noqa: BLE001
                errors.append(f"preloading {lib} failed: {e}")
        raise NvrtcUnavailable(f"libnvrtc could not be loaded: {first}; {'; '.join(errors)}") from first


def nvrtc_version() -> tuple[int, int]:
    return tuple(nvrtc_module().getVersion())  # type: ignore[return-value]


def compile_options(arch: str) -> list[str]:
    # CUPYGLM_TC_ARCH names the tensor core the code runs on (the emulator sets the model's; cuda_src/mma.cuh)
    return [f"--gpu-architecture={arch}", *NVRTC_OPTIONS, f"-DCUPYGLM_TC_ARCH={arch.removeprefix('sm_')}",
            f"-I{CUDA_SRC}", f"-I{cuda_include_dir()}"]


def source_with_line(path: Path) -> str:
    """The source prefixed with a #line directive so diagnostics name the real file."""
    text = path.read_text(encoding="utf-8")
    return f'#line 1 "{path}"\n' + text


def compile_ptx_or_cubin(path: str | os.PathLike, arch: str, extra_options: tuple[str, ...] = ()) -> tuple[bool, str, bytes]:
    """Compile with NVRTC: (ok, log, cubin-or-b'')."""
    nvrtc = nvrtc_module()
    p = Path(path).resolve()
    opts = [*compile_options(arch), f"-I{p.parent}", *extra_options]
    prog = nvrtc.createProgram(source_with_line(p), str(p), [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
            ok = True
        except nvrtc.NVRTCError:
            ok = False
        log = nvrtc.getProgramLog(prog)
        cubin = nvrtc.getCUBIN(prog) if ok else b""
        return ok, log, cubin
    finally:
        nvrtc.destroyProgram(prog)


def compile_check(path: str | os.PathLike, arch: str) -> tuple[bool, str]:
    """Compile one file for one arch with NVRTC; (ok, compiler log)."""
    ok, log, _ = compile_ptx_or_cubin(path, arch)
    return ok, log


def gate_files() -> list[Path]:
    return sorted(CUDA_SRC.glob("*.cu"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cupyglm-nvrtc-gate", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="kernel files (default: cuda_src/*.cu)")
    ap.add_argument("--arch", action="append", help=f"arch to check (default: {' '.join(GATE_ARCHS)})")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the NVRTC log of failing cells")
    ns = ap.parse_args(argv)
    archs = ns.arch or list(GATE_ARCHS)
    files = [Path(f) for f in ns.files] or gate_files()
    try:
        ver = nvrtc_version()
    except (ImportError, NvrtcUnavailable) as e:
        print(f"NVRTC unavailable: {e}", file=sys.stderr)
        return 2
    print(f"NVRTC {ver[0]}.{ver[1]}, include {cuda_include_dir()}")
    width = max([len(f.name) for f in files] + [4])
    print(f"{'file':<{width}}  " + "  ".join(f"{a:>7}" for a in archs))
    failed = []
    for f in files:
        cells = []
        for a in archs:
            ok, log = compile_check(f, a)
            cells.append("ok" if ok else "FAIL")
            if not ok:
                failed.append((f, a, log))
        print(f"{f.name:<{width}}  " + "  ".join(f"{c:>7}" for c in cells))
    for f, a, log in failed:
        print(f"\n--- {f} [{a}] ---\n{log.strip() if ns.verbose else log.strip()[:4000]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
