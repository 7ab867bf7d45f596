"""The OpenAI API as clients use it, against the real `mpirun -n 2` server with the real `openai` client: n > 1,
batched completion prompts, many stop strings, role developer, /v1/models/{id}, /tokenizer_info."""
from __future__ import annotations

import httpx
import openai
import pytest

from cupyglm.server.responses import token_sha

pytestmark = pytest.mark.mpi

SAMPLED = dict(temperature=0.9, top_p=0.95, max_tokens=6, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base, timeout=60) as c:
        yield c


def _ids(http, body) -> list[list[int]]:
    r = http.post("/v1/completions", json={**body, "return_token_ids": True})
    assert r.status_code == 200, r.text
    return [c["token_ids"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]


def test_n_choices_equal_single_requests_with_derived_seeds(client, http):
    body = {"prompt": "Once upon a time", "temperature": 0.9, "max_tokens": 6, "ignore_eos": True, "seed": 41}
    many = _ids(http, {**body, "n": 3})
    assert len(many) == 3
    for i, ids in enumerate(many):                 # choice i = the same request with seed 41 + i
        assert ids == _ids(http, {**body, "seed": 41 + i})[0]
    assert len({tuple(x) for x in many}) > 1
    r = client.chat.completions.create(model="cupyglm-tiny", messages=[{"role": "user", "content": "hi"}], n=3,
                                       seed=7, **SAMPLED)
    assert [c.index for c in r.choices] == [0, 1, 2] and r.usage.completion_tokens == 18
    streamed: dict[int, str] = {}
    for ch in client.chat.completions.create(model="cupyglm-tiny", messages=[{"role": "user", "content": "hi"}],
                                             n=3, seed=7, stream=True, **SAMPLED):
        for c in ch.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    assert streamed == {c.index: c.message.content for c in r.choices}


def test_batched_prompts_each_a_choice(client, http):
    prompts = ["The sky is", [5, 6, 7, 8], "Numbers: 1, 2,", "Hello"]
    body = {"temperature": 0.8, "max_tokens": 5, "ignore_eos": True, "seed": 3}
    together = _ids(http, {**body, "prompt": prompts})
    assert together == [_ids(http, {**body, "prompt": p})[0] for p in prompts]
    r = client.completions.create(model="cupyglm-tiny", prompt=prompts, n=2, seed=3, temperature=0.8,
                                  max_tokens=5, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == list(range(8))
    one = http.post("/v1/completions", json={"prompt": prompts, **body}).json()
    assert one["usage"]["completion_tokens"] == 20 and one["usage"]["prompt_tokens"] == sum(
        len(_prompt_ids(http, p)) for p in prompts)
    assert [c["token_sha"] for c in one["choices"]] == [token_sha(x) for x in together]


def _prompt_ids(http, p) -> list[int]:
    return p if isinstance(p, list) else http.post("/tokenize", json={"prompt": p}).json()["tokens"]


def test_many_stop_strings_and_developer_role(client, http):
    stops = [f"zz{i}" for i in range(63)] + [" the"]
    r = client.completions.create(model="cupyglm-tiny", prompt="a b c", max_tokens=8, temperature=0, stop=stops)
    assert r.choices[0].finish_reason in ("stop", "length")
    bad = http.post("/v1/completions", json={"prompt": "x", "stop": [f"s{i}" for i in range(129)]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stop"
    assert "at most 128" in bad.json()["error"]["message"]
    dev = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    sysm = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    a = client.chat.completions.create(model="cupyglm-tiny", messages=dev, max_tokens=4, temperature=0)
    b = client.chat.completions.create(model="cupyglm-tiny", messages=sysm, max_tokens=4, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_model_route_and_tokenizer_info(server, client, http):
    m = client.models.retrieve(server.model)
    assert m.id == server.model and m.object == "model"
    assert http.get("/v1/models/nope").status_code == 404
    info = http.get("/tokenizer_info").json()
    assert info["tokenizer_class"] and info["model_max_length"] == 256 and "chat_template" in info
