"""/v1/responses output items through the HTTP layer with the real openai client, over the scripted engine that
writes a GLM reply with a thinking block, text and a tool call (random tiny weights never write one): the
reasoning, message and function_call items, the streamed event sequence, and a streamed reply equal to a plain one."""
from __future__ import annotations

import json

from test_server_tools import client  # noqa: F401  (the scripted engine's server, one per module)

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather by city", "strict": False,
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}]


def test_reasoning_message_and_function_call_items(client):
    r = client.responses.create(model="fake", input="Weather in Paris?", tools=TOOLS)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert [i.type for i in r.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = r.output
    assert reasoning.content[0].text == "The user wants the weather." and reasoning.summary == []
    assert message.role == "assistant" and message.content[0].text == "Let me check." == r.output_text
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed"
    assert json.loads(call.arguments) == {"city": "Paris", "days": 3}
    u = r.usage
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.input_tokens_details.cached_tokens == 0
    assert 0 < u.output_tokens_details.reasoning_tokens < u.output_tokens
    assert r.tools[0].name == "get_weather" and r.tool_choice == "auto"


def test_streamed_events_build_the_plain_reply(client):
    plain = client.responses.create(model="fake", input="Weather in Paris?", tools=TOOLS)
    events = list(client.responses.create(model="fake", input="Weather in Paris?", tools=TOOLS, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    for kind in ("response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                 "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                 "response.function_call_arguments.delta", "response.function_call_arguments.done",
                 "response.output_item.done"):
        assert kind in kinds, kind
    assert kinds.index("response.output_text.done") < kinds.index("response.function_call_arguments.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    args = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    final = events[-1].response
    assert text == plain.output_text and args == [plain.output[2].arguments]
    assert [i.type for i in done] == [i.type for i in final.output] == [i.type for i in plain.output]
    assert final.usage.output_tokens == plain.usage.output_tokens


def test_function_call_output_round_trip_renders_the_tool_turn(client):
    first = client.responses.create(model="fake", input="Weather in Paris?", tools=TOOLS)
    call = first.output[2]
    history = [{"role": "user", "content": "Weather in Paris?"}, *[i.model_dump(exclude_none=True)
                                                                   for i in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
    again = client.responses.create(model="fake", input=history, tools=TOOLS)
    assert again.status == "completed"
    assert again.usage.input_tokens > first.usage.input_tokens + 10     # the call and its output are in the prompt
