"""The real server: `mpirun -n 2 python -m cupyglm.cli.serve` on 127.0.0.1 with the real `openai` client."""
from __future__ import annotations

import concurrent.futures
import json
import re
import time

import httpx
import openai
import pytest

from cupyglm.server.responses import token_sha

pytestmark = pytest.mark.mpi

CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is the capital of France?"}]


def _sse(text: str) -> list:
    frames = []
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    for block in text.split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            p = block[len("data: "):]
            frames.append(p if p == "[DONE]" else json.loads(p))
    return frames


def _metrics(http) -> dict[str, float]:
    out = {}
    for line in http.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


# ---- outputs ----------------------------------------------------------------------------------------------------

def test_models_health_tokenize(server, http, client):
    assert http.get("/health").json() == {"status": "ok"}
    models = client.models.list().data
    assert [m.id for m in models] == [server.model]
    m = http.get("/v1/models").json()["data"][0]
    assert m["object"] == "model" and m["max_model_len"] == 256 and m["root"] and m["owned_by"]
    t = http.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert t["count"] == len(t["tokens"]) > 0 and t["max_model_len"] == 256
    assert http.post("/detokenize", json={"tokens": t["tokens"]}).json() == {"prompt": "Hello world"}
    tc = http.post("/tokenize", json={"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert tc["count"] > t["count"]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stream_equals_plain(client, kind):
    extra = {"return_token_ids": True, "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False},
             "draft": False, "cache_salt": "abc"}
    common = dict(model=client.models.list().data[0].id, max_tokens=12, temperature=0, extra_body=extra)
    if kind == "chat":
        extra.pop("cache_salt")
        plain = client.chat.completions.create(messages=CHAT, **common)
        stream = client.chat.completions.create(messages=CHAT, stream=True, stream_options={"include_usage": True},
                                                **common)
    else:
        extra.pop("chat_template_kwargs")
        plain = client.completions.create(prompt="def fib(n):", **common)
        stream = client.completions.create(prompt="def fib(n):", stream=True, stream_options={"include_usage": True},
                                           **common)
    p = plain.model_dump(exclude_unset=True)
    ids = p["choices"][0]["token_ids"]
    assert len(ids) == 12 and p["token_sha"] == token_sha(ids)
    assert p["usage"]["completion_tokens"] == 12 and p["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert p["usage"]["prompt_tokens"] == len(p["choices"][0]["prompt_token_ids"])
    assert p["choices"][0]["finish_reason"] == "length"
    chunks = [c.model_dump(exclude_unset=True) for c in stream]
    assert chunks[0]["prompt_token_ids"] == p["choices"][0]["prompt_token_ids"]
    if kind == "chat":
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == p["choices"][0]["message"]["content"]
    else:
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        assert text == p["choices"][0]["text"]
    streamed = sum((c["choices"][0].get("token_ids") or [] for c in chunks if c["choices"]), [])
    assert streamed == ids
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(final) == 1 and final[0]["token_sha"] == p["token_sha"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == p["usage"]


def test_token_prompt_equals_text_prompt(http):
    ids = http.post("/tokenize", json={"prompt": "The quick brown fox"}).json()["tokens"]
    a = http.post("/v1/completions", json={"prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0}).json()
    b = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 6, "temperature": 0}).json()
    assert a["token_sha"] == b["token_sha"] and a["usage"] == b["usage"]


def test_stop_and_min_tokens(http):
    base = {"prompt": "Hello", "max_tokens": 16, "temperature": 0, "return_token_ids": True, "ignore_eos": True}
    full = http.post("/v1/completions", json=base).json()["choices"][0]
    stop_id = full["token_ids"][3]
    cut = http.post("/v1/completions", json={**base, "stop_token_ids": [stop_id]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert cut["token_ids"] == full["token_ids"][:full["token_ids"].index(stop_id) + 1]


# ---- concurrent equals solo -------------------------------------------------------------------------------------

def _stream_sha(base: str, body: dict) -> str:
    with httpx.Client(base_url=base, timeout=120) as c:
        r = c.post("/v1/completions", json={**body, "stream": True})
        assert r.status_code == 200, r.text
    frames = _sse(r.text)
    return [f for f in frames[:-1] if f["choices"][0]["finish_reason"]][0]["token_sha"]


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "top_p": 0.95, "top_k": 50,
                                                              "seed": 1234}])
def test_concurrent_equals_solo(server, sampling):
    prompts = ["def fib(n):", "Once upon a time", "The capital of France is", "Numbers: 1 2 3",
               "Hello world! Good morning", "class Request:"]
    bodies = [{"prompt": p, "max_tokens": 10, "ignore_eos": True, **sampling} for p in prompts]
    solo = [_stream_sha(server.base, b) for b in bodies]
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        together = list(ex.map(lambda b: _stream_sha(server.base, b), bodies))
    assert together == solo


# ---- bad input --------------------------------------------------------------------------------------------------

LONG = "word " * 400
MSG = [{"role": "user", "content": "hi"}]
C, CH = "/v1/completions", "/v1/chat/completions"

BAD = [  # (name, path, body (dict, or raw bytes), status, param, code)
    ("invalid json", C, b'{"prompt": "x",', 400, None, "invalid_json"),
    ("body not an object", C, b'[1, 2]', 400, None, "invalid_type"),
    ("invalid utf-8", C, b'{"prompt": "\xff\xfe"}', 400, None, "invalid_utf8"),
    ("NaN constant", C, b'{"prompt": "x", "temperature": NaN}', 400, None, "invalid_json"),
    ("prompt missing", C, {"max_tokens": 3}, 400, "prompt", "missing_required_parameter"),
    ("prompt wrong type", C, {"prompt": 12}, 400, "prompt", "invalid_type"),
    ("prompt empty", C, {"prompt": ""}, 400, "prompt", "invalid_value"),
    ("too many prompts", C, {"prompt": ["a"] * 65}, 400, "prompt", "invalid_value"),
    ("token id out of vocab", C, {"prompt": [1, 2, 999999]}, 400, "prompt", "invalid_token_id"),
    ("negative token id", C, {"prompt": [1, -2]}, 400, "prompt", "invalid_token_id"),
    ("token id not int", C, {"prompt": [1, 2.5]}, 400, "prompt", "invalid_type"),
    ("max_tokens negative", C, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens", "invalid_value"),
    ("max_tokens zero", C, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ("max_tokens huge", C, {"prompt": "x", "max_tokens": 10**12}, 400, "max_tokens", "context_length_exceeded"),
    ("max_tokens string", C, {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens", "invalid_type"),
    ("max_tokens bool", C, {"prompt": "x", "max_tokens": True}, 400, "max_tokens", "invalid_type"),
    ("prompt over context", C, {"prompt": LONG, "max_tokens": 4}, 400, "prompt", "context_length_exceeded"),
    ("chat over context", CH, {"messages": [{"role": "user", "content": LONG}]}, 400, "messages",
     "context_length_exceeded"),
    ("temperature < 0", C, {"prompt": "x", "temperature": -0.1}, 400, "temperature", "invalid_value"),
    ("temperature > 2", C, {"prompt": "x", "temperature": 2.5}, 400, "temperature", "invalid_value"),
    ("top_p > 1", C, {"prompt": "x", "top_p": 1.5}, 400, "top_p", "invalid_value"),
    ("top_p = 0", C, {"prompt": "x", "top_p": 0}, 400, "top_p", "invalid_value"),
    ("top_k < -1", C, {"prompt": "x", "top_k": -5}, 400, "top_k", "invalid_value"),
    ("min_p > 1", C, {"prompt": "x", "min_p": 3}, 400, "min_p", "invalid_value"),
    ("seed negative", C, {"prompt": "x", "seed": -1}, 400, "seed", "invalid_value"),
    ("n = 17", C, {"prompt": "x", "n": 17}, 400, "n", "invalid_value"),
    ("guided_decoding_backend", CH, {"messages": MSG, "guided_json": {"type": "object"},
                                     "guided_decoding_backend": "xgrammar"}, 400, "guided_decoding_backend",
     "unsupported_parameter"),
    ("guided_json bad", CH, {"messages": MSG, "guided_json": "{"}, 400, "guided_json", "invalid_value"),
    ("unknown field", C, {"prompt": "x", "temprature": 1}, 400, "temprature", "unknown_parameter"),
    ("logprobs completions", C, {"prompt": "x", "logprobs": 21}, 400, "logprobs", "invalid_value"),
    ("logprobs chat", CH, {"messages": MSG, "logprobs": 1}, 400, "logprobs", "invalid_type"),
    ("top_logprobs", CH, {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs", "invalid_value"),
    ("draft true", C, {"prompt": "x", "draft": True}, 400, "draft", "unsupported_parameter"),
    ("too many stops", C, {"prompt": "x", "stop": [f"s{i}" for i in range(129)]}, 400, "stop", "invalid_value"),
    ("stop wrong type", C, {"prompt": "x", "stop": 5}, 400, "stop", "invalid_type"),
    ("stop_token_ids bad", C, {"prompt": "x", "stop_token_ids": [100000]}, 400, "stop_token_ids",
     "invalid_token_id"),
    ("min_tokens > max_tokens", C, {"prompt": "x", "max_tokens": 2, "min_tokens": 5}, 400, "min_tokens",
     "invalid_value"),
    ("ignore_eos not bool", C, {"prompt": "x", "ignore_eos": "yes"}, 400, "ignore_eos", "invalid_type"),
    ("presence_penalty", C, {"prompt": "x", "presence_penalty": 2.5}, 400, "presence_penalty", "invalid_value"),
    ("stream_options without stream", C, {"prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options", "invalid_value"),
    ("empty messages", CH, {"messages": []}, 400, "messages", "invalid_value"),
    ("messages missing", CH, {"max_tokens": 2}, 400, "messages", "missing_required_parameter"),
    ("unknown role", CH, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role",
     "invalid_value"),
    ("content wrong type", CH, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content",
     "invalid_type"),
    ("image part without url", CH, {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                                                "image_url": {}}]}]},
     400, "messages[0].content[0].image_url", "invalid_type"),
    ("video part", CH, {"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {}}]}]},
     400, "messages[0].content[0]", "unsupported_parameter"),
    ("enable_thinking not bool", CH, {"messages": MSG, "chat_template_kwargs": {"enable_thinking": "no"}}, 400,
     "chat_template_kwargs.enable_thinking", "invalid_type"),
    ("cache_salt not string", CH, {"messages": MSG, "cache_salt": 5}, 400, "cache_salt", "invalid_type"),
    ("unknown model", C, {"model": "gpt-4", "prompt": "x"}, 404, "model", "model_not_found"),
    ("model wrong type", C, {"model": 7, "prompt": "x"}, 400, "model", "invalid_type"),
    ("oversize body", C, {"prompt": "x" * 70000}, 413, None, "request_too_large"),
    ("unknown route", "/v1/embeddings", {"input": "x"}, 404, None, "not_found"),
    ("detokenize bad id", "/detokenize", {"tokens": [5, 100000]}, 400, "tokens", "invalid_token_id"),
    ("tokenize no prompt", "/tokenize", {}, 400, "prompt", "missing_required_parameter"),
]


def test_bad_inputs_get_openai_errors(http):
    assert len(BAD) >= 25
    failures = []
    for name, path, body, status, param, code in BAD:
        if isinstance(body, bytes):
            r = http.post(path, content=body, headers={"Content-Type": "application/json"})
        else:
            r = http.post(path, json=body)
        try:
            err = r.json()["error"]
            ok = (r.status_code == status and err["param"] == param and err["code"] == code
                  and isinstance(err["message"], str) and err["message"]
                  and err["type"] == "invalid_request_error")
        except Exception:  # noqa: BLE001
            ok, err = False, r.text
        if not ok:
            failures.append(f"{name}: {r.status_code} {err}")
    assert not failures, "\n".join(failures)
    good = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 2


def test_bad_input_through_openai_client(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="cupyglm-tiny", messages=MSG, temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


# ---- disconnect -------------------------------------------------------------------------------------------------

def test_disconnect_frees_pages_and_counts(server, http):
    m0 = _metrics(http)
    total = m0["cupyglm:kv_total_pages"]
    assert m0["cupyglm:kv_free_pages"] == total
    with httpx.Client(base_url=server.base, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 200,
                                                       "ignore_eos": True, "stream": True}) as r:
            assert r.status_code == 200
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    seen += 1
                    if seen == 3:
                        mid = _metrics(http)
                        assert mid["cupyglm:kv_free_pages"] < total
                        assert mid["cupyglm:num_requests_running"] == 1
                        break
    deadline = time.monotonic() + 10
    while True:
        m1 = _metrics(http)
        if m1["cupyglm:kv_free_pages"] == total:
            break
        assert time.monotonic() < deadline, f"pages not freed: {m1['cupyglm:kv_free_pages']} of {total}"
        time.sleep(0.05)
    abort = 'cupyglm:request_success_total{finished_reason="abort"}'
    assert m1[abort] == m0[abort] + 1
    assert m1["cupyglm:prompt_tokens_total"] > m0["cupyglm:prompt_tokens_total"]
    assert 3 <= m1["cupyglm:generation_tokens_total"] - m0["cupyglm:generation_tokens_total"] < 200
    assert m1["cupyglm:num_requests_running"] == 0 and m1["cupyglm:num_requests_waiting"] == 0
    # the server still works
    ok = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 3}).json()
    assert ok["usage"]["completion_tokens"] == 3
    m2 = _metrics(http)
    assert m2['cupyglm:request_success_total{finished_reason="length"}'] == \
        m1['cupyglm:request_success_total{finished_reason="length"}'] + 1
    assert m2["cupyglm:generation_tokens_total"] == m1["cupyglm:generation_tokens_total"] + 3
    assert re.search(r"cupyglm:time_to_first_token_seconds_count \d", http.get("/metrics").text)
