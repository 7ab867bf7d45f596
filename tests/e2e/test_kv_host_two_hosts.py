"""Shared host KV rows across two hosts, on this one machine: Hydra's fork launcher with `-hosts` gives each rank
a proxy of its own, which PMI reports as its own node (so `Split_type(COMM_TYPE_SHARED)` puts each rank alone on
its host), and each rank runs in its own UTS namespace with its own hostname (`unshare --uts`). With
CUPYGLM_KV_HOST_SHARED=1 each host makes its own /dev/shm file, and the replies equal a device-resident
one-host `mpirun -n 2` server token for token."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

import httpx
import numpy as np
import pytest
from procjob import MPIRUN

pytestmark = pytest.mark.mpi

BASE = ["--context", "1024", "--parallel", "2"]
SHARED = {"CUPYGLM_KV_HOST": "1", "CUPYGLM_KV_HOST_GIB": "0.005", "CUPYGLM_KV_HOST_SHARED": "1"}
HOSTS = ("cupyglm-host-a", "cupyglm-host-b")
LINE = re.compile(r"rank (\d): kv host rows shared in \S+/(cupyglm-[0-9a-f]+-kv_host_n\d) host (\S+) "
                  r"local (\d)/(\d) mappings (\d)/(\d), made and unlinked it")


def can_unshare() -> str | None:
    """None when this process may make a UTS namespace and set its hostname there, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    r = subprocess.run(["unshare", "--uts", "sh", "-c", f"hostname {HOSTS[0]} && hostname"],
                       capture_output=True, text=True)
    if r.returncode != 0 or r.stdout.strip() != HOSTS[0]:
        return f"unshare --uts is not permitted here: {(r.stderr or r.stdout).strip()}"
    return None


def two_hosts_argv(args: list[str]) -> list[str]:
    """`mpiexec -launcher fork -hosts a,b -n 1 <rank on a> : -n 1 <rank on b>`, each rank under its hostname."""
    serve = [sys.executable, "-m", "cupyglm.cli.serve", "--backend", "numpy", "--host", "127.0.0.1", "--port", "0",
             *args]                                          # the e2e conftest's server command
    parts = [["-n", "1", "unshare", "--uts", "sh", "-c", f'hostname {h} && exec "$0" "$@"', *serve] for h in HOSTS]
    return [str(MPIRUN), "-launcher", "fork", "-hosts", ",".join(HOSTS), *parts[0], ":", *parts[1]]


@pytest.fixture(scope="module")
def pair(start_server):
    why = can_unshare()
    if why:
        pytest.skip(why)
    dev = start_server(BASE, wait=False)
    two = start_server(env=SHARED, wait=False, argv=two_hosts_argv(BASE))
    try:
        dev.wait_serving(timeout=300)
        two.wait_serving(timeout=300)
        yield dev, two
    finally:
        two.kill()
        dev.kill()


def complete(s, prompt: list[int]) -> list[int]:
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    r = httpx.post(f"{s.base}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_one_file_per_host_and_the_tokens_of_one_host(pair):
    dev, two = pair
    two.wait_for(LINE.pattern, count=2, timeout=60)
    lines = sorted(LINE.findall(two.output))
    for line in lines:
        print("two hosts:", " ".join(line))
    assert [x[0] for x in lines] == ["0", "1"], two.output
    assert [x[2] for x in lines] == list(HOSTS), "each rank on its own host name"
    assert all(x[3:] == ("0", "1", "1", "1") for x in lines), "each rank alone on its host (local size 1)"
    assert len({x[1] for x in lines}) == 2, "one file per host"
    for n in (30, 200):
        p = [int(t) for t in np.random.default_rng(n).integers(3, 480, size=n)]
        want, got = complete(dev, p), complete(two, p)
        print(f"prompt {n}: device-resident {want[:6]}..., two hosts {got[:6]}...")
        assert len(want) == 24 and got == want
