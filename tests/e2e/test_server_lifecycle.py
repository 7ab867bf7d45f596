"""The real server's life: API keys (and the key-file check at startup), a rank killed, SIGTERM."""
from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.mpi


def test_api_key_file(start_server, server_args, tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    key.chmod(0o644)
    refused = start_server(["--api-key-file", str(key)], wait=False)
    rc, _ = refused.wait(60)
    assert rc != 0
    assert f"--api-key-file {key}: mode 0644" in refused.output and "Traceback" not in refused.output

    key.chmod(0o600)
    s = start_server(["--api-key-file", str(key), *server_args])
    try:
        body = {"prompt": "x", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"},
                        {"Authorization": "Bearer s3cret-keyX"}):
            r = httpx.post(s.url + "/completions", json=body, headers=headers)
            assert r.status_code == 401, r.text
            assert r.headers["www-authenticate"] == "Bearer"
            err = r.json()["error"]
            assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
        assert httpx.get(s.base + "/health").status_code == 200          # health stays open for probes
        with openai.OpenAI(base_url=s.url, api_key="wrong", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
        with openai.OpenAI(base_url=s.url, api_key="s3cret-key", max_retries=0) as good:
            out = good.completions.create(model=s.model, prompt="x", max_tokens=2)
            assert out.usage.completion_tokens == 2
    finally:
        s.kill()


def test_rank_killed_brings_the_job_down(start_server, server_args):
    s = start_server(server_args)
    pids = s.rank_pids(2)
    assert httpx.get(s.base + "/health").json() == {"status": "ok"}
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    while True:
        try:
            r = httpx.get(s.base + "/health", timeout=2)
            healthy = r.status_code == 200
        except httpx.HTTPError:
            healthy = False
        if not healthy:
            break
        assert time.monotonic() - t0 < 10, "/health still ok 10 s after rank 1 was killed"
        time.sleep(0.1)
    rc, _ = s.wait(30)
    assert rc != 0


def test_sigterm_drains_and_every_rank_exits_0(start_server, server_args):
    s = start_server(server_args)
    pids = s.rank_pids(2)
    result: dict = {}

    def stream() -> None:
        with httpx.Client(timeout=60) as c:
            r = c.post(s.url + "/completions", json={"prompt": "Once", "max_tokens": 60, "ignore_eos": True,
                                                     "stream": True})
            result["text"] = r.text

    t = threading.Thread(target=stream)
    t.start()
    deadline = time.monotonic() + 20
    while httpx.get(s.base + "/metrics").text.find("cupyglm:num_requests_running 1.0") < 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    s.proc.send_signal(signal.SIGTERM)
    rc, _ = s.wait(40)
    t.join(30)
    assert rc == 0, s.output
    assert result["text"].endswith("data: [DONE]\n\n")
    assert '"finish_reason":"length"' in result["text"]          # drained: the running request finished
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}"), f"rank pid {pid} still alive"
