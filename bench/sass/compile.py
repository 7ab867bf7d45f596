"""A kernel file compiled exactly as the cuda backend compiles it (cupyglm.kernels.cuda.compile_cubin: NVRTC, the
gate's options, no GPU needed), disassembled with cuobjdump (the nvidia-cuda-cuobjdump wheel), with each
function's registers and static shared memory. Disassemblies are cached on disk by the cubin's hash."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cupyglm import env
from cupyglm.kernels import CUDA_SRC, cuda, nvrtc_gate

from bench.sass import parse


class DisassemblerUnavailable(RuntimeError):
    """No cuobjdump: install the nvidia-cuda-cuobjdump wheel (the project's test extra has it)."""


@dataclass(frozen=True)
class Resources:
    registers: int
    shared: int        # static shared memory of a block, bytes


@functools.lru_cache(maxsize=None)
def cuobjdump() -> Path:
    """The cuobjdump binary: the nvidia-cuda-cuobjdump wheel (CUDA 13 or 12 layout), else a CUDA home's."""
    for sub in ("cu13/bin/cuobjdump", "cuda_cuobjdump/bin/cuobjdump", "cu12/bin/cuobjdump"):
        p = nvrtc_gate._nvidia_dir(sub)
        if p is not None and p.is_file():
            return p
    for home in (*env.cuda_homes(), Path("/usr/local/cuda")):
        if (home / "bin" / "cuobjdump").is_file():
            return home / "bin" / "cuobjdump"
    raise DisassemblerUnavailable("cuobjdump not found: pip install nvidia-cuda-cuobjdump (in the test extra)")


def _whole_elf(cubin: bytes) -> bytes:
    """The cubin padded with zeros to the end its ELF header declares: the cubin cupy's NVRTC binding hands back
    can end a byte short of its program headers, which the driver ignores and cuobjdump rejects."""
    phoff, shoff = struct.unpack_from("<QQ", cubin, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 0x36)
    need = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    return cubin + b"\0" * max(0, need - len(cubin))


def _run(tool: Path, *args: str) -> str:
    # cuobjdump runs nvdisasm, which the wheels install beside it
    path = os.pathsep.join([str(tool.parent), os.environ.get("PATH", "")])
    r = subprocess.run([str(tool), *args], capture_output=True, text=True, check=False, env={**os.environ, "PATH": path})
    if r.returncode != 0:
        raise RuntimeError(f"{tool.name} {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def _resources(text: str) -> dict[str, Resources]:
    out = {}
    for m in re.finditer(r"Function (\S+):\s*\n\s*REG:(\d+)\s+STACK:\d+\s+SHARED:(\d+)", text):
        out[m.group(1)] = Resources(int(m.group(2)), int(m.group(3)))
    return out


def _cache() -> Path:
    d = env.cache_dir() / "sass"
    d.mkdir(parents=True, exist_ok=True)
    return d


def disassemble(cubin_path: Path) -> tuple[str, dict[str, Resources]]:
    """(SASS text, resources by function) of a cubin; cached by the cubin's sha256."""
    data = _whole_elf(cubin_path.read_bytes())
    key = hashlib.sha256(data).hexdigest()[:32]
    cached = _cache() / f"{key}.json"
    if cached.is_file():
        d = json.loads(cached.read_text())
        return d["sass"], {k: Resources(*v) for k, v in d["res"].items()}
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "k.cubin"
        p.write_bytes(data)
        sass = _run(cuobjdump(), "-sass", str(p))
        res = _resources(_run(cuobjdump(), "-res-usage", str(p)))
    fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"sass": sass, "res": {k: [v.registers, v.shared] for k, v in res.items()}}, f)
    os.replace(tmp, cached)
    return sass, res


@dataclass(frozen=True)
class Compiled:
    functions: dict[str, list[parse.Instr]]
    resources: dict[str, Resources]


@functools.lru_cache(maxsize=None)
def compiled(path: str, arch: str = "sm_90", defines: tuple[str, ...] = ()) -> Compiled:
    """A .cu file (a name under cuda_src/, or a path) compiled for arch with -D defines, disassembled."""
    p = Path(path) if os.sep in path else CUDA_SRC / path
    cubin = cuda.compile_cubin(p, arch, tuple(f"-D{d}" for d in defines))
    sass, res = disassemble(Path(cubin))
    return Compiled(parse.functions(sass), res)
