"""Fill the compiled-kernel disk cache with every compile a launch/gpu-check run needs, in parallel processes.

    python bench/gpu_warm.py [--arch sm_90] [--procs 16] [--only N]

Each job (a cuda_src file, plainly or with one planted control's -D: bench/gpu_plan.py compile_jobs) is one
cupyglm.kernels.cuda.compile_cubin call in a worker process; the slowest files start first. Prints one line a
job and `RESULT warm ok|FAIL ...` last. The arch is the device's when cupy sees one, else --arch.
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gpu_plan import WARM_PROCS, compile_jobs  # noqa: E402
from cupyglm.kernels import CUDA_SRC  # noqa: E402


def _compile(job: tuple[str, tuple[str, ...], str]) -> tuple[str, tuple[str, ...], float, bool, str]:
    name, opts, arch = job
    from cupyglm.kernels import cuda

    t0 = time.perf_counter()
    try:
        key = cuda.cache_key(CUDA_SRC / name, arch, opts)
        cached = (cuda.cache_dir() / f"{Path(name).stem}-{arch}-{key}.cubin").is_file()
        cuda.compile_cubin(CUDA_SRC / name, arch, opts)
        return name, opts, time.perf_counter() - t0, True, "cached" if cached else "compiled"
    except Exception as e:  # noqa: BLE001 (reported per job)
        return name, opts, time.perf_counter() - t0, False, f"{type(e).__name__}: {e}".splitlines()[0]


def _arch(default: str) -> str:
    try:
        from cupyglm.backend import cuda_available
        if cuda_available():
            from cupyglm.kernels.cuda import device_arch
            return device_arch()
    except Exception:  # noqa: BLE001 (no cupy: the given arch)
        pass
    return default


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90", help="when no device is visible")
    ap.add_argument("--procs", type=int, default=WARM_PROCS)
    ap.add_argument("--only", type=int, default=None, help="the N smallest jobs only (a dry run)")
    a = ap.parse_args(argv)
    arch = _arch(a.arch)
    jobs = compile_jobs()
    jobs.sort(key=lambda j: -(CUDA_SRC / j[0]).stat().st_size)       # big files first: the tail is short
    jobs = jobs[-a.only:] if a.only else jobs
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")                       # workers touch NVRTC only, never a device
    bad, fresh, worst = 0, 0, (0.0, "")
    with ctx.Pool(min(a.procs, len(jobs))) as pool:
        for name, opts, dt, ok, msg in pool.imap_unordered(_compile, [(n, o, arch) for n, o in jobs]):
            bad += not ok
            fresh += msg == "compiled"
            worst = max(worst, (dt, " ".join((name, *opts))))
            print(f"{'ok  ' if ok else 'FAIL'} {dt:5.1f}s {name} {' '.join(opts)} {msg}", flush=True)
    wall = time.perf_counter() - t0
    print(f"RESULT warm {'ok' if not bad else 'FAIL'} {arch}: {len(jobs)} compiles ({fresh} new, "
          f"{len(jobs) - fresh - bad} cached, {bad} failed) in {wall:.1f}s on {a.procs} processes, "
          f"slowest {worst[0]:.1f}s ({worst[1]})")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
