"""Shared fixtures. Every test session runs with CUPYGLM_CACHE_DIR in a session temp dir, so no test touches
the user's home cache; `tiny_dir` / `tiny_ckpt` are the built-in tiny checkpoint built there once."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory, request):
    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):       # pytest-xdist: workers share one cache (and race to build)
        root = root.parent
    cache = root / "cupyglm-cache"
    cache.mkdir(parents=True, exist_ok=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("CUPYGLM_CACHE_DIR", str(cache))
    yield cache
    mp.undo()


@pytest.fixture(scope="session")
def tiny_dir(_session_cache_dir):
    from cupyglm.checkpoint.tiny import default_tiny_dir

    return default_tiny_dir()


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_dir):
    from cupyglm.checkpoint.loader import Checkpoint

    return Checkpoint.open(tiny_dir)


# ---- /dev/shm as the suite found it -----------------------------------------------------------------------------
# The whole session (the xdist controller, or the only process) fails when it leaves a new mpich_shm_* or cupyglm-*
# file in /dev/shm that no live process maps: every mpirun job of the suite, killed or not, must leave none.

def _shm_files() -> set[str]:
    import os
    import re

    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return set()
    return {n for n in names if re.match(r"^(mpich_shm_[0-9a-f]+_\d+|cupyglm-.+)$", n)}


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):
        session.config._shm_before = _shm_files()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_shm_before", None)
    if before is None:
        return
    import time

    from cupyglm.distributed.mpich_shm import mapped_by

    time.sleep(0.5)                      # a job torn down by the last test may still be unmapping
    mapped: set[str] = set()
    from pathlib import Path

    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            mapped |= {Path(p).name for p in mapped_by(entry.name) or ()}
    left = sorted(n for n in _shm_files() - before if n not in mapped and (Path("/dev/shm") / n).exists())
    if left:
        session.config.get_terminal_writer().line(
            f"FAILED: the test session left {len(left)} new file(s) in /dev/shm: {', '.join(left)}", red=True)
        session.exitstatus = 1
