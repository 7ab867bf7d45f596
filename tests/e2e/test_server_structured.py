"""Structured output against the real `mpirun -n 2` tiny server with the real openai client: json_schema replies
parse and validate on 12 seeded requests, json_object, guided_choice, guided_regex, structured_outputs, a schema
streamed, tool_choice required and named, and plain requests batched with structured ones keep their tokens."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def server(start_server):
    """The tools' rendering makes a 500-token prompt: a window past the suite's default 256."""
    s = start_server(["--context", "1024", "--parallel", "4", "--max-queue", "32"])
    yield s
    s.kill()

MODEL = "cupyglm-tiny"
MSG = [{"role": "user", "content": "Give me a JSON object."}]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "tag"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 999},
                         "tag": {"enum": ["red", "green", "blue"]}, "note": {"type": "string", "maxLength": 4}}}
RF = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA, "strict": True}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "days": {"type": "integer", "minimum": 1, "maximum": 9}, "metric": {"type": "boolean"}}, "required": ["days"]}}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]


def valid(obj) -> bool:
    """SCHEMA checked by hand (jsonschema is not a dependency)."""
    return (isinstance(obj, dict) and {"ok", "n", "tag"} <= set(obj) <= {"ok", "n", "tag", "note"}
            and isinstance(obj["ok"], bool) and type(obj["n"]) is int and 0 <= obj["n"] <= 999
            and obj["tag"] in ("red", "green", "blue")
            and (isinstance(obj.get("note", ""), str) and len(obj.get("note", "")) <= 4))


def test_json_schema_parses_and_validates_on_12_seeds(client):
    def one(seed):
        return client.chat.completions.create(model=MODEL, messages=MSG, seed=seed, max_tokens=48, response_format=RF)
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(one, range(12)))
    texts = set()
    for r in replies:
        c = r.choices[0]
        assert c.finish_reason == "stop" and valid(json.loads(c.message.content)), c.message.content
        texts.add(c.message.content)
    assert len(texts) > 6                            # seeded sampling, not one forced string


def test_json_object_choice_regex_and_structured_outputs(client):
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL, messages=MSG, seed=seed, max_tokens=48,
                                           response_format={"type": "json_object"}, logit_bias={"92": 4})
        assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.completions.create(model=MODEL, prompt="Answer:", seed=1, max_tokens=8, n=4,
                                  extra_body={"guided_choice": ["yes", "no", "maybe so"]})
    assert all(c.text in ("yes", "no", "maybe so") and c.finish_reason == "stop" for c in r.choices)
    r = client.completions.create(model=MODEL, prompt="Date:", seed=2, max_tokens=24,
                                  extra_body={"guided_regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"})
    t = r.choices[0].text
    assert r.choices[0].finish_reason == "stop" and len(t) == 10 and t[4] == t[7] == "-" and t.replace("-", "").isdigit()
    r = client.chat.completions.create(model=MODEL, messages=MSG, seed=3, max_tokens=24,
                                       extra_body={"structured_outputs": {"regex": "(ab|cd){2,3}"}})
    assert r.choices[0].message.content in {a + b + c for a in ("ab", "cd") for b in ("ab", "cd")
                                            for c in ("", "ab", "cd")}


def test_streamed_schema_equals_plain(client):
    kw = dict(model=MODEL, messages=MSG, seed=11, max_tokens=48, response_format=RF)
    plain = client.chat.completions.create(**kw).choices[0]
    text, finish = "", None
    for ch in client.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert (text, finish) == (plain.message.content, "stop") and valid(json.loads(text))


def test_plain_requests_batched_with_structured_keep_their_tokens(http):
    plain = [{"prompt": p, "temperature": 0.9, "seed": 5 + i, "max_tokens": 12, "ignore_eos": True,
              "return_token_ids": True} for i, p in enumerate(("Once upon a time", "The sky is", "Numbers: 1, 2,"))]
    guided = [{"model": MODEL, "messages": MSG, "seed": s, "max_tokens": 48, "response_format": RF}
              for s in range(3)]

    def post(args):
        path, body = args
        r = http.post(path, json=body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]
    alone = [post(("/v1/completions", b))["token_ids"] for b in plain]
    jobs = [("/v1/completions", b) for b in plain] + [("/v1/chat/completions", b) for b in guided]
    jobs = [jobs[i] for i in (3, 0, 4, 1, 5, 2)]                   # interleaved: they share steps
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(post, jobs))
    together = [c["token_ids"] for c in got if "token_ids" in c]
    assert together == alone
    for c in got:
        if "message" in c:
            assert c["finish_reason"] == "stop" and valid(json.loads(c["message"]["content"]))


def test_tool_choice_required_and_named(client):
    named = {"type": "function", "function": {"name": "get_weather"}}

    def one(args):
        seed, choice = args
        return client.chat.completions.create(model=MODEL, messages=MSG, seed=seed, max_tokens=96, tools=TOOLS,
                                              tool_choice=choice).choices[0]
    with ThreadPoolExecutor(3) as pool:                              # three requests sharing steps
        *required, c = pool.map(one, [(0, "required"), (1, "required"), (4, named)])
    for r in required:
        assert r.finish_reason == "tool_calls" and r.message.tool_calls
        for call in r.message.tool_calls:
            assert call.function.name in ("get_weather", "now") and isinstance(json.loads(call.function.arguments), dict)
    assert c.finish_reason == "tool_calls" and [t.function.name for t in c.message.tool_calls] == ["get_weather"]
    args = json.loads(c.message.tool_calls[0].function.arguments)
    assert type(args["days"]) is int and 1 <= args["days"] <= 9 and set(args) <= {"days", "metric"}
