"""Shared host KV rows, both ranks writing (real `mpirun -n 2` numpy servers, CUPYGLM_KV_HOST_SHARED=1 with the
write observer of tests/observed_serve.py --kv-host-writes): in every step both ranks wrote bit-identical rows (the same digest of
layer, row ids and bytes), and with `--parallel 2` a third request leases the pages of a finishing one in the
step right after that one last wrote them (released and leased again within one step message) while the other
request decodes on; every reply equals the device-resident server's, each request alone. The shared server also
keeps prompts and drafts (MTP, 2 drafts), so steps that write host rows before their first all-reduce (kept
states restored into pages, drafts proposed) pass the shared rows' fence (kv/host_rows.py): a resumed prompt
equals the fresh one."""
from __future__ import annotations

import concurrent.futures
import re
import time

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.mpi

BASE = ["--context", "1024", "--parallel", "2"]
SHARED = {"CUPYGLM_KV_HOST": "1", "CUPYGLM_KV_HOST_GIB": "0.005", "CUPYGLM_KV_HOST_SHARED": "1"}
LINE = re.compile(r"rank (\d): kv host step (\d+) wrote (\d+) rows sha ([0-9a-f]+); (\d+) pages another request "
                  r"wrote in step \d+")


@pytest.fixture(scope="module")
def servers(start_server):
    dev = start_server(BASE, wait=False)
    shared = start_server(BASE + ["--prompt-cache-gib", "0.02", "--mtp-drafts", "2"], env=SHARED, wait=False,
                          observe=["--kv-host-writes"])
    dev.wait_serving(timeout=300)
    shared.wait_serving(timeout=300)
    yield dev, shared
    shared.kill()
    dev.kill()


def ids(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 480, size=n)]


def complete(s, prompt, max_tokens) -> list[int]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    r = httpx.post(f"{s.base}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def steps(out: str) -> dict[int, dict[int, tuple[int, str, int]]]:
    """rank -> step -> (rows written, digest, pages reused from the step before)."""
    got: dict[int, dict[int, tuple[int, str, int]]] = {0: {}, 1: {}}
    for rank, step, rows, sha, reused in LINE.findall(out):
        got[int(rank)][int(step)] = (int(rows), sha, int(reused))
    return got


def logged(s, least: int = 1) -> dict[int, dict[int, tuple[int, str, int]]]:
    """The check lines once both ranks have logged the same steps (at least `least`)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = steps(s.output)
        if got[0].keys() == got[1].keys() and len(got[0]) >= least:
            return got
        time.sleep(0.1)
    return steps(s.output)


def test_pages_released_and_leased_in_one_step_reply_as_alone(servers):
    dev, shared = servers
    jobs = [(ids(300, 1), 4), (ids(200, 2), 48), (ids(250, 3), 16)]      # A ends first; C then takes its pages
    alone = [complete(dev, p, m) for p, m in jobs]
    before = len(steps(shared.output)[0])
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        futs = []
        for p, m in jobs:
            futs.append(ex.submit(complete, shared, p, m))
            time.sleep(0.3)                                                  # A, B admitted before C arrives
        together = [f.result() for f in futs]
    got = logged(shared, before + 1)
    reused = {s: got[1][s][2] for s in got[1] if got[1][s][2]}
    print(f"{len(got[0])} steps logged by each rank; rows written {sum(v[0] for v in got[0].values())}; "
          f"steps where a page was leased right after another request wrote it: {reused}")
    assert got[0].keys() == got[1].keys() and got[0], shared.output[-3000:]
    differ = [s for s in got[0] if got[0][s][:2] != got[1][s][:2]]
    assert differ == [], f"ranks wrote different rows in steps {differ}"
    assert together == alone
    assert reused, "no page was released and leased again within one step"


def test_resumed_prompt_through_the_fence_equals_fresh(servers):
    dev, shared = servers
    p = ids(200, 7)
    first = complete(shared, p, 8)
    q = p + first + ids(30, 8)
    body = {"prompt": q, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    r = httpx.post(f"{shared.base}/v1/completions", json=body, timeout=300).json()
    cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
    print(f"resumed with {cached} cached tokens")
    assert cached > 0 and r["choices"][0]["token_ids"] == complete(dev, q, 16)
    got = logged(shared)
    assert got[0].keys() == got[1].keys() and [s for s in got[0] if got[0][s][:2] != got[1][s][:2]] == []
