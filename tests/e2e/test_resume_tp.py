"""The resume gates at TP=2 (real `mpirun -n 2` servers, numpy): every reply of a server with the prompt cache
equals the same request on a cold server (`--prompt-cache-gib 0`), token id for token id.

Servers: `warm` (room for every state), `tight` (a budget a few states overflow, kept in the host arena:
CUPYGLM_HOST_CACHE=1), `share` (kept prompts as KV pool pages: CUPYGLM_KV_SHARE=16), `cold` (the cache-off
control). `--prefill-chunk` is the keep grid, so every grid point of a prompt is a keep point."""
from __future__ import annotations

import concurrent.futures
import re
import signal

import httpx
import numpy as np
import pytest
from procjob import clients, together

pytestmark = pytest.mark.mpi

GRID = 64                                  # the tiny model's keep grid
BASE = ["--context", "512", "--parallel", "4", "--prefill-chunk", str(GRID)]


@pytest.fixture(scope="module")
def servers(start_server):
    out = {"warm": start_server(BASE + ["--prompt-cache-gib", "0.05"], wait=False),
           "tight": start_server(BASE + ["--prompt-cache-gib", "0.0006"], env={"CUPYGLM_HOST_CACHE": "1"},
                                 wait=False),
           "share": start_server(BASE + ["--prompt-cache-gib", "0.05"], env={"CUPYGLM_KV_SHARE": "16"},
                                 wait=False),
           "cold": start_server(BASE + ["--prompt-cache-gib", "0"], wait=False)}
    yield from together(out, timeout=120)


@pytest.fixture(scope="module")
def http(servers):
    yield from clients(servers, timeout=120)


def ids(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 480, size=n)]


def complete(c, prompt, max_tokens=4, **kw) -> tuple[list[int], int, str | None]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, **kw}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    p = r.json()
    return p["choices"][0]["token_ids"], p["usage"]["prompt_tokens_details"]["cached_tokens"], \
        p["usage"].get("cache_miss_reason")


@pytest.fixture(scope="module")
def cold(http):
    """The cold server's reply to a prompt, asked once a module: with no cache and greedy or seeded sampling it is
    the same every time, and gates 2 and 4 (and both arms of gate 5) compare against the same prompts."""
    replies = {}

    def reply(prompt, **kw):
        key = (tuple(prompt), tuple(sorted(kw.items())))
        if key not in replies:
            replies[key] = complete(http["cold"], prompt, **kw)
        return replies[key]

    return reply


def metric(c, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", c.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_cache_off_control(servers, http):
    assert "no prompt cache" in servers["cold"].output
    assert re.search(r"prompt cache 0\.05 GiB", servers["warm"].output)
    p = ids(100, 1)
    for turn in range(3):
        _, cached, miss = complete(http["cold"], p)
        assert (cached, miss) == (0, "cache off")
        p = p + ids(20, 10 + turn)


def test_gate1_three_turn_chat(http):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}]
    seen = []
    for turn, ask in enumerate(["And a fruit?", "And a tree?", None]):
        body = {"messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        warm, cold = (http[k].post("/v1/chat/completions", json=body).json() for k in ("warm", "cold"))
        assert warm["choices"][0]["token_ids"] == cold["choices"][0]["token_ids"], turn
        cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        seen.append((warm["usage"]["prompt_tokens"], cached))
        if ask is None:
            break
        messages = messages + [{"role": "assistant", "content": warm["choices"][0]["message"]["content"]},
                               {"role": "user", "content": ask}]
    print("three-turn chat (prompt tokens, cached):", seen)
    assert seen[0][1] == 0 and 0 < seen[1][1] < seen[1][0] and seen[1][1] < seen[2][1] < seen[2][0]


def test_gate2_resumed_equals_fresh_at_keep_points(http, cold):
    base = ids(460, 2)
    complete(http["warm"], base, max_tokens=1)                 # kept at 64, 128, ..., 448 and at 460
    for keep in (GRID, 2 * GRID, 7 * GRID, 460):
        prompt = base[:keep] + ids(9, keep)
        got = complete(http["warm"], prompt)
        assert got[1] == keep, keep
        assert got[0] == cold(prompt)[0], keep


def test_gate3_host_arena_resumed_equals_fresh(servers, http, cold):
    assert "in host memory" in servers["tight"].output
    base = ids(140, 7)
    complete(http["tight"], base, max_tokens=1)               # kept at 64, 128 and 140 in the host arena
    for keep in (GRID, 2 * GRID, 140):
        prompt = base[:keep] + ids(5, 300 + keep)
        got = complete(http["tight"], prompt)
        assert got[1] == keep and got[0] == cold(prompt)[0], keep


def idle_pages(c) -> tuple[float, float, float]:
    """(free KV pages, pages the kept prompts hold, total) from /metrics."""
    return tuple(metric(c, f"cupyglm:{m}") for m in ("kv_free_pages", "prefix_cache_kv_pages", "kv_total_pages"))


def share_cell2(c, cold) -> list[float]:
    """Gate 2's cell on a page-sharing server; the idle check after every reply: free + the store's = total."""
    base = ids(460, 2)
    complete(c, base, max_tokens=1)
    held = []
    for keep in (GRID, 2 * GRID, 7 * GRID, 460):
        prompt = base[:keep] + ids(9, keep)
        got = complete(c, prompt)
        assert got[1] == keep, keep
        assert got[0] == cold(prompt)[0], keep
        free, store, total = idle_pages(c)
        assert free + store == total and store >= 460 // 16, (keep, free, store, total)
        held.append(store)
    return held


def test_gate4_shared_pages_resumed_equals_fresh_and_all_free_at_stop(start_server, cold):
    s = start_server(BASE + ["--prompt-cache-gib", "0.05", "--kv-pages", "40"], env={"CUPYGLM_KV_SHARE": "16"})
    try:
        with httpx.Client(base_url=s.base, timeout=120) as c:
            held = share_cell2(c, cold)
            fresh, evicted = ids(400, 77), metric(c, "cupyglm:prefix_cache_evictions_total")
            got = complete(c, fresh)                         # 26 pages: more than the 40 - 28 the store leaves
            assert got[0] == cold(fresh)[0] and got[1:] == (0, "no prefix")
            evicted = metric(c, "cupyglm:prefix_cache_evictions_total") - evicted
            free, store, total = idle_pages(c)
            assert evicted > 0 and free + store == total == 40, (evicted, free, store, total)
        s.proc.send_signal(signal.SIGTERM)
        rc, _ = s.wait(60)
    finally:
        s.kill()
    print(f"gate 4: KV pages the store held after each resumed reply: {held}; pool pressure evicted {evicted:.0f}")
    assert rc == 0, s.output
    lines = re.findall(r"rank (\d): KV pages at stop: (\d+) of (\d+) free, (\d+) held by kept prompts", s.output)
    assert sorted(r for r, *_ in lines) == ["0", "1"], s.output
    assert all(free == total and held == "0" for _, free, total, held in lines), lines
    print("gate 4 stop lines:", lines)


@pytest.mark.parametrize("arm", ["warm", "share"])
def test_gate5_streams_resuming_at_once(http, cold, arm):
    base = ids(300, 3)
    complete(http[arm], base, max_tokens=1)
    prompts = [base[:GRID * (i + 1)] + ids(5, 50 + i) for i in range(4)]
    solo = [cold(p) for p in prompts]
    for n in (1, 2, 4):
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            got = list(pool.map(lambda p: complete(http[arm], p), prompts[:n]))
        for i, (g, s) in enumerate(zip(got, solo)):
            assert g[0] == s[0] and g[1] >= GRID * (i + 1), (n, i)
    if arm == "share":
        free, store, total = idle_pages(http[arm])
        assert free + store == total and store > 0


def test_gate6_eviction_past_the_budget(http, cold):
    c = http["tight"]
    free0 = metric(c, "cupyglm:kv_free_pages")
    convs = [ids(100, 100 + i) for i in range(10)]
    for p in convs:
        complete(c, p, max_tokens=1)
    resumed = total = 0
    hits = []
    for i in reversed(range(10)):                            # the newest conversation comes back first
        follow = convs[i] + ids(7, 200 + i)
        got = complete(c, follow)
        total += len(follow)
        resumed += got[1]
        hits.append((i, got[1] or got[2]))
        if got[1] and len(hits) <= 2:                       # survivors resumed equal to fresh
            assert got[0] == cold(follow)[0], i
        elif not got[1]:
            assert got[2] == "evicted", (i, got)
    evictions = metric(c, "cupyglm:prefix_cache_evictions_total")
    print(f"eviction: {resumed}/{total} follow-up tokens resumed ({resumed / total:.0%}), {evictions:.0f} "
          f"evictions; (conversation, cached or why): {hits}")
    assert evictions > 0 and 0 < resumed < total
    assert metric(c, "cupyglm:kv_free_pages") == free0
    assert metric(c, "cupyglm:prefix_cache_bytes") <= 0.0006 * (1 << 30)


def test_gate7_seeded_sampling_resumed(http, cold):
    base = ids(200, 4)
    complete(http["warm"], base, max_tokens=1)
    prompt = base + ids(6, 5)
    kw = dict(temperature=0.8, seed=7, max_tokens=10)
    got = complete(http["warm"], prompt, **kw)
    assert got[1] == 200 and got[0] == cold(prompt, **kw)[0]


def test_salt_separates_tenants(http):
    p = ids(130, 6)
    complete(http["warm"], p, max_tokens=1, cache_salt="tenant-a")
    assert complete(http["warm"], p + [5], cache_salt="tenant-b")[1:] == (0, "different cache_salt")
    assert complete(http["warm"], p + [5], cache_salt="tenant-a")[1] == 130
