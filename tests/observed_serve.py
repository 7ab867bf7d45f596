"""cupyglm-serve with a test's observers wired in: what mpirun runs in place of `python -m cupyglm.cli.serve` when
an e2e test watches or provokes something inside the ranks. The server is the same; only the observers differ.

    mpirun -n 2 python tests/observed_serve.py [observer flags] -- [cupyglm-serve flags]

Observer flags: --kv-host-writes (each rank logs a digest of the host KV rows it wrote in each step),
--kv-host-slots N (fewer gather slots than the plan's), --disk-write-pause S (the disk writer sleeps half way
through each file), --shm-pause S (each rank says so on stderr and sleeps before mapping a shared segment).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cupyglm.cli import serve  # noqa: E402
from cupyglm.engine.build import Observers  # noqa: E402


def shm_pause(seconds: float):
    def before_map(local_rank: int, name: str) -> None:
        # one write: the ranks' lines share the launcher's output
        sys.stderr.write(f"shm: local rank {local_rank} (pid {os.getpid()}) pauses {seconds:g} s before mapping "
                         f"{name}\n")
        sys.stderr.flush()
        time.sleep(seconds)
    return before_map


def observers(argv: list[str]) -> Observers:
    p = argparse.ArgumentParser(prog="observed_serve")
    p.add_argument("--kv-host-writes", action="store_true")
    p.add_argument("--kv-host-slots", type=int, default=None)
    p.add_argument("--disk-write-pause", type=float, default=0.0)
    p.add_argument("--shm-pause", type=float, default=0.0)
    a = p.parse_args(argv)
    return Observers(kv_host_writes=a.kv_host_writes, kv_host_slots=a.kv_host_slots,
                     disk_write_pause_s=a.disk_write_pause,
                     shm_before_map=shm_pause(a.shm_pause) if a.shm_pause > 0 else None)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        raise SystemExit("observed_serve: observer flags, then --, then the server's flags")
    cut = argv.index("--")
    return serve.main(argv[cut + 1:], observers=observers(argv[:cut]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
