"""KV rows in host memory at TP=2 (real `mpirun -n 2` numpy servers): every reply of a CUPYGLM_KV_HOST=1
server equals the device-resident server's, token id for token id.

Prompts of 30, 200 and 1,000 tokens (the tiny model turns sparse at position 35; 1,000 spans two prefill chunks;
its maximum context is 131,072), 64 greedy tokens each; two long prompts at once (sharing calls, each segment gathering alone) reply
as each alone on the device-resident server, with per-rank host rows and with one shared /dev/shm copy per host
(CUPYGLM_KV_HOST_SHARED=1; pages released by one finishing request are leased by the next); the host server also keeps prompts in the host arena
(CUPYGLM_HOST_CACHE=1), and a resumed prompt equals the fresh one."""
from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
from procjob import clients, together

pytestmark = pytest.mark.mpi

BASE = ["--context", "4096", "--parallel", "2"]
HOST = {"CUPYGLM_KV_HOST": "1", "CUPYGLM_KV_HOST_GIB": "0.01"}        # 0.01 GiB = 2 windows of host rows


@pytest.fixture(scope="module")
def servers(start_server):
    out = {"dev": start_server(BASE, wait=False),
           "host": start_server(BASE + ["--prompt-cache-gib", "0.02"], env={**HOST, "CUPYGLM_HOST_CACHE": "1"},
                                wait=False),
           "shared": start_server(BASE, env={**HOST, "CUPYGLM_KV_HOST_SHARED": "1"}, wait=False)}
    yield from together(out, timeout=300)


@pytest.fixture(scope="module")
def http(servers):
    yield from clients(servers, timeout=600)


def ids(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 480, size=n)]


def complete(c, prompt, max_tokens=64) -> tuple[list[int], int]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    p = r.json()
    return p["choices"][0]["token_ids"], p["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_plan_line_names_host_rows(servers):
    assert "latent rows in host memory" in servers["host"].output
    assert "latent rows in host memory" not in servers["dev"].output


def test_shared_host_rows_leave_no_file(servers):
    """CUPYGLM_KV_HOST_SHARED=1: the host's segment is unlinked once both ranks mapped it (before serving)."""
    import os

    token_files = [f for f in os.listdir("/dev/shm") if f.startswith("cupyglm-") and "-kv_host_n" in f]
    assert "latent rows in host memory" in servers["shared"].output and token_files == []


@pytest.mark.parametrize("n", [30, 200, 1000])
def test_tokens_equal_device_resident(http, n):
    p = ids(n, n)
    dev, _ = complete(http["dev"], p)
    host, _ = complete(http["host"], p)
    assert len(dev) == 64 and host == dev
    assert complete(http["shared"], p)[0] == dev


def test_two_long_prompts_at_once_reply_as_alone(http):
    a, b = ids(700, 11), ids(600, 12)
    alone = [complete(http["dev"], p)[0] for p in (a, b)]
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        batched = list(ex.map(lambda p: complete(http["host"], p)[0], (a, b)))
        shared = list(ex.map(lambda p: complete(http["shared"], p)[0], (a, b)))
    assert batched == alone and shared == alone


def test_resumed_equals_fresh_on_host_rows(http):
    p = ids(300, 21)
    first, cached0 = complete(http["host"], p, max_tokens=8)
    q = p + first + ids(40, 22)
    resumed, cached = complete(http["host"], q, max_tokens=16)
    fresh, _ = complete(http["dev"], q, max_tokens=16)
    assert cached0 == 0 and cached >= 256 and resumed == fresh
