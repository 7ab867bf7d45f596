"""Fixtures for the server tests.

`start_server(args)` launches the real `mpirun -n 2 python -m cupyglm.cli.serve --port 0 ...` in its own process
group, waits for the `serving ... at http://HOST:PORT/v1` line and returns a `Server` (url, port, pids, output);
teardown kills the group. `server` is one such server shared by a test module.
"""
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
SERVING = re.compile(r"serving (\S+) at (http://[^\s/]+:(\d+)/v1) \(")
RANK_PID = re.compile(r"rank (\d+): pid (\d+)")
START_TIMEOUT_S = 120.0


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_", "MPICH_"))
           and (not k.startswith("CUPYGLM_") or k == "CUPYGLM_CACHE_DIR")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class Server:
    def __init__(self, argv: list[str], env: dict[str, str]):
        self.argv = argv
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = self.base = ""
        self.port = 0
        self.model = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for chunk in iter(lambda: self.proc.stdout.read1(4096), b""):
            self._chunks.append(chunk)

    @property
    def output(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def wait_serving(self, timeout: float = START_TIMEOUT_S) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = SERVING.search(self.output)
            if m:
                self.model, self.url, self.port = m.group(1), m.group(2), int(m.group(3))
                self.base = self.url[: -len("/v1")]
                return self
            if self.proc.poll() is not None:
                self._reader.join(timeout=2)
                raise AssertionError(f"server exited (rc {self.proc.returncode}) before serving:\n{self.output}")
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"no serving line within {timeout} s:\n{self.output}")

    def rank_pids(self, count: int = 2, timeout: float = 30.0) -> dict[int, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = {int(r): int(p) for r, p in RANK_PID.findall(self.output)}
            if len(pids) >= count:
                return pids
            time.sleep(0.05)
        raise AssertionError(f"no pid lines for {count} ranks:\n{self.output}")

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"server still running after {timeout} s:\n{self.output}") from None
        self._reader.join(timeout=5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        else:   # mpirun gone; make sure no rank outlives it
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture(scope="session")
def start_server(tiny_dir, _session_cache_dir):
    if not MPIRUN.exists():
        pytest.skip(f"no mpirun beside {sys.executable}")
    servers: list[Server] = []

    def start(args: list[str] = (), ranks: int = 2, env: dict[str, str] | None = None, wait: bool = True) -> Server:
        argv = [str(MPIRUN), "-n", str(ranks), sys.executable, "-m", "cupyglm.cli.serve", "--backend", "numpy",
                "--host", "127.0.0.1", "--port", "0", *args]
        s = Server(argv, job_env({"CUPYGLM_CACHE_DIR": str(_session_cache_dir), **(env or {})}))
        servers.append(s)
        return s.wait_serving() if wait else s

    yield start
    for s in servers:
        s.kill()


SERVER_ARGS = ["--context", "256", "--parallel", "4", "--max-queue", "8", "--max-body-bytes", "65536"]


@pytest.fixture(scope="module")
def server(start_server):
    s = start_server(SERVER_ARGS)
    yield s
    s.kill()


@pytest.fixture(scope="session")
def server_args() -> list[str]:
    return list(SERVER_ARGS)
