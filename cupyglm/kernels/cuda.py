"""GPU loader: one ``cupy.RawModule`` per ``cuda_src`` file.

* NVRTC options are fixed (shared with the compile gate):
  ``--gpu-architecture=sm_XY`` of the current device, ``--fmad=false``,
  ``-std=c++17``, ``-I<cuda_src>``, ``-I<dir of the .cu>`` and the include dir
  of ``cuda_bf16.h`` (a CUDA 12 or 13 runtime wheel: nvrtc_gate.cuda_include_dir).
* The source is prefixed with ``#line 1 "<path>"`` so NVRTC errors name the
  ``.cu`` file and line; a failed compile raises :class:`CudaCompileError` with
  the NVRTC log.
* We compile to a cubin ourselves through ``cupy.cuda.nvrtc`` and load it with
  ``cupy.RawModule(path=...)``; cupy's own kernel cache is not involved.  Cubins
  are cached on disk under ``env.cache_dir()/cuda`` (``$CUPYGLM_CACHE_DIR``,
  default ``~/.cache/cupyglm/cuda``), keyed by :func:`cache_key`: sha256 of the
  source and its local includes (each by relative name + content), the options
  without ``-I`` paths, the arch and the NVRTC version -- no absolute path, so a
  cache filled from another checkout (or machine) is reused; written to a
  temporary name and renamed into place.  Within a process each
  (file, device arch) is loaded once.

``import cupy`` happens only inside functions: this module imports without cupy.
"""

from __future__ import annotations

from cupyglm import env
import functools
import hashlib
import os
import tempfile
from pathlib import Path

from . import nvrtc_gate
from .sim_build import local_includes


class CudaCompileError(RuntimeError):
    """NVRTC rejected a kernel file; the message holds the NVRTC log."""


def cache_dir() -> Path:
    d = env.cache_dir() / "cuda"
    d.mkdir(parents=True, exist_ok=True)
    return d


def device_arch() -> str:
    """``sm_XY`` of the current cupy device."""
    import cupy

    cc = cupy.cuda.Device().compute_capability  # e.g. "90"
    return f"sm_{cc}"


def _relative_name(path: Path, bases: list[Path]) -> str:
    """path relative to the first base holding it (an include's name as the source spells it)."""
    for b in bases:
        if path.is_relative_to(b):
            return path.relative_to(b).as_posix()
    return path.name


def cache_key(path: str | os.PathLike, arch: str, extra_options: tuple[str, ...] = ()) -> str:
    """The disk cache's key of one compile: what decides the cubin and nothing of where the files lie (no
    absolute path: include directories are dropped, the includes themselves hashed by relative name)."""
    p = Path(path).resolve()
    opts = [o for o in (*nvrtc_gate.compile_options(arch), *extra_options) if not o.startswith("-I")]
    h = hashlib.sha256()
    h.update(repr((opts, arch, nvrtc_gate.nvrtc_version())).encode())
    h.update(p.name.encode() + b"\0" + p.read_bytes())
    bases = [p.parent, nvrtc_gate.CUDA_SRC.resolve()]
    for inc in local_includes(p, bases):
        h.update(b"\0" + _relative_name(inc, bases).encode() + b"\0" + inc.read_bytes())
    return h.hexdigest()[:32]


def compile_cubin(path: str | os.PathLike, arch: str, extra_options: tuple[str, ...] = ()) -> Path:
    """Compile (or fetch from the disk cache) the cubin of path for arch (extra_options: e.g. -D of a planted
    control; part of the cache key, so no temporary cubin is ever left outside the cache)."""
    p = Path(path).resolve()
    out = cache_dir() / f"{p.stem}-{arch}-{cache_key(p, arch, tuple(extra_options))}.cubin"
    if out.is_file():
        return out
    ok, log, cubin = nvrtc_gate.compile_ptx_or_cubin(p, arch, tuple(extra_options))
    if not ok:
        flags = f" with {' '.join(extra_options)}" if extra_options else ""
        raise CudaCompileError(f"NVRTC failed to compile {p} for {arch}{flags}:\n{log}")
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


class CudaModule:
    """A compiled ``.cu`` file on the current GPU; ``get_function`` returns a ``cupy.RawKernel``."""

    def __init__(self, path: str | os.PathLike, arch: str | None = None, extra_options: tuple[str, ...] = ()):
        import cupy

        self.path = Path(path).resolve()
        self.arch = arch or device_arch()
        self.cubin_path = compile_cubin(self.path, self.arch, tuple(extra_options))
        self.raw_module = cupy.RawModule(path=str(self.cubin_path))

    def get_function(self, name: str):
        return self.raw_module.get_function(name)


@functools.lru_cache(maxsize=None)
def _load(path: Path, arch: str, mtime_ns: int) -> CudaModule:
    return CudaModule(path, arch)


def load_module(path: str | os.PathLike) -> CudaModule:
    """Process-wide cached :class:`CudaModule` for path on the current device."""
    p = Path(path).resolve()
    return _load(p, device_arch(), p.stat().st_mtime_ns)
