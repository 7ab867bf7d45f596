"""The steps of launch/gpu-check: their time limits (read by the script), expected times, the result files, and
the NVRTC compiles the run needs. One table, so the plan and the limits cannot drift apart.

    python bench/gpu_plan.py --limits                  # "name limit_s keep fill" lines (launch/gpu-check reads)
    python bench/gpu_plan.py --plan [--compile-s 9.5]  # each step's expected time and the total; exit 1 when the
                                                       # run would not fit the budget or the files would not come back
    python bench/gpu_plan.py --jobs                    # the compiles: "file.cu -DNAME ..." a line

The compile count is read from the sources: every cuda_src/*.cu plainly, and once for each -D the contract's
planted controls (and the kernels' own variants) pass whose name the file's includes test.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cupyglm.kernels import CUDA_SRC  # noqa: E402
from cupyglm.kernels.sim_build import local_includes  # noqa: E402

BUDGET_S = 540            # the whole command on the GPU machine (its hard limit is 560 s)
OVERHEAD_S = 15           # start-up of the script, the archive, slack between steps
MAX_FILES = 8             # what comes back from the machine
WARM_PROCS = 16           # the machine's cores: one compile each
DEVICE_CPU_FACTOR = 1.0   # a device core's compile time over this machine's (not assumed faster)
TIMED_FILE = "gemv_q.cu"  # the compile timed by --plan: the slowest file, so every round is priced at the worst


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    limit_s: int          # the step's timeout in launch/gpu-check
    expect_s: float       # expected seconds on one H200 (compile steps: from the timed compile, see expected())
    keep: bool = False    # its log is copied beside the archive (the others are only in logs.tar.gz)
    fill: bool = False    # the last step: it runs for all the time left, its limit the least it is given
    what: str = ""


STEPS = (
    Step("env", 15, 6, what="nvidia-smi, python/numpy/cupy versions, NVRTC version, device"),
    Step("warm", 160, 0, what="every compile the run needs, 16 processes, into the disk cache"),
    Step("contract", 50, 35, keep=True, what="the whole kernel contract on cuda (cubins from the cache)"),
    Step("tcprobe", 15, 5, what="bench/tc_probe.py: the real mma against the tensor core's CPU model, bit for bit"),
    Step("tokens", 60, 45, what="tiny model greedy tokens: cuda eager and CUDA graphs vs numpy"),
    Step("invariance", 15, 8, what="GEMM row 0 bit-identical for batch sizes 1..16"),
    Step("predict", 20, 10, what="bench/sass_model.py --json, or the $PREDICTIONS file made where cuobjdump is"),
    Step("micro", 40, 30, keep=True, what="GB/s of each GEMV form, TFLOP/s of the prompt GEMM, attention"),
    Step("decode", 95, 80, keep=True, what="~1B random model decode tok/s, bf16 + nvfp4, batch 1/4/16, graphs off/on"),
    Step("engine", 30, 20, what="4 concurrent mixed-sampling requests = solo = numpy"),
    Step("sanitizer", 10, 10, fill=True, what="compute-sanitizer memcheck and racecheck on the riskiest kernels"),
)
# Files that come back: SUMMARY, the archive of every step's log, the kept logs, the model's predictions.
OUT_FILES = ("SUMMARY", "logs.tar.gz", *(f"{s.name}.txt" for s in STEPS if s.keep), "predictions.json")

_COND = re.compile(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b(.*)$", re.M)
_NAME = re.compile(r"\b([A-Z][A-Z0-9_]{3,})\b")
_LITERAL = re.compile(r"""["']([A-Z][A-Z0-9_]{3,})["']""")


def _tested_names(path: Path) -> set[str]:
    """Macro names the file and its local includes test in #if / #ifdef / #elif lines."""
    names: set[str] = set()
    for f in [path, *local_includes(path, [path.parent, CUDA_SRC])]:
        for cond in _COND.findall(f.read_text(encoding="utf-8", errors="replace")):
            names.update(_NAME.findall(cond))
    return names


def variant_defines() -> set[str]:
    """The -D names the Python passes: string literals of the contract's cases and the kernels' launchers."""
    pkg = ROOT / "cupyglm"
    files = [*(pkg / "contract").glob("cases_*.py"), *(pkg / "kernels").glob("ops_*.py")]
    return {m for f in files for m in _LITERAL.findall(f.read_text(encoding="utf-8"))}


def compile_jobs() -> list[tuple[str, tuple[str, ...]]]:
    """(file name, extra options) of every compile: each .cu plainly, then with each variant define it tests."""
    defines = variant_defines()
    jobs = []
    for cu in sorted(CUDA_SRC.glob("*.cu")):
        jobs.append((cu.name, ()))
        jobs += [(cu.name, (f"-D{d}",)) for d in sorted(_tested_names(cu) & defines)]
    return jobs


def time_one_compile(name: str = TIMED_FILE, arch: str = "sm_90") -> float:
    """CPU seconds of one uncached NVRTC compile here (NVRTC compiles in this process, on one core: CPU time,
    unlike wall time, does not grow with what else this machine runs)."""
    from cupyglm.kernels import nvrtc_gate

    nvrtc_gate.nvrtc_version()                       # load libnvrtc outside the timing
    t0 = time.process_time()
    ok, log, _ = nvrtc_gate.compile_ptx_or_cubin(CUDA_SRC / name, arch)
    if not ok:
        raise RuntimeError(f"{name} does not compile for {arch}:\n{log}")
    return time.process_time() - t0


def expected(step: Step, n_jobs: int, compile_s: float) -> float:
    """A step's expected seconds on the GPU machine; the warm-up is rounds of WARM_PROCS compiles."""
    if step.name == "warm":
        return 3 + math.ceil(n_jobs / WARM_PROCS) * compile_s * DEVICE_CPU_FACTOR
    return step.expect_s


def plan(compile_s: float, jobs: list | None = None) -> tuple[bool, list[str]]:
    """(fits, lines): every step's limit and expected time, the totals against the budget, the file count."""
    jobs = compile_jobs() if jobs is None else jobs
    plain = sum(1 for _, opts in jobs if not opts)
    lines = [f"compiles: {len(jobs)} ({plain} files plainly + {len(jobs) - plain} variant -D options), "
             f"one compile here {compile_s:.1f} CPU-s ({TIMED_FILE}), x{DEVICE_CPU_FACTOR} on the device, "
             f"{WARM_PROCS} processes",
             f"{'step':<11} {'limit':>6} {'expect':>7}  what"]
    fits, total_limit, total_expect = True, OVERHEAD_S, float(OVERHEAD_S)
    for s in STEPS:
        e = expected(s, len(jobs), compile_s)
        over = e > s.limit_s
        fits &= not over
        total_limit += s.limit_s
        total_expect += e
        lines.append(f"{s.name:<11} {s.limit_s:>5}s {e:>6.0f}s  {s.what}{'  OVER ITS LIMIT' if over else ''}")
    lines.append(f"{'overhead':<11} {OVERHEAD_S:>5}s {OVERHEAD_S:>6}s  start-up, archive, slack")
    fits &= total_limit <= BUDGET_S and total_expect <= BUDGET_S
    lines.append(f"total limits {total_limit}s, expected {total_expect:.0f}s, budget {BUDGET_S}s: "
                 f"{'within' if total_limit <= BUDGET_S and total_expect <= BUDGET_S else 'OVER'}")
    nfiles = len(OUT_FILES)
    fits &= nfiles <= MAX_FILES
    lines.append(f"files back: {nfiles} of at most {MAX_FILES} ({' '.join(OUT_FILES)})")
    lines.append(f"PLAN {'ok' if fits else 'FAIL'}")
    return fits, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--limits", action="store_true")
    g.add_argument("--plan", action="store_true")
    g.add_argument("--jobs", action="store_true")
    ap.add_argument("--compile-s", type=float, default=None, help="one compile's seconds (default: time one)")
    a = ap.parse_args(argv)
    if a.limits:
        print("\n".join(f"{s.name} {s.limit_s} {int(s.keep)} {int(s.fill)}" for s in STEPS))
        print(f"budget {BUDGET_S} 0 0")
        return 0
    if a.jobs:
        print("\n".join(" ".join((f, *o)) for f, o in compile_jobs()))
        return 0
    fits, lines = plan(a.compile_s if a.compile_s is not None else time_one_compile())
    print("\n".join(lines))
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
