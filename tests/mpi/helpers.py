"""Helpers for tests that launch real `mpirun` jobs (MPICH's Hydra from the venv's bin)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MPIRUN = Path(sys.executable).parent / "mpirun"
SELFCHECK = [sys.executable, "-m", "cupyglm.dist.selfcheck", "--backend", "numpy"]


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test process's environment without CUPYGLM_* or launcher variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUPYGLM_", "PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_", "MPICH_"))}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


@pytest.fixture(scope="session")
def mpirun() -> Path:
    if not MPIRUN.exists():
        pytest.skip(f"no mpirun beside {sys.executable}")
    return MPIRUN


class Job:
    """A running mpirun whose merged output is collected by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.argv = argv
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for chunk in iter(lambda: self.proc.stdout.read1(4096), b""):
            self._chunks.append(chunk)

    @property
    def output(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 30.0) -> list[re.Match]:
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
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)


@pytest.fixture
def launch(mpirun):
    jobs: list[Job] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> Job:
        job = Job([str(mpirun), *args], job_env(env))
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()


def run_job(launch, args: list[str], env: dict[str, str] | None = None,
            timeout: float = 60.0) -> tuple[int, str, float]:
    job = launch(args, env)
    rc, took = job.wait(timeout)
    return rc, job.output, took
