"""Forced tool calls keep their schemas against the real `mpirun -n 2` tiny server with the real openai client: on 8
seeds a strict tool's raw-string and JSON arguments (enum, maxLength, pattern, integer bounds) all validate with
jsonschema and parallel_tool_calls false gives exactly one call; so do 4 seeds under tool_choice auto (pushed to
open a call by logit_bias, bounded by the grammar); a strict schema the grammar cannot enforce is
refused naming its part; instructor in TOOLS_STRICT mode parses a reply on its first try (skipped where instructor
is not installed: its releases pin jiter below the openai SDK's). The tiny model writes random tokens, so every
valid argument comes from the grammar; its bounds close each call (about 150 tokens: the tags are byte tokens here)
within max_tokens. All the generations run at once, in one batch."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.mpi

MODEL = "cupyglm-tiny"
MSG = [{"role": "user", "content": "Weather?"}]
PARAMS = {"type": "object", "additionalProperties": False, "required": ["unit", "city", "days"],
          "properties": {
              "unit": {"type": "string", "enum": ["c", "f"]},
              "city": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
              "days": {"type": "integer", "minimum": 1, "maximum": 9}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": PARAMS}}]
MAX_TOKENS = 192


@pytest.fixture(scope="module")
def server(start_server):
    """The tools' rendering makes a 400-token prompt: a window past the suite's default 256; 13 requests at once."""
    s = start_server(["--context", "1024", "--parallel", "13", "--max-queue", "32"])
    yield s
    s.kill()


def _weather_model():
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        unit: Literal["c", "f"]
        city: str = Field(max_length=5, pattern="^[a-z]+$")
        days: int = Field(ge=1, le=9)
    return Weather


@pytest.fixture(scope="module")
def replies(server, tiny_ckpt):
    """Run concurrently: the 8 seeded forced calls, 4 seeded auto replies pushed to open a call (logit_bias on
    <tool_call>), and the instructor call: (forced choices, auto choices, instructor's result)."""
    instructor = _optional("instructor")
    bias = {str(tiny_ckpt.tokenizer.raw.token_to_id("<tool_call>")): 100}
    with openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=600) as c:
        def one(seed):
            kw = dict(tool_choice="required") if seed < 8 else dict(logit_bias=bias, seed=seed - 8)
            return c.chat.completions.create(**{**dict(model=MODEL, messages=MSG, seed=seed, max_tokens=MAX_TOKENS,
                                                       tools=TOOLS, parallel_tool_calls=False), **kw}).choices[0]

        def strict_client():
            if instructor is None:
                return None
            client = instructor.from_openai(c, mode=instructor.Mode.TOOLS_STRICT)
            try:
                return client.chat.completions.create(model=MODEL, messages=MSG, response_model=_weather_model(),
                                                      max_retries=0, seed=3, max_tokens=MAX_TOKENS)
            except Exception as e:                   # reported by its test, not by the other ones
                return e
        with ThreadPoolExecutor(13) as pool:
            inst = pool.submit(strict_client)
            choices = list(pool.map(one, range(12)))
            return choices[:8], choices[8:], inst.result()


def _optional(name: str):
    try:
        return __import__(name)
    except ImportError:
        return None


def test_forced_calls_keep_their_schemas_one_call_each_on_8_seeds(replies):
    seen = set()
    for c in replies[0]:
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c.message
        call = c.message.tool_calls[0]
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), PARAMS)
        seen.add(call.function.arguments)
    assert len(seen) > 4                             # seeded sampling, not one forced string


def test_auto_with_a_strict_tool_keeps_its_schema_and_one_call(replies):
    for c in replies[1]:
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c.message
        jsonschema.validate(json.loads(c.message.tool_calls[0].function.arguments), PARAMS)


def test_unenforceable_strict_schema_is_refused_by_name(client):
    bad = json.loads(json.dumps(TOOLS))
    bad[0]["function"]["parameters"]["properties"]["city"]["format"] = "hostname"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=8, tools=bad, tool_choice="required")
    assert e.value.body["param"] == "tools[0].function.parameters.properties.city.format"


def test_instructor_tools_strict_first_try(request):
    if _optional("instructor") is None:
        pytest.skip("instructor is not installed")
    w = request.getfixturevalue("replies")[2]
    assert not isinstance(w, Exception), w
    assert w.unit in ("c", "f") and 1 <= len(w.city) <= 5 and w.city.isalpha() and 1 <= w.days <= 9
