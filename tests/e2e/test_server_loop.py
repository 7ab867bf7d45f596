"""Nothing a request holds stalls the event loop: /health keeps answering while the real TP=2 server refuses or
serves a request that once held the loop for seconds (its grammar compiled, its prompt tokenized, its schema
parsed on the loop). Liveness is what is tested, so the bound is generous next to a stall (seconds) and the
latencies are printed."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.mpi

HEALTH_BOUND_S = 0.5       # an idle server answers in milliseconds; each of these held it for 1.5-40 s
POLL_S = 0.01
CONTEXT = 131072          # the tiny tokenizer's longest token is 18 characters: 2.36M characters may fit
ARGS = ["--context", str(CONTEXT), "--parallel", "2", "--max-queue", "8", "--max-body-bytes", str(16 * 2**20)]


@pytest.fixture(scope="module")
def big(start_server):
    s = start_server(ARGS)
    yield s
    s.kill()


def _while_polling(s, send) -> tuple[float, int, httpx.Response]:
    """`send()` while /health is polled every POLL_S; (the slowest /health, polls, send's response)."""
    stop, lat = threading.Event(), []

    def poll() -> None:
        with httpx.Client(base_url=s.base, timeout=60) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                assert c.get("/health").status_code == 200
                lat.append(time.monotonic() - t0)
                time.sleep(POLL_S)

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.2)
    try:
        r = send()
    finally:
        time.sleep(0.1)
        stop.set()
        t.join(120)
    return max(lat), len(lat), r


def _chat(s, **extra):
    raw = json.dumps({"model": s.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                      **extra}).encode()                   # encoded before the polling starts
    return lambda: httpx.post(s.url + "/chat/completions", content=raw,
                              headers={"Content-Type": "application/json"}, timeout=120)


CASES = {
    "100,000 guided choices": (dict(guided_choice=[f"choice number {i}" for i in range(100_000)]),
                               400, "guided_choice"),
    "a 2.3M-character message": (dict(messages=[{"role": "user", "content": "abcdefghij" * 230_000}]),
                                 400, "messages"),
    "a 100,000-deep string schema": (dict(guided_json='{"a":' * 100_000 + "1" + "}" * 100_000), 400, "guided_json"),
    "a 5,000-deep string schema": (dict(guided_json='{"a":' * 5_000 + "1" + "}" * 5_000), 400, "guided_json"),
    "1,024 guided choices (served)": (dict(guided_choice=[f"choice number {i}" for i in range(1024)], max_tokens=64,
                                           chat_template_kwargs={"enable_thinking": False}), 200, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_health_answers_while_a_heavy_request_is_refused_or_served(big, case):
    extra, status, param = CASES[case]
    worst, polls, r = _while_polling(big, _chat(big, **extra))
    print(f"{case}: HTTP {r.status_code} in {r.elapsed.total_seconds():.2f} s; /health max {1e3 * worst:.0f} ms "
          f"over {polls} polls")
    assert r.status_code == status, r.text[:300]
    if param is not None:
        err = r.json()["error"]
        assert err["param"] == param and err["type"] == "invalid_request_error", err
        assert "Error" not in err["message"] and ".rs" not in err["message"] and "\n" not in err["message"], err
    else:
        assert r.json()["choices"][0]["message"]["content"].startswith("choice number "), r.json()["choices"]
    assert worst < HEALTH_BOUND_S, f"/health took {1e3 * worst:.0f} ms while {case} was handled"
