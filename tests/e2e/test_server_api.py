"""The OpenAI API as clients use it, against the real `mpirun -n 2` server with the real `openai` client: n > 1,
batched completion prompts, many stop strings, role developer, /v1/models/{id}, /tokenizer_info."""
from __future__ import annotations

import pytest

from cupyglm.server.responses import token_sha

pytestmark = pytest.mark.mpi

SAMPLED = dict(temperature=0.9, top_p=0.95, max_tokens=6, extra_body={"ignore_eos": True})


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


def test_logprobs_shapes_streamed_and_not(client):
    msgs = [{"role": "user", "content": "Count to five."}]
    r = client.chat.completions.create(model="cupyglm-tiny", messages=msgs, max_tokens=5, temperature=0,
                                       logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].logprob == t.logprob          # greedy: the drawn token is the most likely
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
    assert "".join(t.token for t in content) == r.choices[0].message.content
    streamed = []
    for ch in client.chat.completions.create(model="cupyglm-tiny", messages=msgs, max_tokens=5, temperature=0,
                                             logprobs=True, top_logprobs=3, stream=True,
                                             extra_body={"ignore_eos": True}):
        if ch.choices and ch.choices[0].logprobs:
            streamed += ch.choices[0].logprobs.content
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    c = client.completions.create(model="cupyglm-tiny", prompt="a b c", max_tokens=4, temperature=0.8, seed=5,
                                  logprobs=2, extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0
    s_tokens, s_lps = [], []
    for ch in client.completions.create(model="cupyglm-tiny", prompt="a b c", max_tokens=4, temperature=0.8,
                                        seed=5, logprobs=2, stream=True, extra_body={"ignore_eos": True}):
        if ch.choices and ch.choices[0].logprobs:
            s_tokens += ch.choices[0].logprobs.tokens
            s_lps += ch.choices[0].logprobs.token_logprobs
    assert (s_tokens, s_lps) == (lp.tokens, lp.token_logprobs)


def test_logprobs_alone_equal_batched(http):
    body = {"prompt": "Once upon a time", "temperature": 1.0, "max_tokens": 6, "ignore_eos": True, "seed": 11,
            "logprobs": 5}
    alone = http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    batched = http.post("/v1/completions", json={**body, "n": 3}).json()["choices"]   # 3 rows a step
    assert [c for c in batched if c["index"] == 0][0]["logprobs"] == alone
    mixed = http.post("/v1/completions", json={**body, "prompt": ["Hi there", body["prompt"], [3, 4, 5]]}).json()
    assert [c for c in mixed["choices"] if c["index"] == 1][0]["logprobs"] == alone


def test_penalties_and_logit_bias(client, http):
    base = {"prompt": "a b c d", "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    plain = _ids(http, base)[0]
    forced = plain[0] + 1 if plain[0] + 1 < 500 else plain[0] - 1
    biased = _ids(http, {**base, "logit_bias": {str(forced): 100}})[0]
    assert biased == [forced] * 8                               # +100 wins every greedy step
    banned = _ids(http, {**base, "logit_bias": {str(t): -100 for t in set(plain)}})[0]
    assert not set(banned) & set(plain)
    rep = _ids(http, {**base, "frequency_penalty": 2.0, "presence_penalty": 2.0})[0]
    assert (rep != plain or len(set(plain)) == len(plain)) and rep == _ids(http, {**base, "frequency_penalty": 2.0,
                                                                     "presence_penalty": 2.0})[0]
    r = client.completions.create(model="cupyglm-tiny", prompt="a b c d", max_tokens=8, temperature=0.7, seed=2,
                                  presence_penalty=1.0, frequency_penalty=0.5, logit_bias={str(forced): 3},
                                  extra_body={"repetition_penalty": 1.3, "ignore_eos": True})
    assert r.usage.completion_tokens == 8
    alone = _ids(http, {**base, "temperature": 0.7, "seed": 2, "repetition_penalty": 1.3, "presence_penalty": 1.0})
    batched = _ids(http, {**base, "temperature": 0.7, "seed": 2, "repetition_penalty": 1.3, "presence_penalty": 1.0,
                          "prompt": ["x y", "a b c d"]})
    assert batched[1] == alone[0]                               # a row's edits depend on its request only


def test_echo_and_prompt_logprobs(client, http):
    prompt = [11, 12, 13, 14, 15, 16]
    gen = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "temperature": 0, "logprobs": 2,
                                             "ignore_eos": True, "return_token_ids": True}).json()["choices"][0]
    t1, t2 = gen["token_ids"]
    echo = http.post("/v1/completions", json={"prompt": prompt + [t1], "max_tokens": 1, "temperature": 0,
                                              "logprobs": 2, "echo": True, "ignore_eos": True}).json()["choices"][0]
    lp = echo["logprobs"]
    assert len(lp["tokens"]) == len(prompt) + 2 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    # the prompt's last token's logprob = the sampled one at the same position (same logits row)
    assert lp["token_logprobs"][len(prompt)] == gen["logprobs"]["token_logprobs"][0]
    assert lp["top_logprobs"][len(prompt)] == gen["logprobs"]["top_logprobs"][0]
    # t2's row: a decode row when generated (the tensor core's order), a prompt row when echoed (lane-16)
    assert abs(lp["token_logprobs"][-1] - gen["logprobs"]["token_logprobs"][1]) < 0.05
    assert echo["text"].startswith(http.post("/detokenize", json={"tokens": prompt + [t1]}).json()["prompt"])
    assert echo["prompt_logprobs"][0] is None and len(echo["prompt_logprobs"]) == len(prompt) + 1
    r = client.completions.create(model="cupyglm-tiny", prompt="The quick brown fox", max_tokens=1, temperature=0,
                                  logprobs=1, echo=True)
    assert r.choices[0].text.startswith("The quick brown fox") and r.choices[0].logprobs.token_logprobs[0] is None
    text, lps = "", []
    for ch in client.completions.create(model="cupyglm-tiny", prompt="The quick brown fox", max_tokens=1,
                                        temperature=0, logprobs=1, echo=True, stream=True):
        if ch.choices:
            text += ch.choices[0].text
            lps += ch.choices[0].logprobs.token_logprobs if ch.choices[0].logprobs else []
    assert text == r.choices[0].text and lps == r.choices[0].logprobs.token_logprobs
    batched = http.post("/v1/completions", json={"prompt": ["Hello there", prompt + [t1]], "max_tokens": 1,
                                                 "temperature": 0, "logprobs": 2, "echo": True,
                                                 "ignore_eos": True}).json()["choices"]
    assert [c for c in batched if c["index"] == 1][0]["logprobs"] == lp     # alone = batched


def test_best_of_returns_the_candidates_with_the_highest_cumulative_logprob(http):
    body = {"prompt": "Once upon a time", "temperature": 1.0, "max_tokens": 6, "seed": 17, "return_token_ids": True}
    singles = []
    for i in range(4):                             # candidate i = the same request with seed 17 + i
        r = http.post("/v1/completions", json={**body, "seed": 17 + i, "logprobs": 0})
        c = r.json()["choices"][0]
        singles.append((sum(c["logprobs"]["token_logprobs"]), -i, c["token_ids"]))
    r = http.post("/v1/completions", json={**body, "best_of": 4, "n": 2})
    assert r.status_code == 200, r.text
    got = r.json()
    best = sorted(singles, reverse=True)[:2]
    assert [c["token_ids"] for c in got["choices"]] == [b[2] for b in best]
    assert [c["index"] for c in got["choices"]] == [0, 1] and all(c["logprobs"] is None for c in got["choices"])
    assert got["usage"]["completion_tokens"] == sum(len(s[2]) for s in singles)
    r = http.post("/v1/completions", json={**body, "best_of": 2, "stream": True})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "best_of")
