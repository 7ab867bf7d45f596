"""A /v1/responses body as the chat request it runs as: input items to messages, flat tools to chat tools,
text.format to response_format, reasoning effort to the thinking switch; every field of the installed openai SDK's
ResponseCreateParams in exactly one list, and what is not built refused by name."""
from __future__ import annotations

import typing

import pytest
from openai.types.responses import response_create_params as params

from cupyglm.server.errors import ApiError
from cupyglm.server.requests import ModelInfo, parse_chat
from cupyglm.server.responses_fields import IMPLEMENTED, REFUSED, RESPONSES_IGNORED
from cupyglm.server.responses_input import to_chat
from cupyglm.server.thinking import apply_thinking

INFO = ModelInfo(served_id="m", aliases=frozenset(), max_model_len=100, vocab_size=50)
TOOL = {"type": "function", "name": "get_weather", "description": "d", "strict": True,
        "parameters": {"type": "object", "properties": {"days": {"type": "integer"}}}}


def test_every_sdk_field_in_exactly_one_list():
    names = set(typing.get_type_hints(params.ResponseCreateParamsBase)) | {"stream"}
    assert len(names) > 25
    bad = [f for f in names if (f in IMPLEMENTED) + (f in RESPONSES_IGNORED) + (f in REFUSED) != 1]
    assert not bad, bad


def test_string_input_and_instructions():
    chat = to_chat({"input": "hi", "instructions": "be brief", "max_output_tokens": 5, "temperature": 0.5})
    assert chat["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert chat["max_tokens"] == 5 and chat["temperature"] == 0.5
    parse_chat(chat, INFO)


def test_items_become_messages_with_calls_joined_to_one_assistant_turn():
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "sys"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                          {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}', "id": "fc_1"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
    ]
    msgs = to_chat({"input": items})["messages"]
    assert msgs[:2] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "ab"}]
    a = msgs[2]
    assert (a["role"], a["content"], a["reasoning_content"]) == ("assistant", "ok", "hm")
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in a["tool_calls"]] == [
        ("c1", "f", '{"x": 1}'), ("c2", "g", "{}")]
    assert msgs[3:] == [{"role": "tool", "tool_call_id": "c1", "content": "one"},
                        {"role": "tool", "tool_call_id": "c2", "content": "two"}]
    parse_chat(to_chat({"input": items}), INFO)


def test_tools_tool_choice_text_format_and_reasoning():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = to_chat({"input": "x", "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"},
                    "reasoning": {"effort": "minimal", "summary": "auto"}})
    assert chat["tools"] == [{"type": "function", "function": {k: TOOL[k] for k in ("name", "description",
                                                                                     "parameters", "strict")}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}
    assert parse_chat(chat, INFO).sampling["guide"].kind == "tool_call"
    fmt = {"type": "json_schema", "name": "r", "schema": schema, "strict": True}
    chat = to_chat({"input": "x", "text": {"format": fmt}, "reasoning": {"effort": "high"}})
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "r", "schema": schema,
                                                                              "strict": True}}
    assert chat["chat_template_kwargs"] == {"enable_thinking": True}
    assert parse_chat(chat, INFO).sampling["guide"].kind == "json_schema"
    forced = to_chat({"input": "x", "tools": [TOOL], "tool_choice": "required", "text": {"format": fmt}})
    assert "response_format" not in forced                  # a forced call writes no text to constrain


@pytest.mark.parametrize("body, param, code", [
    ({}, "input", "missing_required_parameter"),
    ({"input": []}, "input", "invalid_type"),
    ({"input": "x", "temprature": 1}, "temprature", "unknown_parameter"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
    ({"input": "x", "conversation": "c"}, "conversation", "unsupported_parameter"),
    ({"input": "x", "background": True}, "background", "unsupported_parameter"),
    ({"input": "x", "truncation": "auto"}, "truncation", "unsupported_parameter"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include", "unsupported_parameter"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_parameter"),
    ({"input": "x", "tools": [{**TOOL, "defer_loading": True}]}, "tools[0].defer_loading", "unknown_parameter"),
    ({"input": "x", "tool_choice": {"type": "mcp"}}, "tool_choice", "unsupported_parameter"),
    ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity", "unsupported_parameter"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "r"}}}, "text.format.schema", "invalid_type"),
    ({"input": "x", "reasoning": {"effort": "huge"}}, "reasoning.effort", "invalid_value"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    ({"input": "x", "stream_options": {"x": 1}}, "stream_options.x", "unknown_parameter"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content[0].type", "unsupported_parameter"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "unsupported_parameter"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
     "input[0].arguments", "invalid_type"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "missing_required_parameter"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "e"}]}, "input[0].encrypted_content",
     "unsupported_parameter"),
])
def test_refusals_name_the_field(body, param, code):
    with pytest.raises(ApiError) as e:
        to_chat(body)
    assert (e.value.status, e.value.param, e.value.code) == (400, param, code)


def test_ignored_and_neutral_fields_accepted():
    to_chat({"input": "x", "store": True, "metadata": {"a": "b"}, "user": "u", "include": [], "truncation": "disabled",
             "previous_response_id": None, "parallel_tool_calls": False, "prompt_cache_key": "k",
             "service_tier": "auto", "stream_options": {"include_obfuscation": False}})


def test_thinking_fields_map_and_conflicts_are_refused():
    for body, want in [({"reasoning_effort": "none"}, False), ({"reasoning_effort": "minimal"}, False),
                       ({"reasoning_effort": "medium"}, True), ({"thinking": {"type": "disabled"}}, False),
                       ({"thinking": {"type": "enabled"}, "reasoning_effort": "high"}, True)]:
        kwargs = {"enable_thinking": True}
        apply_thinking(body, kwargs)
        assert kwargs["enable_thinking"] is want, body
    for body, param in [({"reasoning_effort": "low", "thinking": {"type": "disabled"}}, "thinking"),
                        ({"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "none"},
                         "reasoning_effort"),
                        ({"thinking": {"type": "on"}}, "thinking.type"),
                        ({"thinking": {"budget": 5}}, "thinking.budget")]:
        with pytest.raises(ApiError) as e:
            apply_thinking(body, {"enable_thinking": True})
        assert e.value.param == param
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "none"},
                      INFO).chat_kwargs["enable_thinking"] is False
