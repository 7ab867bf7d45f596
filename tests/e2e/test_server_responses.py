"""/v1/responses against the real `mpirun -n 2` tiny server with the real clients: `client.responses.create`
plain and streamed (text, a json_schema `text.format`, a forced function call fed back with its output),
`client.responses.parse`, openai-agents' `OpenAIResponsesModel` under its Runner (a tool round trip ending in a
structured output, plain and streamed) and `litellm.responses`. The tiny model writes random tokens, so calls and
JSON come from the grammar (forced `tool_choice`, json_schema) and text is compared with the chat route's on the
same seed. Also the smaller routes and fields: echo with max_tokens 0, reasoning_effort / thinking, /version,
/ping."""
from __future__ import annotations

import asyncio
import json
from typing import Annotated

import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.mpi

MODEL = "cupyglm-tiny"
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather", "strict": True, "parameters": {
    "type": "object", "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["days"], "additionalProperties": False}}]
NAMED = {"type": "function", "name": "get_weather"}


@pytest.fixture(scope="module")
def server(start_server):
    """The tools' rendering makes a 500-token prompt: a window past the suite's default 256."""
    s = start_server(["--context", "1024", "--parallel", "4", "--max-queue", "16"])
    yield s
    s.kill()


def test_text_plain_streamed_and_equal_to_chat(client):
    kw = dict(model=MODEL, input="Hello there", instructions="Be brief.", max_output_tokens=6, temperature=0.9,
              extra_body={"seed": 5})
    plain = client.responses.create(**kw)
    assert plain.object == "response" and plain.id.startswith("resp_") and plain.status == "incomplete"
    assert plain.incomplete_details.reason == "max_output_tokens" and plain.usage.output_tokens == 6
    chat = client.chat.completions.create(model=MODEL, max_tokens=6, temperature=0.9, seed=5, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}])
    assert plain.usage.input_tokens == chat.usage.prompt_tokens
    assert plain.output_text == (chat.choices[0].message.content or "")
    events = list(client.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == plain.output_text
    assert events[-1].response.usage.output_tokens == 6


def test_json_schema_text_format_and_parse(client):
    fmt = {"type": "json_schema", "name": "reply", "schema": SCHEMA, "strict": True}
    for seed in (1, 2):
        r = client.responses.create(model=MODEL, input="JSON please", text={"format": fmt}, max_output_tokens=32,
                                    extra_body={"seed": seed})
        obj = json.loads(r.output_text)
        assert r.status == "completed" and set(obj) == {"ok", "n"} and 0 <= obj["n"] <= 99

    class Reply(BaseModel):
        ok: bool
        n: Annotated[int, Field(ge=0, le=99)]
    parsed = client.responses.parse(model=MODEL, input="JSON please", text_format=Reply, max_output_tokens=32,
                                    extra_body={"seed": 3}).output_parsed
    assert isinstance(parsed, Reply) and 0 <= parsed.n <= 99


def test_forced_function_call_round_trip(client):
    kw = dict(model=MODEL, input=[{"role": "user", "content": "Weather for a few days?"}], tools=TOOLS,
              tool_choice=NAMED, max_output_tokens=96, extra_body={"seed": 4})
    r = client.responses.create(**kw)
    calls = [i for i in r.output if i.type == "function_call"]
    assert r.status == "completed" and [c.name for c in calls] == ["get_weather"]
    assert 1 <= json.loads(calls[0].arguments)["days"] <= 9
    events = list(client.responses.create(stream=True, **kw))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == [calls[0].arguments] and events[-1].type == "response.completed"
    follow = [*kw["input"], *[i.model_dump(exclude_none=True) for i in r.output],
              {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}]
    again = client.responses.create(model=MODEL, input=follow, tools=TOOLS, tool_choice="auto", max_output_tokens=4,
                                    extra_body={"seed": 4})
    assert again.usage.input_tokens > r.usage.input_tokens and again.output
    assert all(i.type in ("message", "reasoning") for i in again.output)


def test_refusals_name_the_field(http):
    for body, param in [({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
                        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
                        ({"input": "x", "temprature": 1}, "temprature"),
                        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
                         "input[0].content[0].type")]:
        r = http.post("/v1/responses", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_openai_agents_tool_round_trip_and_structured_output(server):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    days_seen: list[int] = []

    @agents.function_tool
    def get_weather(days: Annotated[int, Field(ge=1, le=9)]) -> str:
        """Weather for the next days."""
        days_seen.append(days)
        return f"sunny for {days} days"

    class Forecast(BaseModel):
        ok: bool
        n: Annotated[int, Field(ge=0, le=99)]

    client = openai.AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
    settings = agents.ModelSettings(tool_choice="get_weather", max_tokens=96, extra_body={"seed": 2},
                                    reasoning={"effort": "none"})
    agent = agents.Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model=model,
                         model_settings=settings, output_type=Forecast)

    async def plain_and_streamed():
        plain = await agents.Runner.run(agent, "Weather?", max_turns=4)
        streamed = agents.Runner.run_streamed(agent, "Weather?", max_turns=4)
        async for _ in streamed.stream_events():
            pass
        return plain, streamed
    # the first turn's call is forced; the tool choice resets to auto, and the reply's JSON comes from the schema
    for result in asyncio.run(plain_and_streamed()):
        kinds = [i.type for i in result.new_items]
        assert kinds[0] == "tool_call_item" and "tool_call_output_item" in kinds, kinds
        assert kinds[-1] == "message_output_item" and isinstance(result.final_output, Forecast), kinds
        assert 0 <= result.final_output.n <= 99
    assert days_seen and all(1 <= d <= 9 for d in days_seen)


def test_litellm_responses(server, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")          # no fetch of the price map
    litellm = pytest.importorskip("litellm")
    kw = dict(model=f"openai/{MODEL}", api_base=server.url, api_key="unused")
    r = litellm.responses(input="Hello there", max_output_tokens=16, extra_body={"seed": 5}, **kw)   # 16: its floor
    assert r.status == "incomplete" and r.usage.output_tokens == 16 and r.output[0].type == "message"
    events = list(litellm.responses(input="Hello there", max_output_tokens=16, extra_body={"seed": 5}, stream=True,
                                    **kw))
    assert events[0].type == "response.created" and events[-1].response.status == "incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output[0].content[0].text
    r = litellm.responses(input="Weather?", tools=TOOLS, tool_choice=NAMED, max_output_tokens=96,
                          extra_body={"seed": 6}, **kw)
    call = next(i for i in r.output if i.type == "function_call")
    assert r.status == "completed" and call.name == "get_weather" and 1 <= json.loads(call.arguments)["days"] <= 9


def test_echo_with_max_tokens_zero_gives_the_prompt_logprobs(client, http):
    prompt = [11, 12, 13, 14, 15, 16]
    one = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, "logprobs": 2, "echo": True,
                                             "temperature": 0}).json()["choices"][0]
    zero = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 0, "logprobs": 2, "echo": True})
    assert zero.status_code == 200, zero.text
    body = zero.json()
    c = body["choices"][0]
    assert body["usage"]["completion_tokens"] == 0 and c["finish_reason"] == "length"
    assert c["text"] == http.post("/detokenize", json={"tokens": prompt}).json()["prompt"]
    n = len(prompt)
    assert c["logprobs"]["token_logprobs"] == one["logprobs"]["token_logprobs"][:n] and c["logprobs"]["tokens"] == \
        one["logprobs"]["tokens"][:n] and c["prompt_logprobs"] == one["prompt_logprobs"]
    streamed = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, logprobs=2, echo=True,
                                              stream=True))
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == c["text"]
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_reasoning_effort_and_thinking_switch_the_template(client, http):
    msg = [{"role": "user", "content": "hi"}]

    def tokens(**extra):
        r = http.post("/v1/chat/completions", json={"messages": msg, "max_tokens": 1, **extra})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]
    on, off = tokens(), tokens(chat_template_kwargs={"enable_thinking": False})
    assert on != off
    assert [tokens(reasoning_effort=e) for e in ("none", "minimal", "low", "medium", "high")] == [off, off, on, on, on]
    assert tokens(thinking={"type": "disabled"}) == off and tokens(thinking={"type": "enabled"}) == on
    r = http.post("/v1/chat/completions", json={"messages": msg, "reasoning_effort": "high",
                                                "thinking": {"type": "disabled"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking"
    r = http.post("/v1/chat/completions", json={"messages": msg, "reasoning_effort": "extreme"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort"
    assert client.responses.create(model=MODEL, input="hi", max_output_tokens=1,
                                   reasoning={"effort": "none"}).usage.input_tokens == off


def test_version_and_ping(http):
    v = http.get("/version")
    assert v.status_code == 200 and v.json()["version"]
    assert http.get("/ping").status_code == 200 and http.post("/ping").status_code == 200
