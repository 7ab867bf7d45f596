"""The allow-list: every request field of the installed openai SDK and of vLLM's extra parameters is in exactly one
of implemented / ignored / refused, and a field that would change the output is never accepted silently."""
from __future__ import annotations

import typing

import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import ChatCompletionStreamOptionsParam
from openai.types.chat import completion_create_params as chat_params

from cupyglm.server.allowlist import STREAM_OPTIONS_IGNORED, STREAM_OPTIONS_IMPLEMENTED, lists
from cupyglm.server.errors import ApiError
from cupyglm.server.requests import ModelInfo, parse_chat, parse_completion

INFO = ModelInfo(served_id="m", aliases=frozenset(), max_model_len=100, vocab_size=50)
MSG = [{"role": "user", "content": "hi"}]

# vLLM's extra parameters of the OpenAI-compatible server (docs.vllm.ai, "OpenAI-Compatible Server", sections
# "Extra parameters" for the Completions and Chat APIs: sampling parameters and other parameters)
VLLM_COMMON = [
    "best_of", "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
    "spaces_between_special_tokens", "truncate_prompt_tokens", "allowed_token_ids", "prompt_logprobs",
    "bad_words", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
    "guided_whitespace_pattern", "structural_tag", "structured_outputs", "priority", "request_id",
    "logits_processors", "return_tokens_as_token_ids", "return_token_ids", "cache_salt", "kv_transfer_params",
    "vllm_xargs", "add_special_tokens", "response_format", "seed",
]
VLLM_CHAT = VLLM_COMMON + [
    "echo", "add_generation_prompt", "continue_final_message", "documents", "chat_template",
    "chat_template_kwargs", "mm_processor_kwargs",
]
VLLM_COMPLETION = VLLM_COMMON + ["prompt_embeds", "echo"]
# this project's own fields
OWN = ["draft"]


def _sdk_fields(module) -> list[str]:
    names = set(typing.get_type_hints(module.CompletionCreateParamsBase))
    names |= set(typing.get_type_hints(module.CompletionCreateParamsStreaming))
    return sorted(names)


FIELDS = {
    "chat": sorted(set(_sdk_fields(chat_params) + VLLM_CHAT + OWN)),
    "completion": sorted(set(_sdk_fields(completion_params) + VLLM_COMPLETION + OWN)),
}


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_every_field_in_exactly_one_list(kind):
    implemented, ignored, refused = lists(kind)
    assert "stream" in FIELDS[kind] and len(FIELDS[kind]) > 30
    missing = [f for f in FIELDS[kind] if (f in implemented) + (f in ignored) + (f in refused) != 1]
    assert not missing, f"{kind}: fields in none or several lists: {missing}"
    assert not (set(implemented) & set(ignored)) and not (set(implemented) & set(refused))
    assert not (set(ignored) & set(refused))


def test_stream_options_fields_classified():
    for f in typing.get_type_hints(ChatCompletionStreamOptionsParam):
        assert (f in STREAM_OPTIONS_IMPLEMENTED) + (f in STREAM_OPTIONS_IGNORED) == 1, f


def _parse(kind, extra):
    body = {"messages": MSG, **extra} if kind == "chat" else {"prompt": "x", **extra}
    return (parse_chat if kind == "chat" else parse_completion)(body, INFO)


# values that would change the output: each must be refused by name (issue 19, item 4 and the rest)
CHANGING = {
    "guided_json": {"type": "object"}, "guided_choice": ["a", "b"], "guided_regex": "a+", "guided_grammar": "g",
    "structured_outputs": {"choice": ["a"]}, "functions": [{"name": "f", "parameters": {}}],
    "function_call": {"name": "f"}, "use_beam_search": True, "prediction": {"type": "content", "content": "x"},
    "modalities": ["text", "audio"], "reasoning_effort": "low", "audio": {"voice": "alloy", "format": "wav"},
    "verbosity": "low", "web_search_options": {}, "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "required", "response_format": {"type": "json_object"}, "logit_bias": {"1": 5},
    "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2, "logprobs": 2,
    "top_logprobs": 2, "prompt_logprobs": 1, "best_of": 2, "echo": True, "suffix": "s", "bad_words": ["x"],
    "allowed_token_ids": [1], "include_stop_str_in_output": True, "truncate_prompt_tokens": 4,
    "length_penalty": 0.5, "logits_processors": ["p"], "return_tokens_as_token_ids": True,
    "continue_final_message": True, "chat_template": "{{ x }}", "add_special_tokens": False,
    "spaces_between_special_tokens": False, "structural_tag": "t", "guided_decoding_backend": "xgrammar",
    "guided_whitespace_pattern": " ", "kv_transfer_params": {}, "vllm_xargs": {"a": 1}, "documents": [],
    "mm_processor_kwargs": {"a": 1}, "prompt_embeds": "AAAA", "moderation": True,
}


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_refused_fields_are_refused_by_name(kind):
    _, _, refused = lists(kind)
    for name in refused:
        assert name in CHANGING, f"no output-changing value listed for refused field {name!r}"
        value = CHANGING[name]
        if kind == "chat" and name == "logprobs":
            value = True
        with pytest.raises(ApiError) as e:
            _parse(kind, {name: value})
        assert (e.value.status, e.value.param, e.value.code) == (400, name, "unsupported_parameter"), name


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_ignored_fields_and_neutral_values_accepted(kind):
    _, ignored, refused = lists(kind)
    neutral = {"use_beam_search": False, "modalities": ["text"], "best_of": 1,
               "response_format": {"type": "text"}, "tools": [],
               "tool_choice": "none", "echo": False, "functions": None}
    body = {k: v for k, v in neutral.items() if k in refused}
    body.update({name: "x" for name in ignored})
    _parse(kind, body)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_unknown_field_refused(kind):
    with pytest.raises(ApiError) as e:
        _parse(kind, {"temprature": 0.5})
    assert (e.value.param, e.value.code) == ("temprature", "unknown_parameter")
    with pytest.raises(ApiError) as e:
        _parse(kind, {"stream": True, "stream_options": {"include_usage": True, "every_chunk": True}})
    assert e.value.param == "stream_options.every_chunk"


# structured output (llguidance): each source becomes the engine's guide; what is not built is refused by name
STRUCTURED = {
    "response_format": ({"type": "json_object"}, "json_schema"),
    "guided_json": ({"type": "object", "properties": {"a": {"type": "integer"}}}, "json_schema"),
    "guided_regex": ("a+", "regex"), "guided_choice": (["a", "b"], "choice"),
    "guided_grammar": ('start: "a" | "b"', "grammar"),
    "structured_outputs": ({"choice": ["a"]}, "choice"),
}


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_structured_fields_become_guides(kind):
    implemented, _, _ = lists(kind)
    for name, (value, guide_kind) in STRUCTURED.items():
        assert name in implemented
        assert _parse(kind, {name: value}).sampling["guide"].kind == guide_kind, name
    schema = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    g = _parse(kind, {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema,
                                                                                 "strict": True}}}).sampling["guide"]
    assert g.kind == "json_schema" and g.text == __import__("json").dumps(schema)
    for so, guide_kind in (({"json": schema}, "json_schema"), ({"regex": "[0-9]+"}, "regex"),
                           ({"grammar": 'start: "x"'}, "grammar"), ({"json_object": True}, "json_schema")):
        assert _parse(kind, {"structured_outputs": so}).sampling["guide"].kind == guide_kind
    assert _parse(kind, {"response_format": {"type": "text"}}).sampling["guide"] is None


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("extra,param,code", [
    ({"response_format": {"type": "structural_tag"}}, "response_format.type", "unsupported_parameter"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "invalid_value"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "extra": 1}}},
     "response_format.json_schema.extra", "unknown_parameter"),
    ({"structured_outputs": {"regex": "a", "structural_tag": "t"}}, "structured_outputs.structural_tag",
     "unsupported_parameter"),
    ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern",
     "unsupported_parameter"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "invalid_value"),
    ({"structured_outputs": {"regex": "a", "backend": "x"}}, "structured_outputs.backend", "unknown_parameter"),
    ({"guided_regex": "("}, "guided_regex", "invalid_value"),
    ({"guided_json": "{"}, "guided_json", "invalid_value"),
    ({"guided_choice": []}, "guided_choice", "invalid_value"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "invalid_value"),
    ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos", "invalid_value"),
    ({"guided_regex": "a", "min_tokens": 2}, "min_tokens", "invalid_value"),
    ({"guided_regex": "a", "guided_decoding_backend": "xgrammar"}, "guided_decoding_backend",
     "unsupported_parameter"),
])
def test_structured_refusals_by_name(kind, extra, param, code):
    with pytest.raises(ApiError) as e:
        _parse(kind, extra)
    assert (e.value.param, e.value.code) == (param, code)


def test_tool_choice_required_and_named_become_guides():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer"}}, "required": ["n"]}}}
    for choice, name in (("required", None), ({"type": "function", "function": {"name": "f"}}, "f")):
        r = _parse("chat", {"tools": [tool], "tool_choice": choice})
        g = r.sampling["guide"]
        assert g.kind == "tool_call" and __import__("json").loads(g.text)["name"] == name and r.tools == [tool]
    assert _parse("chat", {"tools": [tool], "tool_choice": "auto"}).sampling["guide"] is None
    for choice in ({"type": "function", "function": {"name": "g"}}, {"type": "function"}, "always"):
        with pytest.raises(ApiError) as e:
            _parse("chat", {"tools": [tool], "tool_choice": choice})
        assert e.value.param == "tool_choice"
    with pytest.raises(ApiError) as e:
        _parse("chat", {"tools": [tool], "tool_choice": "required", "guided_regex": "a"})
    assert e.value.param == "tool_choice"
    broken = {"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "nope"}}}}}
    with pytest.raises(ApiError) as e:
        _parse("chat", {"tools": [broken], "tool_choice": "required"})
    assert e.value.param == "tools[0].function.parameters.properties.n"


def test_parallel_tool_calls_and_strict_refusals():
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object",
            "properties": {"d": {"type": "string", "format": "email"}}}}}
    with pytest.raises(ApiError) as e:
        _parse("chat", {"tools": [tool], "tool_choice": "required"})
    assert e.value.param == "tools[0].function.parameters.properties.d.format" and "format" in e.value.message
    tool["function"]["strict"] = False
    r = _parse("chat", {"tools": [tool], "tool_choice": "required", "parallel_tool_calls": False})
    assert __import__("json").loads(r.sampling["guide"].text)["parallel"] is False and not r.parallel_tool_calls
    assert _parse("chat", {"tools": [tool]}).parallel_tool_calls
    assert _parse("chat", {"tools": [tool]}).sampling["guide"] is None        # auto, not strict, parallel
    auto = _parse("chat", {"tools": [tool], "parallel_tool_calls": False}).sampling["guide"]
    assert __import__("json").loads(auto.text)["auto"] is True
    rf = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}
    assert _parse("chat", {"tools": [tool], "parallel_tool_calls": False,
                           "response_format": rf}).sampling["guide"].kind == "json_schema"
    tool["function"]["strict"] = True
    with pytest.raises(ApiError) as e:                                        # auto with a strict tool: enforced
        _parse("chat", {"tools": [tool]})
    assert e.value.param == "tools[0].function.parameters.properties.d.format"
    tool["function"]["strict"] = False
    with pytest.raises(ApiError) as e:
        _parse("chat", {"tools": [tool], "parallel_tool_calls": "no"})
    assert e.value.param == "parallel_tool_calls"
