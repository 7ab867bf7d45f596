"""Fixtures for the server tests.

`start_server(args)` launches the real `mpirun -n 2 python -m cupyglm.cli.serve --port 0 ...` in its own process
group, waits for the `serving ... at http://HOST:PORT/v1` line and returns a `Server` (url, port, pids, output);
teardown kills the group. With `observe` (tests/observed_serve.py's flags) the ranks run the same server with a
test's observers wired in. `server` is one such server shared by a test module.
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from procjob import MPIRUN, Job, job_env

SERVING = re.compile(r"serving (\S+) at (http://[^\s/]+:(\d+)/v1) \(")
RANK_PID = re.compile(r"rank (\d+): pid (\d+)")
START_TIMEOUT_S = 120.0
SERVE_FLAGS = ["--backend", "numpy", "--host", "127.0.0.1", "--port", "0"]
SERVE = [sys.executable, "-m", "cupyglm.cli.serve", *SERVE_FLAGS]
OBSERVED = [sys.executable, str(Path(__file__).resolve().parents[1] / "observed_serve.py")]


class Server(Job):
    """The server job: `wait_serving()` fills url, base, port and model from its serving line."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        super().__init__(argv, env)
        self.url = self.base = ""
        self.port = 0
        self.model = ""

    def wait_serving(self, timeout: float = START_TIMEOUT_S) -> "Server":
        m = SERVING.search(self.wait_for(SERVING.pattern, timeout=timeout)[0].group(0))
        self.model, self.url, self.port = m.group(1), m.group(2), int(m.group(3))
        self.base = self.url[: -len("/v1")]
        return self

    def rank_pids(self, count: int = 2, timeout: float = 30.0) -> dict[int, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = {int(r): int(p) for r, p in RANK_PID.findall(self.output)}
            if len(pids) >= count:
                return pids
            time.sleep(0.05)
        raise AssertionError(f"no pid lines for {count} ranks:\n{self.output}")


@pytest.fixture(scope="session")
def start_server(tiny_dir, _session_cache_dir):
    if not MPIRUN.exists():
        pytest.skip(f"no mpirun beside {sys.executable}")
    servers: list[Server] = []

    def start(args: list[str] = (), ranks: int = 2, env: dict[str, str] | None = None, wait: bool = True,
              argv: list[str] | None = None, observe: list[str] = ()) -> Server:
        """`argv` replaces the whole command line (a launch of its own); `args` are the server's flags; `observe`
        the observers' (tests/observed_serve.py)."""
        serve = [*OBSERVED, *observe, "--", *SERVE_FLAGS] if observe else SERVE
        argv = argv or [str(MPIRUN), "-n", str(ranks), *serve, *args]
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


@pytest.fixture(scope="module")
def client(server):
    """The real openai client against the module's server."""
    with openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def server_args() -> list[str]:
    return list(SERVER_ARGS)
