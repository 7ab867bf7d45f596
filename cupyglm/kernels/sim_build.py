"""Build step of the CPU emulator (`sim` backend): `.cu` -> shared library.

The `.cu` file is compiled by g++ as C++17 with ``cuda_src/sim/cuemu.h``
force-included.  The translation unit handed to g++ is

    #line 1 "/abs/path/kernel.cu"
    <kernel.cu, with `extern __shared__ T name[];` rewritten, same line count>
    #line 1 "<cuemu-trampolines>"
    <one C-ABI launcher + one signature function per extern "C" __global__ kernel>

so g++ diagnostics name the real ``.cu`` file and line.

Source rewrite (the only one): a dynamic shared memory declaration of exactly
the form ``extern __shared__ [__align__(N)] T [__align__(N)] name[];`` in the
``.cu`` file itself becomes ``T* const name = (T*)::cuemu::dynamic_smem();``.
Any other ``extern __shared__`` form (several names in one declaration, or a
declaration inside an included header) is refused with a message naming the
line.

Kernels are found with a regex over the comment-stripped source: every
``extern "C" __global__ [__launch_bounds__(..)] void NAME(...)``.  Parameter
*types* are not taken from the regex: the trampoline deduces them from the
function type with templates and exports them as strings; only parameter
*names* (for error messages) come from the source text.

Libraries are cached under ``env.cache_dir()/sim`` (``$CUPYGLM_CACHE_DIR``, default
``~/.cache/cupyglm/sim``), keyed by the
sha256 of the compiler identity, flags, cuemu.h and every part it includes
(``cuda_src/sim/cuemu_*.h``), the rewritten source and every local
``#include "..."`` it pulls in (recursively).  Outputs are written to a
unique temporary name and renamed into place, so concurrent builds (pytest-xdist
workers) never see a partial file.
"""

from __future__ import annotations

from cupyglm import env
from cupyglm.backend.tensor_core import DEFAULT_ARCH
import dataclasses
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

ABI_VERSION = "cuemu-1"
CUDA_SRC = Path(__file__).resolve().parents[2] / "cuda_src"
HEADER = CUDA_SRC / "sim" / "cuemu.h"
TC_ARCH = DEFAULT_ARCH

CXXFLAGS = (
    "-std=c++17",
    "-O1",  # the emulator's builds are compile-bound; IEEE semantics hold at any level (no fast-math, no FMA)
    "-fno-fast-math",
    "-ffp-contract=off",  # plain IEEE, no FMA contraction (== NVRTC --fmad=false)
    "-fno-strict-aliasing",  # kernels reinterpret_cast between vector/element types
    "-fwrapv",
    "-fno-weak",  # one TU per library: no COMDAT, so __shared__ statics of inline/template functions share the section
    "-fPIC",
    "-shared",
    "-D__CUEMU__",
    f"-DCUPYGLM_TC_ARCH={TC_ARCH[3:]}",  # the tensor-core model the emulator runs (cuda_src/sim/cuemu_mma.h)
    "-w",
)


class SimError(RuntimeError):
    """Base class of all CPU-emulator errors."""


class SimCompileError(SimError):
    """g++ (or the source rewrite) rejected a kernel file; the message holds the diagnostics."""


@dataclasses.dataclass(frozen=True)
class KernelDecl:
    name: str
    param_names: tuple[str, ...]
    line: int


@dataclasses.dataclass(frozen=True)
class BuildResult:
    so_path: Path
    source_path: Path
    kernels: tuple[KernelDecl, ...]
    key: str


# ---------------------------------------------------------------------------
# Source scanning
# ---------------------------------------------------------------------------


def strip_comments(src: str) -> str:
    """Replace comments by spaces (newlines kept) so offsets and line numbers survive.

    String and character literals are skipped over, not modified.
    """
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c == "/" and i + 1 < n and src[i + 1] == "/":
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c == "/" and i + 1 < n and src[i + 1] == "*":
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(src[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


_KERNEL_RE = re.compile(
    r'\bextern\s*"C"\s+((?:(?:__\w+__|static|inline)(?:\s*\([^()]*\))?\s+)*)void\s+'
    r"(?:__launch_bounds__\s*\([^()]*\)\s*)?([A-Za-z_]\w*)\s*\("
)


def _matching_paren(text: str, open_idx: int) -> int:
    depth = 0
    for k in range(open_idx, len(text)):
        if text[k] == "(":
            depth += 1
        elif text[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    return -1


def _split_params(params: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in params:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def find_kernels(src: str) -> list[KernelDecl]:
    """The ``extern "C" __global__`` kernels of a source text, in order."""
    text = strip_comments(src)
    kernels = []
    for m in _KERNEL_RE.finditer(text):
        if "__global__" not in m.group(1):
            continue
        open_idx = m.end() - 1
        close_idx = _matching_paren(text, open_idx)
        names: list[str] = []
        if close_idx > 0:
            for i, p in enumerate(_split_params(text[open_idx + 1 : close_idx])):
                if p == "void":
                    continue
                p = re.sub(r"\[[^\]]*\]\s*$", "", p)
                ids = re.findall(r"[A-Za-z_]\w*", p)
                names.append(ids[-1] if len(ids) >= 2 else f"arg{i}")
        kernels.append(KernelDecl(m.group(2), tuple(names), text.count("\n", 0, m.start()) + 1))
    return kernels


_ALIGN = r"(?:(?:__align__|alignas)\s*\(\s*\w+\s*\)\s*)"
_DYN_SMEM_RE = re.compile(
    r"\bextern\s+__shared__\s+" + _ALIGN + r"*"
    r"(?P<type>(?:(?:const|volatile|unsigned|signed|struct)\s+)*[A-Za-z_][\w:]*(?:\s+(?:int|long|char|short))*)\s+"
    + _ALIGN
    + r"*(?P<name>[A-Za-z_]\w*)\s*\[\s*\]\s*;"
)


def rewrite_dynamic_shared(src: str, filename: str = "<source>") -> str:
    """Rewrite ``extern __shared__ T name[];`` into a pointer to the dynamic shared buffer.

    The replacement has no newlines, so line numbers do not move.
    """
    text = strip_comments(src)
    out, last = [], 0
    for m in _DYN_SMEM_RE.finditer(text):
        ty = re.sub(r"\s+", " ", m.group("type").strip())
        out.append(src[last : m.start()])
        repl = f"{ty}* const {m.group('name')} = ({ty}*)::cuemu::dynamic_smem();"
        out.append(repl + "\n" * src[m.start() : m.end()].count("\n"))
        last = m.end()
    out.append(src[last:])
    result = "".join(out)
    leftover = re.search(r"\bextern\s+__shared__\b", strip_comments(result))
    if leftover:
        line = strip_comments(result).count("\n", 0, leftover.start()) + 1
        raise SimCompileError(
            f"{filename}:{line}: unsupported dynamic shared memory declaration for the CPU emulator; "
            "write exactly `extern __shared__ T name[];` (one name per declaration, in the .cu file)"
        )
    return result


_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def local_includes(path: Path, include_dirs: list[Path]) -> list[Path]:
    """All files reachable through ``#include "..."`` from path (recursively, resolved)."""
    seen: dict[Path, None] = {}
    stack = [path]
    while stack:
        cur = stack.pop()
        try:
            text = cur.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for inc in _INCLUDE_RE.findall(strip_comments(text)):
            for d in [cur.parent, *include_dirs]:
                cand = (d / inc).resolve()
                if cand.is_file():
                    if cand not in seen:
                        seen[cand] = None
                        stack.append(cand)
                    break
    return sorted(seen)


# ---------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------


def header_parts() -> list[Path]:
    """The files cuemu.h includes (its parts): a change to any of them is a new build key."""
    return local_includes(HEADER, [HEADER.parent])



def cache_dir() -> Path:
    d = env.cache_dir() / "sim"
    d.mkdir(parents=True, exist_ok=True)
    return d


def compiler() -> str:
    return env.cxx()


@functools.lru_cache(maxsize=None)
def _compiler_identity(cxx: str) -> str:
    exe = shutil.which(cxx)
    if exe is None:
        raise SimCompileError(f"C++ compiler {cxx!r} not found (the sim backend needs g++ >= 9; set CUPYGLM_SIM_CXX)")
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:  # pragma: no cover
        raise SimCompileError(f"cannot run {exe} --version: {e}") from e
    return exe + "\n" + out.splitlines()[0] if out else exe


def _trampolines(kernels: list[KernelDecl]) -> str:
    lines = []
    for k in kernels:
        n = k.name
        lines.append(
            f'extern "C" __attribute__((visibility("default"))) int cuemu_launch_{n}('
            "const unsigned* g, const unsigned* b, unsigned long long smem, void** args) "
            f'{{ return ::cuemu::launch<&{n}>("{n}", g, b, smem, args); }}'
        )
        lines.append(
            f'extern "C" __attribute__((visibility("default"))) const char* cuemu_signature_{n}(void) '
            f"{{ return ::cuemu::signature<&{n}>(); }}"
        )
    names = ",".join(k.name for k in kernels)
    lines.append(
        f'extern "C" __attribute__((visibility("default"))) const char* cuemu_kernel_names(void) {{ return "{names}"; }}'
    )
    return "\n".join(lines) + "\n"


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def prepare(path: str | os.PathLike, extra_flags: tuple[str, ...] = ()) -> tuple[str, str, list[KernelDecl], list[str]]:
    """(cache key, translation unit text, kernels, g++ argv without -o/input) for a .cu file."""
    src_path = Path(path).resolve()
    try:
        src = src_path.read_text(encoding="utf-8")
    except OSError as e:
        raise SimCompileError(f"cannot read kernel source {src_path}: {e}") from e
    kernels = find_kernels(src)
    if not kernels:
        raise SimCompileError(f'{src_path}: no `extern "C" __global__` kernel found')
    rewritten = rewrite_dynamic_shared(src, str(src_path))
    tu = (
        f'#line 1 "{src_path}"\n'
        + rewritten
        + ("" if rewritten.endswith("\n") else "\n")
        + '#line 1 "<cuemu-trampolines>"\n'
        + _trampolines(kernels)
    )
    include_dirs = [src_path.parent, CUDA_SRC]
    cxx = compiler()
    argv = [
        cxx,
        *CXXFLAGS,
        *extra_flags,
        "-include",
        str(HEADER),
        *(f"-I{d}" for d in include_dirs),
    ]
    h = hashlib.sha256()
    for part in (ABI_VERSION, _compiler_identity(cxx), " ".join(argv[1:]), HEADER.read_text(), tu):
        h.update(part.encode())
        h.update(b"\0")
    for inc in (*header_parts(), *local_includes(src_path, include_dirs)):
        h.update(str(inc).encode() + b"\0" + inc.read_bytes() + b"\0")
    return h.hexdigest()[:32], tu, kernels, argv


def build(path: str | os.PathLike, extra_flags: tuple[str, ...] = ()) -> BuildResult:
    """Compile (or fetch from the cache) the emulator library for a .cu file."""
    src_path = Path(path).resolve()
    key, tu, kernels, argv = prepare(src_path, tuple(extra_flags))
    d = cache_dir()
    stem = f"{src_path.stem}-{key}"
    so = d / f"{stem}.so"
    if so.is_file():
        return BuildResult(so, src_path, tuple(kernels), key)
    cpp = d / f"{stem}.cpp"
    _atomic_write(cpp, tu.encode())
    fd, tmp_so = tempfile.mkstemp(dir=d, prefix=f"{stem}.", suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run(
            [*argv, "-x", "c++", str(cpp), "-o", tmp_so], capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            msg = proc.stderr.strip() or proc.stdout.strip()
            raise SimCompileError(f"g++ failed to compile {src_path} for the CPU emulator:\n{msg}")
        os.replace(tmp_so, so)
    finally:
        if os.path.exists(tmp_so):
            os.unlink(tmp_so)
    return BuildResult(so, src_path, tuple(kernels), key)
