"""The slot guard over HTTP (a real `mpirun -n 2` numpy server with host KV rows and 40 gather slots,
tests/observed_serve.py --kv-host-slots; the real openai client on 127.0.0.1): a 100-token prompt needs more
distinct rows than the slots, so the reply is a 400 invalid_request_error naming the guard (non-streaming) or an SSE error event
(streaming); the next request is served, and every KV page is free at idle."""
from __future__ import annotations

import re
import time

import httpx
import numpy as np
import openai
import pytest

pytestmark = pytest.mark.mpi

SLOTS = 40
MESSAGE = f"kv host: a call picked more distinct rows than the gather's {SLOTS} slots"
HOST = {"CUPYGLM_KV_HOST": "1", "CUPYGLM_KV_HOST_GIB": "0.005"}


@pytest.fixture(scope="module")
def guarded(start_server):
    s = start_server(["--context", "1024", "--parallel", "2"], env=HOST, observe=["--kv-host-slots", str(SLOTS)])
    with openai.OpenAI(base_url=s.url, api_key="unused", max_retries=0, timeout=120) as c:
        yield s, c
    s.kill()


def ids(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 480, size=n)]


def pages(s) -> tuple[int, int]:
    text = httpx.get(f"{s.base}/metrics", timeout=30).text
    get = lambda name: int(float(re.search(rf"^cupyglm:{name} (\S+)$", text, re.M).group(1)))  # noqa: E731
    return get("kv_free_pages"), get("kv_total_pages")


def idle_pages(s) -> tuple[int, int]:
    deadline = time.monotonic() + 30
    while (p := pages(s))[0] != p[1] and time.monotonic() < deadline:
        time.sleep(0.1)
    return p


def served(s, c) -> list[int]:
    r = c.completions.create(model=s.model, prompt=ids(20, 2), max_tokens=8, temperature=0,
                             extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.choices[0].finish_reason == "length"
    return r.choices[0].token_ids


def test_refused_by_name_then_served(guarded):
    s, c = guarded
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=s.model, prompt=ids(100, 1), max_tokens=4, temperature=0)
    err = e.value.body
    print(f"status {e.value.status_code} error {err}")
    assert e.value.status_code == 400 and err["message"] == MESSAGE
    assert err["type"] == "invalid_request_error" and err["code"] == "request_refused"
    assert len(served(s, c)) == 8
    free, total = idle_pages(s)
    print(f"idle: {free}/{total} pages free")
    assert free == total


def test_streaming_refusal_is_an_error_event(guarded):
    s, c = guarded
    stream = c.chat.completions.create(model=s.model, messages=[{"role": "user", "content": "x " * 120}],
                                       max_tokens=4, temperature=0, stream=True)
    chunks = []
    with pytest.raises(openai.APIError) as e:
        for ch in stream:
            chunks.append(ch)
    print(f"streamed {len(chunks)} chunks, then error {e.value.body}")
    assert e.value.body["message"] == MESSAGE and e.value.body["type"] == "invalid_request_error"
    assert len(served(s, c)) == 8
    assert idle_pages(s)[0] == idle_pages(s)[1]
