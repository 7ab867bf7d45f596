"""Run a cupyglm CLI with the CuPy double installed (for subprocesses and mpirun, where no fixture can).

    python tests/cupy_double/run.py [--budget BYTES] [--counts] cupyglm.cli.generate --backend cuda ...

Calls MODULE.main(rest of argv) and exits with its status; --counts prints the double's counts at exit
(one `cupy_double counts rank=R ...` line on stderr).
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    sys.path[0] = str(Path(__file__).resolve().parents[1])   # tests/ (not this folder: its cuda.py would shadow `cuda`)
    budget, counts = None, False
    while argv and argv[0].startswith("--"):
        flag = argv.pop(0)
        if flag == "--budget":
            budget = int(argv.pop(0))
        elif flag == "--counts":
            counts = True
        else:
            raise SystemExit(f"run.py: unknown flag {flag}")
    if not argv:
        raise SystemExit("usage: run.py [--budget BYTES] [--counts] MODULE [ARGS...]")
    import cupy_double

    cupy_double.install(budget_bytes=budget)
    module = importlib.import_module(argv[0])
    with cupy_double.counting() as c:
        try:
            rc = module.main(argv[1:])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if counts:
        rank = os.environ.get("PMI_RANK", "0")
        print(f"cupy_double counts rank={rank} {c.line()}", file=sys.stderr, flush=True)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
