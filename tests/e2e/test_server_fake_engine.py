"""The HTTP layer in-process over a scripted fake engine (fast, and reaches states a real engine rarely shows:
a full queue, an engine thread that dies). The real server under mpirun is tested in test_server.py."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
import uvicorn

from cupyglm.checkpoint.incremental_decoder import IncrementalDecoder
from cupyglm.engine.request import RequestOutput
from cupyglm.engine.sampling import SamplingParams
from cupyglm.server.app import ServerState, create_app, model_info
from cupyglm.server.bridge import EngineBridge
from cupyglm.server.metrics import Metrics
from cupyglm.server.responses import token_sha


class QueueFull(RuntimeError):
    pass


class FakeEngine:
    """Deterministic tokens from (prompt, position, seed); one token per running request per step."""

    def __init__(self, tokenizer, context=128, pages=32, page_tokens=16, parallel=2, max_queue=2):
        self.tok = tokenizer
        self.max_model_len = context
        self.total_pages = self.free_pages = pages
        self.page_tokens = page_tokens
        self.parallel, self.max_queue = parallel, max_queue
        self.reqs: dict[int, dict] = {}
        self.order: list[int] = []
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def add_request(self, prompt_ids, params, request_id=None):
        with self.lock:
            waiting = max(0, len(self.order) - self.parallel)
            if waiting >= self.max_queue:
                raise QueueFull(f"{self.max_queue} waiting")
            need = -(-(len(prompt_ids) + params.max_tokens) // self.page_tokens)
            self.free_pages -= need
            self.reqs[request_id] = dict(prompt=list(prompt_ids), p=params, out=[], pages=need,
                                         dec=IncrementalDecoder(self.tok))
            self.order.append(request_id)
        return request_id

    def abort(self, rid):
        with self.lock:
            r = self.reqs.pop(rid, None)
            if r is not None:
                self.order.remove(rid)
                self.free_pages += r["pages"]

    def has_work(self):
        return bool(self.order) and self.gate.is_set()

    def shutdown(self):
        pass

    def step(self):
        if self.fail:
            raise RuntimeError("planted engine failure")
        time.sleep(0.001)
        outs = []
        with self.lock:
            for rid in list(self.order[: self.parallel]):
                r = self.reqs[rid]
                p = r["p"]
                pos = len(r["prompt"]) + len(r["out"])
                t = (sum(r["prompt"]) * 31 + pos * 7 + (p.seed or 0)) % 400 + 32
                r["out"].append(t)
                text = r["dec"].push(t)
                done = len(r["out"]) >= p.max_tokens
                if done:
                    text += r["dec"].flush()
                    self.order.remove(rid)
                    self.reqs.pop(rid)
                    self.free_pages += r["pages"]
                outs.append(RequestOutput(request_id=rid, new_token_ids=[t], new_text=text, finished=done,
                                finish_reason="length" if done else None, prompt_tokens=len(r["prompt"]),
                                completion_tokens=len(r["out"]), cached_tokens=0))
        return outs


class InProcServer:
    def __init__(self, tokenizer, api_keys=(), max_body=4096, **engine_kw):
        self.engine = FakeEngine(tokenizer, **engine_kw)
        self.loop = asyncio.new_event_loop()
        self.metrics = Metrics()
        self.bridge = EngineBridge(self.loop, self.metrics)
        self.state = ServerState(bridge=self.bridge, metrics=self.metrics, served_id="fake", root="/ckpt/fake-dir",
                                 api_keys=api_keys, max_body_bytes=max_body, make_params=SamplingParams)
        cfg = uvicorn.Config(create_app(self.state), host="127.0.0.1", port=0, http="h11", lifespan="off",
                             log_level="warning", access_log=False)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server.config.setup_event_loop = lambda: None
        self.loop.run_until_complete(self.server.serve())

    def load(self, tokenizer):
        def on_ready(engine):
            def publish():
                self.state.tokenizer = tokenizer
                self.state.info = model_info("fake", "/ckpt/fake-dir", engine.max_model_len, 512)
            self.loop.call_soon_threadsafe(publish)
        self.bridge.start(lambda: self.engine, on_ready)
        deadline = time.monotonic() + 10
        while not (self.state.ready and self.bridge.alive):
            assert time.monotonic() < deadline
            time.sleep(0.01)

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)
        self.bridge.stop()


@pytest.fixture(scope="module")
def srv(tiny_ckpt):
    s = InProcServer(tiny_ckpt.tokenizer)
    s.load(tiny_ckpt.tokenizer)
    yield s
    s.close()


def _sse(r: httpx.Response) -> list:
    frames = []
    for block in r.text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        frames.append(payload if payload == "[DONE]" else json.loads(payload))
    return frames


def test_health_503_until_loaded_then_ok(tiny_ckpt):
    s = InProcServer(tiny_ckpt.tokenizer)
    try:
        r = httpx.get(s.base + "/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = httpx.post(s.base + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "service_unavailable"
        s.load(tiny_ckpt.tokenizer)
        assert httpx.get(s.base + "/health").json() == {"status": "ok"}
    finally:
        s.close()


def test_stream_and_plain_agree(srv):
    body = {"model": "fake", "prompt": "Hello world", "max_tokens": 7, "return_token_ids": True}
    plain = httpx.post(srv.base + "/v1/completions", json=body).json()
    ids = plain["choices"][0]["token_ids"]
    assert len(ids) == 7 and plain["token_sha"] == token_sha(ids)
    assert plain["usage"]["completion_tokens"] == 7
    assert plain["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    r = httpx.post(srv.base + "/v1/completions",
                   json={**body, "stream": True, "stream_options": {"include_usage": True}})
    frames = _sse(r)
    assert frames[-1] == "[DONE]"
    assert frames[0]["prompt_token_ids"] == plain["choices"][0]["prompt_token_ids"]
    assert sum((f["choices"][0]["token_ids"] for f in frames[:-2]), []) == ids
    assert "".join(f["choices"][0]["text"] for f in frames[:-2]) == plain["choices"][0]["text"]
    assert frames[-3]["token_sha"] == plain["token_sha"] and frames[-3]["choices"][0]["finish_reason"] == "length"
    assert frames[-2]["choices"] == [] and frames[-2]["usage"] == plain["usage"]


def test_model_alias_accepted(srv):
    for name in ("fake", "fake-dir", "/ckpt/fake-dir"):
        r = httpx.post(srv.base + "/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 1})
        assert r.status_code == 200, r.text


def test_queue_full_is_429_with_retry_after(srv):
    srv.engine.gate.clear()
    try:
        clients = []
        with httpx.Client(base_url=srv.base, timeout=30) as c:
            # parallel 2 + queue 2 fit; the fifth is refused before a stream opens
            for _ in range(4):
                clients.append(c.build_request("POST", "/v1/completions",
                                               json={"prompt": "x", "max_tokens": 2, "stream": True}))
            opened = [c.send(req, stream=True) for req in clients]
            r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": True})
            assert r.status_code == 429
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
            srv.engine.gate.set()
            srv.bridge._wake.set()
            for o in opened:
                o.read()
                assert o.text.endswith("data: [DONE]\n\n")
                o.close()
    finally:
        srv.engine.gate.set()


def test_continuous_usage_stats(srv):
    body = {"prompt": "Hello", "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    frames = _sse(httpx.post(srv.base + "/v1/completions", json=body))
    chunks = [f for f in frames[:-1] if f["choices"]]
    assert chunks and all("usage" in f for f in chunks)
    assert [f["usage"]["completion_tokens"] for f in chunks] == list(range(1, len(chunks) + 1))
    assert frames[-2]["choices"] == [] and frames[-2]["usage"]["completion_tokens"] == 4


def test_choices_past_the_queue_are_refused_whole(srv):
    """n = 5 choices where 4 fit: 429, and the 4 already queued are aborted (all or none)."""
    srv.engine.gate.clear()
    try:
        free = srv.engine.free_pages
        r = httpx.post(srv.base + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 5}, timeout=30)
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        deadline = time.monotonic() + 5
        while (srv.engine.order or srv.bridge.open_requests) and time.monotonic() < deadline:
            srv.bridge._wake.set()
            time.sleep(0.01)
        assert not srv.engine.order and srv.bridge.open_requests == 0 and srv.engine.free_pages == free
    finally:
        srv.engine.gate.set()


def test_disconnect_aborts_and_frees_pages(srv):
    free0 = srv.engine.free_pages
    srv.engine.gate.clear()
    with httpx.Client(base_url=srv.base, timeout=30) as c:
        req = c.build_request("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 50, "stream": True})
        resp = c.send(req, stream=True)
        assert resp.status_code == 200
        assert srv.engine.free_pages < free0
        resp.close()
    deadline = time.monotonic() + 5
    while srv.engine.free_pages != free0:
        assert time.monotonic() < deadline, "pages not freed after disconnect"
        time.sleep(0.02)
    srv.engine.gate.set()
    text = httpx.get(srv.base + "/metrics").text
    assert 'cupyglm:request_success_total{finished_reason="abort"}' in text


def test_api_key(tiny_ckpt):
    s = InProcServer(tiny_ckpt.tokenizer, api_keys=(b"sekret",))
    s.load(tiny_ckpt.tokenizer)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            r = httpx.get(s.base + "/v1/models", headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(s.base + "/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200
        assert httpx.get(s.base + "/health").status_code == 200
    finally:
        s.close()


def test_engine_death_fails_streams_and_health(tiny_ckpt):
    s = InProcServer(tiny_ckpt.tokenizer)
    s.load(tiny_ckpt.tokenizer)
    try:
        s.engine.gate.clear()
        with httpx.Client(base_url=s.base, timeout=30) as c:
            req = c.build_request("POST", "/v1/chat/completions",
                                  json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                                        "stream": True})
            resp = c.send(req, stream=True)
            assert resp.status_code == 200
            s.engine.fail = True
            s.engine.gate.set()
            s.bridge._wake.set()
            resp.read()
            frames = _sse(resp)
            assert frames[-1] == "[DONE]" and "error" in frames[-2]
            assert frames[-2]["error"]["code"] == "service_unavailable"
        r = httpx.get(s.base + "/health")
        assert r.status_code == 503 and r.json()["status"] == "dead"
    finally:
        s.close()


def test_body_limit_streamed_without_content_length(srv):
    def gen():
        for _ in range(10):
            yield b" " * 1000
    r = httpx.post(srv.base + "/v1/completions", content=gen())
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
