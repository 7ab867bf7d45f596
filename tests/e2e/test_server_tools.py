"""GLM tool calls and reasoning through the HTTP layer with the real openai client, over a scripted engine that
writes a GLM-format reply (a test double of the model's text: random tiny weights never write one)."""
from __future__ import annotations

import json
import threading

import openai
import pytest
from test_server_fake_engine import InProcServer

from cupyglm.checkpoint.incremental_decoder import IncrementalDecoder
from cupyglm.engine.request import RequestOutput
from cupyglm.server.glm_output import GlmOutput

REPLY = ("<think>The user wants the weather.</think>\nLet me check.<tool_call>get_weather\n"
         "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
         "</tool_call>")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather by city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
MSG = [{"role": "user", "content": "Weather in Paris?"}]


class ScriptedEngine:
    """Writes the token ids of `script` in order, one a step, for every request; ends with "stop"."""

    def __init__(self, tokenizer, script: list[int]):
        self.tok, self.script = tokenizer, script
        self.max_model_len, self.total_pages, self.free_pages = 4096, 32, 32
        self.reqs: dict[int, dict] = {}
        self.lock = threading.Lock()

    def add_request(self, prompt_ids, params, request_id=None):
        with self.lock:
            self.reqs[request_id] = dict(n=len(prompt_ids), i=0, dec=IncrementalDecoder(self.tok))
        return request_id

    def abort(self, rid):
        with self.lock:
            self.reqs.pop(rid, None)

    def has_work(self):
        return bool(self.reqs)

    def shutdown(self):
        pass

    def step(self):
        outs = []
        with self.lock:
            for rid, r in list(self.reqs.items()):
                t = self.script[r["i"]]
                r["i"] += 1
                done = r["i"] == len(self.script)
                text = r["dec"].push(t) + (r["dec"].flush() if done else "")
                if done:
                    self.reqs.pop(rid)
                outs.append(RequestOutput(rid, [t], text, done, "stop" if done else None, r["n"], r["i"]))
        return outs


@pytest.fixture(scope="module")
def client(tiny_ckpt):
    s = InProcServer(tiny_ckpt.tokenizer)
    s.engine = ScriptedEngine(tiny_ckpt.tokenizer, tiny_ckpt.tokenizer.encode(REPLY))
    s.load(tiny_ckpt.tokenizer)
    with openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c
    s.close()


def test_tool_call_and_reasoning_parsed(client):
    r = client.chat.completions.create(model="fake", messages=MSG, tools=TOOLS)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content == "Let me check."
    assert c.message.model_extra["reasoning_content"] == "The user wants the weather."
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}


def test_tool_call_streamed_as_deltas(client):
    content, reasoning, calls, finish = "", "", {}, None
    for ch in client.chat.completions.create(model="fake", messages=MSG, tools=TOOLS, stream=True):
        d = ch.choices[0].delta
        content += d.content or ""
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            acc = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": None})
            acc["id"] = acc["id"] or tc.id
            acc["name"] += (tc.function.name or "") if tc.function else ""
            acc["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = ch.choices[0].finish_reason or finish
    assert (content, reasoning, finish) == ("Let me check.", "The user wants the weather.", "tool_calls")
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 3}


def test_without_tools_or_thinking_the_text_is_content(client):
    plain = client.chat.completions.create(model="fake", messages=MSG)
    assert plain.choices[0].message.tool_calls is None and "<tool_call>get_weather" in plain.choices[0].message.content
    off = client.chat.completions.create(model="fake", messages=MSG, tools=TOOLS,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content.startswith("<think>The user")
    assert off.choices[0].message.tool_calls[0].function.name == "get_weather"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=MSG, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "no_such_tool"}})
    assert e.value.body["param"] == "tool_choice"


@pytest.mark.parametrize("cut", range(1, 40, 3))
def test_pieces_anywhere_give_the_whole_parse(cut):
    whole = GlmOutput(True, TOOLS)
    whole.feed(REPLY, final=True)
    parts = GlmOutput(True, TOOLS)
    for i in range(0, len(REPLY), cut):
        parts.feed(REPLY[i:i + cut])
    parts.feed("", final=True)
    a, b = whole.message(), parts.message()
    for m in (a, b):
        for c in m["tool_calls"]:
            c.pop("id")
    assert a == b


def test_unfinished_call_stays_content():
    g = GlmOutput(False, TOOLS)
    g.feed("Hi <tool_call>get_weather\n<arg_key>city", final=True)
    assert g.message() == {"role": "assistant", "content": "Hi <tool_call>get_weather\n<arg_key>city"}


TWO = REPLY + "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n</tool_call>tail"


@pytest.mark.parametrize("cut", (1, 5, len(TWO)))
def test_max_calls_keeps_the_first_call_and_drops_the_rest(cut):
    g = GlmOutput(True, TOOLS, max_calls=1)
    deltas = [d for i in range(0, len(TWO), cut) for d in g.feed(TWO[i:i + cut])] + g.feed("", final=True)
    m = g.message()
    assert [json.loads(c["function"]["arguments"]) for c in m["tool_calls"]] == [{"city": "Paris", "days": 3}]
    assert m["content"] == "Let me check.tail" and "Rome" not in json.dumps(deltas)
    assert {tc["index"] for d in deltas for tc in d.get("tool_calls", [])} == {0}
    cut_short = GlmOutput(True, TOOLS, max_calls=1)
    cut_short.feed(TWO[:-20], final=True)
    assert len(cut_short.message()["tool_calls"]) == 1 and "Rome" not in cut_short.message()["content"]


def test_parallel_tool_calls_false_under_auto_keeps_the_first_call(tiny_ckpt):
    """The scripted engine writes two calls and applies no grammar: the parser alone bounds them."""
    s = InProcServer(tiny_ckpt.tokenizer)
    s.engine = ScriptedEngine(tiny_ckpt.tokenizer, tiny_ckpt.tokenizer.encode(TWO))
    s.load(tiny_ckpt.tokenizer)
    try:
        with openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
            both = c.chat.completions.create(model="fake", messages=MSG, tools=TOOLS).choices[0].message
            one = c.chat.completions.create(model="fake", messages=MSG, tools=TOOLS,
                                            parallel_tool_calls=False).choices[0].message
            streamed = [tc for ch in c.chat.completions.create(model="fake", messages=MSG, tools=TOOLS, stream=True,
                                                                parallel_tool_calls=False)
                        for tc in ch.choices[0].delta.tool_calls or []]
    finally:
        s.close()
    assert [json.loads(t.function.arguments)["city"] for t in both.tool_calls] == ["Paris", "Rome"]
    assert [json.loads(t.function.arguments)["city"] for t in one.tool_calls] == ["Paris"]
    assert {tc.index for tc in streamed} == {0} and one.content == "Let me check.tail"


def test_values_typed_string_stay_raw_others_decode():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string"}, "u": {"description": "untyped"}, "o": {"anyOf": [{"type": "string"}]}}}}}]
    g = GlmOutput(False, tools)
    g.feed("<tool_call>f\n<arg_key>s</arg_key><arg_value>12</arg_value><arg_key>u</arg_key><arg_value>12"
           "</arg_value><arg_key>o</arg_key><arg_value>\"x\"</arg_value><arg_key>z</arg_key><arg_value>a b"
           "</arg_value></tool_call>", final=True)
    assert json.loads(g.message()["tool_calls"][0]["function"]["arguments"]) == {"s": "12", "u": 12, "o": "x",
                                                                                 "z": "a b"}
