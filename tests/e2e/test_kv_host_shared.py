"""Shared host KV rows (CUPYGLM_KV_HOST_SHARED=1) under SIGKILL, with real `mpirun -n 2` numpy servers: a rank
killed at startup while its host's ranks map the /dev/shm file (held there by the pause of
tests/observed_serve.py --shm-pause), or killed mid-generation, leaves no `cupyglm-<token>-*` file, and the other rank is gone
too (the launcher ends the job; nothing hangs). During the pause the name is already gone (distributed/shm.py)."""
from __future__ import annotations

import os
import re
import signal
import threading
import time

import httpx
import pytest

from cupyglm.distributed.shm import shm_dir

pytestmark = pytest.mark.mpi

BASE = ["--context", "1024", "--parallel", "2"]
SHARED = {"CUPYGLM_KV_HOST": "1", "CUPYGLM_KV_HOST_GIB": "0.005", "CUPYGLM_KV_HOST_SHARED": "1"}
PAUSE = re.compile(r"shm: local rank (\d) \(pid (\d+)\) pauses \S+ s before mapping cupyglm-([0-9a-f]+)-(kv_host_n\d+)")
SHARED_LINE = re.compile(r"rank (\d): kv host rows shared in \S+/cupyglm-([0-9a-f]+)-\S+ ")


def leftovers(token: str) -> list[str]:
    return sorted(p.name for p in shm_dir().glob(f"cupyglm-{token}-*"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as fh:
            return not fh.read().split(") ")[1].startswith("Z")
    except (ProcessLookupError, FileNotFoundError):
        return False


def ended(s, pids: list[int], timeout: float = 60.0) -> int:
    """The job's exit status once the launcher and every rank are gone (fails on a hang)."""
    rc, _ = s.wait(timeout)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids), f"a rank outlived the job:\n{s.output}"
    return rc


@pytest.mark.parametrize("victim", [0, 1])
def test_sigkill_while_the_host_maps_leaves_no_file(start_server, victim):
    s = start_server(BASE, env=SHARED, wait=False, observe=["--shm-pause", "60"])
    found = s.wait_for(PAUSE.pattern, count=2, timeout=180)
    pids = {int(m.group(1)): int(m.group(2)) for m in found}
    token = found[0].group(3)
    assert leftovers(token) == [], "the name is gone before any rank waits on another"
    os.kill(pids[victim], signal.SIGKILL)
    rc = ended(s, list(pids.values()))
    print(f"killed rank {victim} while mapping: job rc {rc}, /dev/shm cupyglm-{token}-*: {leftovers(token)}")
    assert rc != 0 and leftovers(token) == [], s.output


@pytest.mark.parametrize("victim", [0, 1])
def test_sigkill_mid_generation_leaves_no_file(start_server, victim):
    s = start_server(BASE, env=SHARED, wait=False).wait_serving(timeout=180)
    pids = s.rank_pids()
    token = SHARED_LINE.search(s.wait_for(SHARED_LINE.pattern, count=2)[0].group(0)).group(2)
    assert leftovers(token) == []
    got = []

    def stream():
        body = {"prompt": "count", "max_tokens": 900, "temperature": 0, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{s.base}/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    got.append(line)
        except httpx.HTTPError:
            pass

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    deadline = time.monotonic() + 120
    while sum(1 for x in got if x.startswith("data: {")) < 5 and time.monotonic() < deadline and t.is_alive():
        time.sleep(0.05)
    assert sum(1 for x in got if x.startswith("data: {")) >= 5, (got, s.output)
    os.kill(pids[victim], signal.SIGKILL)
    rc = ended(s, list(pids.values()))
    t.join(timeout=30)
    print(f"killed rank {victim} after {len(got)} stream lines: job rc {rc}, /dev/shm: {leftovers(token)}")
    assert rc != 0 and leftovers(token) == [], s.output
