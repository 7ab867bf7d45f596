"""compute-sanitizer over the riskiest kernels' contract cases, within a time box.

    python bench/gpu_sanitize.py --seconds 60 [--backend cuda]

memcheck on the kernels that index through tables (gather, kv, indexer, moe_decode), racecheck on those that
share memory between warps (sample, gemv); each tool gets half the time. A run cut by the time box reports
what it checked so far; the step fails only when the sanitizer reports an error. Exit 75 (and `RESULT
sanitizer SKIP`) when compute-sanitizer is not installed.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cupyglm import env  # noqa: E402

SKIP = 75
TOOLS = (("memcheck", "gather*,kv*,indexer*,moe_decode*"), ("racecheck", "sample*,gemv*"))
_ERRORS = re.compile(r"ERROR SUMMARY: (\d+) error")


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in [*env.cuda_homes(), *sorted(Path("/usr/local").glob("cuda*"), reverse=True)]:
        p = home / "bin" / "compute-sanitizer"
        if p.is_file():
            return str(p)
    return None


def run_tool(exe: str, tool: str, kernels: str, seconds: float, backend: str) -> tuple[int | None, str]:
    """(errors reported, or None when none was summarised; a one-line account)."""
    cmd = [exe, "--tool", tool, "--error-exitcode", "9", sys.executable, "-m", "cupyglm.cli.contract",
           "--backend", backend, "--kernels", kernels]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
        out, cut = p.stdout + p.stderr, False
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        out += (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        cut = True
    print(out[-6000:])
    cases = sum(1 for line in out.splitlines() if line.startswith(("PASS ", "FAIL ")))
    m = _ERRORS.findall(out)
    errors = int(m[-1]) if m else None
    dt = time.perf_counter() - t0
    how = f"cut at {dt:.0f}s" if cut else f"{dt:.0f}s"
    return errors, f"{tool} {kernels}: {cases} cases, {'?' if errors is None else errors} errors ({how})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--backend", default="cuda")
    a = ap.parse_args(argv)
    exe = find_sanitizer()
    if exe is None:
        print("RESULT sanitizer SKIP compute-sanitizer not found (PATH, CUDA_PATH, /usr/local/cuda*)")
        return SKIP
    results = [run_tool(exe, tool, kernels, a.seconds / len(TOOLS), a.backend) for tool, kernels in TOOLS]
    bad = any(e for e, _ in results)
    print(f"RESULT sanitizer {'FAIL' if bad else 'ok'} " + "; ".join(line for _, line in results))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
