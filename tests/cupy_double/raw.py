"""RawModule / RawKernel of the double: a real NVRTC cubin, run by the project's emulator (SimModule).

How a cubin finds its source: `cupy.cuda.nvrtc` in the double is the real NVRTC binding (it needs no GPU)
behind a thin recorder. createProgram records the program's name (cupyglm passes the .cu path),
compileProgram its options, and getCUBIN files sha256(cubin) -> (source path, -D defines) in memory and in
`$CUPYGLM_CACHE_DIR/cupy_double/<sha>.json` (so a cubin cached on disk by an earlier process maps too).
RawModule(path=cubin) hashes the file, looks the source up, and loads it in the emulator with the same
-D defines. The cubin's ELF gives each kernel's static shared memory (`.nv.shared.<kernel>` sections).

CuPy's and the GPU's launch rules, enforced at every launch (RawKernel.__call__):
* an argument is a C-contiguous double ndarray (the kernel gets its pointer) or a numpy scalar; a Python
  int/float/bool (CuPy would pass 64 bits whatever the parameter is), a numpy array (host memory) or a
  non-contiguous view (the kernel would read it as contiguous) raise;
* block: at most 1024 threads, x, y <= 1024, z <= 64; grid: x < 2**31, y, z <= 65535;
* dynamic shared memory <= max_dynamic_shared_size_bytes where raised (static + it <= the device's opt-in
  maximum, cuda.CONFIG's shared_optin), else static + dynamic <= 48 KiB.
Stricter than CuPy (which passes a bare pointer): an array whose dtype is not the pointer's element type
(a float32 array to a `__nv_bfloat16*`, int64 ids to an `int*`) raises, as the kernel would misread it.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from pathlib import Path

import numpy as np

from . import capture
from . import cuda as cuda_mod
from .array import ndarray
from .state import STATE

SHARED_LIMIT = 48 * 1024
# pointer element type -> the dtypes an array bound to it may have
POINTEE = {"float": ("float32",), "double": ("float64",), "__nv_bfloat16": ("uint16", "bfloat16"),
           "__half": ("float16", "uint16"), "int": ("int32",), "unsigned int": ("uint32",), "unsigned": ("uint32",),
           "long long": ("int64",), "unsigned long long": ("uint64",), "unsigned long": ("uint64",),
           "long": ("int64",), "short": ("int16",), "unsigned short": ("uint16",), "char": ("int8", "uint8"),
           "signed char": ("int8",), "unsigned char": ("uint8", "bool"), "bool": ("bool",)}


def _pointee(ctype: str) -> str:
    t = ctype.replace("__restrict__", "").replace("*", "").replace("const", "").strip()
    return " ".join(t.split())
SM90_RESERVED = 1024        # sm_90+ cubins count 1 KiB of system-reserved shared memory in each kernel's section
_SOURCES: dict[str, tuple[str, tuple[str, ...], int]] = {}


class CUDADriverError(RuntimeError):
    """As cupy_backends.cuda.api.driver.CUDADriverError."""


def _registry_dir() -> Path:
    from cupyglm import env

    d = env.cache_dir() / "cupy_double"
    d.mkdir(parents=True, exist_ok=True)
    return d


def record_cubin(cubin: bytes, source: str, options) -> None:
    sha = hashlib.sha256(cubin).hexdigest()
    defines = tuple(o for o in options if isinstance(o, str) and o.startswith("-D"))
    arch = [o.split("sm_")[-1] for o in options if isinstance(o, str) and o.startswith("--gpu-architecture=sm_")]
    sm = int(arch[-1]) if arch else 0
    _SOURCES[sha] = (source, defines, sm)
    path = _registry_dir() / f"{sha}.json"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"source": source, "defines": list(defines), "sm": sm}))
        os.replace(tmp, path)


def _recompiled(sha: str, cubin_path: str) -> bool:
    """A plain compile (no -D) that another process put in the shared kernel cache through the real NVRTC (the
    speed model's): compiled again through this double's NVRTC, which records its source; the file's bytes take it."""
    from cupyglm.kernels import cuda, nvrtc_gate

    stem, _, rest = Path(cubin_path).name.removesuffix(".cubin").partition("-sm_")
    arch, _, key = rest.partition("-")
    src = nvrtc_gate.CUDA_SRC / f"{stem}.cu"
    if not cubin_path or not src.is_file() or cuda.cache_key(src, f"sm_{arch}") != key:
        return False
    ok, _, again = nvrtc_gate.compile_ptx_or_cubin(src, f"sm_{arch}")
    hit = _SOURCES.get(hashlib.sha256(again).hexdigest()) if ok else None
    if hit is not None:
        _SOURCES[sha] = hit
    return hit is not None


def source_of(cubin: bytes, path: str = "") -> tuple[str, tuple[str, ...], int]:
    sha = hashlib.sha256(cubin).hexdigest()
    hit = _SOURCES.get(sha)
    if hit is None:
        if _recompiled(sha, path):
            return _SOURCES[sha]
        path = _registry_dir() / f"{sha}.json"
        if not path.exists():
            raise CUDADriverError(f"CUDA_ERROR_INVALID_IMAGE: cupy double: {path or 'this cubin'} was not compiled "
                                  "through the double's cupy.cuda.nvrtc (a cache filled by a real GPU run?), so "
                                  "its .cu source is unknown; delete it to have it compiled again")
        d = json.loads(path.read_text())
        hit = _SOURCES[sha] = (d["source"], tuple(d["defines"]), int(d.get("sm", 0)))
    return hit


def static_shared(cubin: bytes, sm: int = 0) -> dict[str, int]:
    """kernel name -> bytes of static __shared__ memory, from the ELF64 section headers of a cubin (less the
    system-reserved KiB that sm_90+ sections include)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise CUDADriverError("CUDA_ERROR_INVALID_IMAGE: not an ELF64 cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    stroff = heads[shstrndx][4]

    def name(off):
        end = cubin.index(b"\0", stroff + off)
        return cubin[stroff + off:end].decode()
    out = {}
    for h in heads:
        n = name(h[0])
        if n.startswith(".nv.shared.") and not n.startswith(".nv.shared.reserved"):
            out[n[len(".nv.shared."):]] = max(0, int(h[5]) - (SM90_RESERVED if sm >= 90 else 0))
    return out


class RawModule:
    def __init__(self, code=None, *, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        if path is None:
            raise NotImplementedError("cupy double: RawModule(path=<cubin>) only (cupyglm compiles with NVRTC)")
        cubin = Path(path).read_bytes()
        self.source, self.defines, sm = source_of(cubin, str(path))
        self.shared = static_shared(cubin, sm)
        self.path = str(path)
        from cupyglm.kernels import sim

        if self.defines:
            self._sim = sim.SimModule(self.source, extra_flags=self.defines)
        else:
            self._sim = sim.load_module(self.source)

    def get_function(self, name: str) -> "RawKernel":
        fn = self._sim.get_function(name)               # KeyError names the kernels, as CUDA_ERROR_NOT_FOUND
        return RawKernel._of(fn, self.shared.get(name, 0))


def _dim3(v, what: str) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, (int, np.integer)) for x in t):
        raise ValueError(f"{what} must be an int or a tuple of 1-3 ints, got {v!r}")
    return tuple(int(x) for x in t) + (1,) * (3 - len(t))


class RawKernel:
    def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, jitify=False):
        raise NotImplementedError("cupy double: RawKernel(code, name) is not used by cupyglm; use RawModule")

    @classmethod
    def _of(cls, fn, static: int) -> "RawKernel":
        k = cls.__new__(cls)
        k._fn, k.static_shared = fn, static
        k.name = fn.name
        k._types = None
        k.max_dynamic_shared_size_bytes = SHARED_LIMIT
        return k

    def __call__(self, grid, block, args, *, shared_mem=0, stream=None, enable_cooperative_groups=False):
        g, b = _dim3(grid, "grid"), _dim3(block, "block")
        bad = "CUDA_ERROR_INVALID_VALUE: invalid argument"
        if b[0] * b[1] * b[2] > 1024 or b[0] > 1024 or b[1] > 1024 or b[2] > 64 or min(b) < 1:
            raise CUDADriverError(f"{bad} (kernel {self.name}: block {b} over 1024 threads or a dimension limit)")
        if g[0] >= 2**31 or g[1] > 65535 or g[2] > 65535 or min(g) < 1:
            raise CUDADriverError(f"{bad} (kernel {self.name}: grid {g} beyond (2**31-1, 65535, 65535))")
        # the dynamic cap: the raised attribute, else what 48 KiB leaves past the static; a block's static + that
        # cap within the device's opt-in maximum (cuda.CONFIG's shared_optin)
        raised = self.max_dynamic_shared_size_bytes > SHARED_LIMIT
        cap = self.max_dynamic_shared_size_bytes if raised else SHARED_LIMIT - self.static_shared
        optin = max(int(cuda_mod.CONFIG["shared_optin"]), SHARED_LIMIT)
        if self.static_shared > SHARED_LIMIT or int(shared_mem) > cap or self.static_shared + cap > optin:
            over = self.static_shared + min(cap, optin - self.static_shared)
            raise CUDADriverError(f"{bad} (kernel {self.name}: {self.static_shared} B static + {int(shared_mem)} B "
                                  f"dynamic shared memory over {over} B)")
        limit = max(cap, SHARED_LIMIT)
        if not isinstance(args, tuple):
            raise TypeError(f"kernel {self.name}: args must be a tuple")
        if self._types is None:
            self._types = list(self._fn.param_types)
        host, bufs = [], []
        for i, a in enumerate(args):
            where = f"kernel {self.name} argument {i}"
            if isinstance(a, ndarray):
                if not a.flags.c_contiguous:
                    raise ValueError(f"{where}: a non-contiguous array (the kernel would read it as contiguous)")
                ctype = self._types[i] if i < len(self._types) else ""
                allowed = POINTEE.get(_pointee(ctype)) if ctype.endswith("*") else None
                if allowed is not None and a.dtype.name not in allowed:
                    raise TypeError(f"{where} ({ctype}): a {a.dtype} array; the kernel reads {' or '.join(allowed)}")
                host.append(a._a)
                bufs.append(a._buf)
            elif isinstance(a, np.ndarray):
                raise TypeError(f"Unsupported type {type(a)} ({where}: a host array, not device memory)")
            elif isinstance(a, np.generic):
                host.append(a)
            else:
                raise TypeError(f"{where}: a Python {type(a).__name__} (CuPy passes it as a 64-bit value "
                                "whatever the parameter's type); pass a numpy scalar (np.int32, np.float32)")
        fn, host, shared = self._fn, tuple(host), int(shared_mem)
        fn.max_dynamic_shared_size_bytes = limit         # the opt-in checked above reaches the emulator's kernel
        if capture.record("graph_kernels", self.name, lambda: _run(fn, g, b, host, shared), bufs):
            return                                       # recorded into the capturing stream's graph
        STATE.count("launches", what=self.name)
        _run(fn, g, b, host, shared)


def _run(fn, grid, block, args, shared: int) -> None:
    """Run one kernel in the emulator, its time counted apart from the host's (kernel_ns)."""
    t0 = time.perf_counter_ns()
    try:
        fn(grid, block, args, shared_mem=shared)
    finally:
        STATE.count("kernel_ns", time.perf_counter_ns() - t0)
