"""Drafted equals serial at TP=2 (real `mpirun -n 2` servers, numpy): a server with `--mtp-drafts 3` and the prompt
cache against a server without drafts or cache, greedy and seeded, code and chat prompts, a resumed turn, the
bench's concurrent gate (`--alone --serial`), usage draft_tokens and the spec_decode metrics."""
from __future__ import annotations

import re

import pytest
from procjob import clients, together

from cupyglm_bench.cli import main

pytestmark = pytest.mark.mpi

BASE = ["--context", "512", "--parallel", "4"]


@pytest.fixture(scope="module")
def servers(start_server):
    out = {"draft": start_server(BASE + ["--mtp-drafts", "3", "--prompt-cache-gib", "0.05"], wait=False),
           "plain": start_server(BASE, wait=False)}
    yield from together(out, timeout=120)


@pytest.fixture(scope="module")
def http(servers):
    yield from clients(servers, timeout=180)


def ask(c, kind, text, temperature, **kw):
    body = {"max_tokens": 10, "temperature": temperature, "seed": 3, "ignore_eos": True, "return_token_ids": True,
            **kw}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": text}]
        r = c.post("/v1/chat/completions", json=body)
    else:
        body["prompt"] = text
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    p = r.json()
    return p["choices"][0]["token_ids"], p["usage"]


@pytest.mark.parametrize("kind, text", [("code", "def merge(a, b):\n    out = []\n"),
                                        ("chat", "Name three rivers of Europe.")])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_drafted_equals_serial(http, kind, text, temperature):
    drafted, usage = ask(http["draft"], kind, text, temperature)
    off, off_usage = ask(http["draft"], kind, text, temperature, draft=False)
    plain, plain_usage = ask(http["plain"], kind, text, temperature)
    assert drafted == off == plain
    assert usage["draft_tokens"]["proposed"] > 0 and "draft_tokens" not in off_usage | plain_usage


def test_resumed_turn_drafts_and_equals_serial(http):
    first = "The quick brown fox jumps over the lazy dog. " * 6
    t1, _ = ask(http["draft"], "code", first, 0.0)
    second = first + "And then the fox said:"
    t2, usage = ask(http["draft"], "code", second, 0.8)
    cold, _ = ask(http["plain"], "code", second, 0.8)
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert usage["draft_tokens"]["proposed"] > 0
    assert t2 == cold


def test_bench_concurrent_alone_serial_with_drafts(servers, http, tmp_path, capsys):
    out = tmp_path / "concurrent.json"
    rc = main(["concurrent", "--base-url", servers["draft"].url, "--no-progress", "--output", str(out),
               "--levels", "1,2", "--alone", "--serial", "--tokens", "8", "--temperatures", "0,0.8"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "0 unequal" in printed
    metrics = http["draft"].get("/metrics").text
    drafts = float(re.search(r"^cupyglm:spec_decode_num_draft_tokens_total (\S+)$", metrics, re.M).group(1))
    assert drafts > 0
    assert re.search(r"^cupyglm:spec_decode_num_accepted_tokens_total \S+$", metrics, re.M)
