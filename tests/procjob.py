"""Test support shared by the mpi and e2e tiers: a launched process group whose merged output a thread
collects, and the environment such jobs run in. (tests/ is on sys.path: pytest puts it there for conftest.py.)"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MPIRUN = Path(sys.executable).parent / "mpirun"


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test process's environment without launcher variables or CUPYGLM_* settings (the session's cache
    dir is kept), plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_", "MPICH_"))
           and (not k.startswith("CUPYGLM_") or k == "CUPYGLM_CACHE_DIR")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class Job:
    """A running command in its own process group; its merged stdout/stderr is collected by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.argv = argv
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for chunk in iter(lambda: self.proc.stdout.read1(4096), b""):
            self._chunks.append(chunk)

    @property
    def output(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 30.0) -> list[re.Match]:
        """The first `count` matches of pattern in the output; fails if the job ends or time runs out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = list(re.finditer(pattern, self.output))
            if len(found) >= count:
                return found
            if self.proc.poll() is not None:
                self._reader.join(timeout=2)
                found = list(re.finditer(pattern, self.output))
                if len(found) >= count:
                    return found
                raise AssertionError(f"job ended (rc {self.proc.returncode}) before {count} x {pattern!r}:\n"
                                     f"{self.output}")
            time.sleep(0.02)
        self.kill()
        raise AssertionError(f"no {count} x {pattern!r} within {timeout} s:\n{self.output}")

    def wait(self, timeout: float) -> tuple[int, float]:
        """(exit status, seconds since start); kills the job's process group if it overruns."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job still running after {timeout} s:\n{self.output}") from None
        self._reader.join(timeout=5)
        return rc, time.monotonic() - self.t0

    def kill(self) -> None:
        """SIGKILL the whole group (also after the launcher is gone, so no rank outlives it)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def together(servers: dict, timeout: float):
    """A module's servers, started with wait=False so they boot side by side: yields them serving, kills them after
    (a generator for a fixture's `yield from`)."""
    for s in servers.values():
        s.wait_serving(timeout=timeout)
    yield servers
    for s in servers.values():
        s.kill()


def clients(servers: dict, timeout: float, **kw):
    """One httpx client a server, closed after (a generator for a fixture's `yield from`)."""
    import httpx

    out = {k: httpx.Client(base_url=s.base, timeout=timeout, **kw) for k, s in servers.items()}
    yield out
    for c in out.values():
        c.close()
