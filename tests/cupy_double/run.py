"""Run a cupyglm CLI with the CuPy double installed (for subprocesses and mpirun, where no fixture can).

    python tests/cupy_double/run.py [--budget BYTES] [--counts] [--counts-dir DIR] cupyglm.cli.generate ...

Calls MODULE.main(rest of argv) and exits with its status; --counts prints the double's counts at exit
(one `cupy_double counts rank=R ...` line on stderr); --counts-dir DIR also writes that line to DIR/rank-R
(launchers may merge or drop the ranks' last stderr lines).
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    sys.path[0] = str(Path(__file__).resolve().parents[1])   # tests/ (not this folder: its cuda.py would shadow `cuda`)
    budget, counts, counts_dir = None, False, None
    while argv and argv[0].startswith("--"):
        flag = argv.pop(0)
        if flag == "--budget":
            budget = int(argv.pop(0))
        elif flag == "--counts":
            counts = True
        elif flag == "--counts-dir":
            counts, counts_dir = True, Path(argv.pop(0))
        else:
            raise SystemExit(f"run.py: unknown flag {flag}")
    if not argv:
        raise SystemExit("usage: run.py [--budget BYTES] [--counts] [--counts-dir DIR] MODULE [ARGS...]")
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
        line = f"cupy_double counts rank={rank} {c.line()}"
        print(line, file=sys.stderr, flush=True)
        if counts_dir is not None:
            (counts_dir / f"rank-{rank}").write_text(line + "\n")
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
