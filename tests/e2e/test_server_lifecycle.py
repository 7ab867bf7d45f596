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
    s = start_server([*server_args, "--drain-seconds", "60"])     # room for 60 tokens on a loaded machine
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
    rc, _ = s.wait(90)
    t.join(30)
    assert rc == 0, s.output
    assert result["text"].endswith("data: [DONE]\n\n")
    assert '"finish_reason":"length"' in result["text"]          # drained: the running request finished
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}"), f"rank pid {pid} still alive"


# ---- liveness: a frozen rank, a stop that a rank does not confirm, a second signal ------------------------------

def _stream_in_thread(s, result: dict, max_tokens: int = 200) -> threading.Thread:
    def run() -> None:
        with httpx.Client(timeout=60) as c:
            try:
                result["text"] = c.post(s.url + "/completions", json={
                    "prompt": "Once", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}).text
            except httpx.HTTPError as e:
                result["text"] = repr(e)

    t = threading.Thread(target=run)
    t.start()
    return t


def _wait_running(s) -> None:
    deadline = time.monotonic() + 20
    while httpx.get(s.base + "/metrics").text.find("cupyglm:num_requests_running 1.0") < 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _reap(s, pids: dict[int, int]) -> None:
    """SIGCONT whatever is left (a stopped process ignores SIGKILL until the kernel runs it) and check none is."""
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    time.sleep(0.2)
    alive = [pid for pid in pids.values() if os.path.exists(f"/proc/{pid}")
             and open(f"/proc/{pid}/stat").read().split(") ")[1][0] != "Z"]
    assert not alive, f"rank pids {alive} still alive:\n{s.output}"


def test_frozen_rank_fails_streams_and_ends_the_job(start_server, server_args):
    step_timeout = 2.0
    s = start_server([*server_args, "--step-timeout", str(step_timeout)])
    pids = s.rank_pids(2)
    result: dict = {}
    t = _stream_in_thread(s, result)
    _wait_running(s)
    os.kill(pids[1], signal.SIGSTOP)
    t0 = time.monotonic()
    unhealthy = None
    while s.proc.poll() is None and unhealthy is None and time.monotonic() - t0 < 20:
        try:
            r = httpx.get(s.base + "/health", timeout=1)
            if r.status_code == 503:
                unhealthy = (time.monotonic() - t0, r.json())
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    rc, _ = s.wait(30)
    ended = time.monotonic() - t0
    t.join(10)
    _reap(s, pids)
    print(f"frozen rank 1: /health 503 after {unhealthy[0]:.1f} s, job ended after {ended:.1f} s (rc {rc})")
    assert unhealthy is not None and unhealthy[0] < step_timeout + 1.5, unhealthy
    assert unhealthy[1]["status"] == "dead" and "rank 1" in unhealthy[1]["reason"]
    assert rc != 0 and ended < step_timeout + 6, (rc, ended)
    # the heartbeat timeout or the step deadline (rank 1 froze mid-step), whichever fires first; both name rank 1
    line = next((ln for ln in s.output.splitlines() if ln.startswith("rank 0: watchdog: ")), "")
    assert "rank 1" in line and line.endswith("; aborting the job"), s.output
    frames = result["text"].rstrip("\n").split("\n\n")
    assert frames[-1] == "data: [DONE]" and '"error"' in frames[-2] and "rank 1" in frames[-2], frames[-3:]


def test_rank_0_paused_past_the_timeout_is_survived(start_server, server_args):
    """Rank 0 stopped for twice --step-timeout mid-stream: no rank is blamed, the stream finishes, the job serves."""
    step_timeout = 2.0
    s = start_server([*server_args, "--step-timeout", str(step_timeout)])
    pids = s.rank_pids(2)
    result: dict = {}
    t = _stream_in_thread(s, result, max_tokens=60)
    _wait_running(s)
    os.kill(pids[0], signal.SIGSTOP)
    try:
        time.sleep(2 * step_timeout)
    finally:
        os.kill(pids[0], signal.SIGCONT)
    t.join(60)
    try:
        frames = result["text"].rstrip("\n").split("\n\n")
        assert frames[-1] == "data: [DONE]" and all('"error"' not in f for f in frames), frames[-3:]
        assert httpx.get(s.base + "/health", timeout=10).json() == {"status": "ok"}
        r = httpx.post(s.url + "/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
        assert "aborting the job" not in s.output and s.proc.poll() is None, s.output
        assert "rank 0: watchdog: rank 0 itself did not run for " in s.output, s.output
    finally:
        s.kill()
        _reap(s, pids)


def test_sigterm_with_a_frozen_rank_ends_within_the_drain(start_server, server_args):
    drain = 1.0
    s = start_server([*server_args, "--step-timeout", "60", "--drain-seconds", str(drain)])
    pids = s.rank_pids(2)
    os.kill(pids[1], signal.SIGSTOP)
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    rc, _ = s.wait(30)
    ended = time.monotonic() - t0
    _reap(s, pids)
    print(f"SIGSTOP rank 1, then SIGTERM: the job ended {ended:.1f} s after the SIGTERM (rc {rc})")
    assert rc != 0 and ended < drain + 5 + 4, (rc, ended)
    assert "rank 0: SIGTERM: draining 0 open request(s)" in s.output
    assert "rank 0: rank 1 did not confirm the stop within 5 s; aborting the job" in s.output, s.output


def test_second_sigterm_aborts_at_once(start_server, server_args):
    s = start_server([*server_args, "--drain-seconds", "60"])
    pids = s.rank_pids(2)
    result: dict = {}
    t = _stream_in_thread(s, result, max_tokens=230)
    _wait_running(s)
    s.proc.send_signal(signal.SIGTERM)
    s.wait_for("draining 1 open request", timeout=10)
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    rc, _ = s.wait(30)
    ended = time.monotonic() - t0
    t.join(10)
    _reap(s, pids)
    assert rc != 0 and ended < 5, (rc, ended)
    assert "second SIGTERM: aborting the job at once" in s.output, s.output
