"""Pure checks of the OpenAI wire format (cupyglm.server: errors, fields, requests, responses, sse)."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from cupyglm.server.errors import ApiError
from cupyglm.server.fields import parse_json_object
from cupyglm.server.requests import MAX_STOP_STRINGS, ModelInfo, fit_context, parse_chat, parse_completion
from cupyglm.server.responses import Reply, chat_response, chunk, token_sha, usage_chunk
from cupyglm.server.sse import SSE_DONE, sse, sse_error

INFO = ModelInfo(served_id="m", aliases=frozenset({"dir", "/x/dir"}), max_model_len=100, vocab_size=50)


def err(fn, *a):
    with pytest.raises(ApiError) as e:
        fn(*a)
    return e.value


def test_token_sha_definition():
    ids = [1, 22, 333]
    assert token_sha(ids) == hashlib.sha256(b"1,22,333").hexdigest()[:12]
    assert token_sha([]) == hashlib.sha256(b"").hexdigest()[:12]


def test_sse_framing_and_error_body():
    assert sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert SSE_DONE == b"data: [DONE]\n\n"
    e = ApiError(400, "bad", param="x", code="invalid_value")
    assert e.body() == {"error": {"message": "bad", "type": "invalid_request_error", "param": "x",
                                  "code": "invalid_value"}}
    assert json.loads(sse_error(e)[6:]) == e.body()


@pytest.mark.parametrize("raw, code", [(b"\xff", "invalid_utf8"), (b"{", "invalid_json"), (b"[]", "invalid_type"),
                                       (b"Infinity", "invalid_json"), (b"", "invalid_json")])
def test_body_refusals(raw, code):
    e = err(parse_json_object, raw)
    assert e.status == 400 and e.code == code


def test_body_accepts_bom():
    assert parse_json_object(b"\xef\xbb\xbf{}") == {}


def test_completion_defaults_and_aliases():
    for model in (None, "m", "dir", "/x/dir"):
        r = parse_completion({"prompt": "hi", **({"model": model} if model else {})}, INFO)
        assert r.model == "m" and r.prompt_text == "hi" and not r.stream
    s = r.sampling
    assert s["temperature"] == 1.0 and s["top_p"] == 1.0 and s["max_tokens"] is None and s["stop"] == ()
    assert parse_completion({"prompt": [[1, 2]]}, INFO).prompt_ids == [1, 2]
    assert parse_completion({"prompt": ["a"]}, INFO).prompt_text == "a"
    assert parse_completion({"prompt": "x", "top_k": -1}, INFO).sampling["top_k"] == 0
    assert parse_completion({"prompt": "x", "stop": "z"}, INFO).sampling["stop"] == ("z",)
    assert parse_completion({"prompt": "x", "max_tokens": 3.0}, INFO).sampling["max_tokens"] == 3
    e = err(parse_completion, {"prompt": "x", "model": "other"}, INFO)
    assert e.status == 404 and e.code == "model_not_found" and e.param == "model"


@pytest.mark.parametrize("field, value, code", [
    ("temperature", "1", "invalid_type"), ("temperature", True, "invalid_type"), ("temperature", 2.01, "invalid_value"),
    ("top_p", 0.0, "invalid_value"), ("min_p", -0.1, "invalid_value"), ("seed", 2**64, "invalid_value"),
    ("max_tokens", 0, "invalid_value"), ("max_tokens", 101, "context_length_exceeded"),
    ("max_completion_tokens", -3, "invalid_value"), ("min_tokens", -1, "invalid_value"),
    ("stop_token_ids", [50], "invalid_token_id"), ("n", 17, "invalid_value"), ("n", 0, "invalid_value"),
    ("best_of", 0, "invalid_value"), ("logprobs", 21, "invalid_value"), ("top_logprobs", 2, "unknown_parameter"),
    ("echo", "yes", "invalid_type"), ("suffix", "s", "unsupported_parameter"),
    ("logit_bias", {"1": 200}, "invalid_value"), ("logit_bias", {"99": 1}, "invalid_token_id"),
    ("logit_bias", {"a": 1}, "invalid_value"), ("frequency_penalty", 2.5, "invalid_value"),
    ("repetition_penalty", 0, "invalid_value"), ("draft", True, "unsupported_parameter"),
    ("draft", "no", "invalid_type"), ("response_format", "json", "invalid_type"),
    ("return_token_ids", 1, "invalid_type"), ("stream", "yes", "invalid_type"),
    ("use_beam_search", True, "unsupported_parameter"), ("guided_json", "[", "invalid_value"),
    ("guided_choice", [1], "invalid_value"), ("structured_outputs", 5, "invalid_type"),
    ("prompt_logprobs", 21, "invalid_value"), ("no_such_field", 1, "unknown_parameter"),
    ("stream_options", {"include_usage": True}, "invalid_value"),
])
def test_completion_field_refusals(field, value, code):
    e = err(parse_completion, {"prompt": "x", field: value}, INFO)
    assert (e.status, e.param, e.code) == (400, field, code)


def test_accepted_neutral_fields():
    r = parse_completion({"prompt": "x", "draft": False, "logprobs": None, "n": 1, "presence_penalty": 0,
                          "user": "u", "cache_salt": "s", "stream": True,
                          "stream_options": {"include_usage": True}}, INFO)
    assert r.include_usage and r.stream and r.cache_salt == "s"
    r = parse_completion({"prompt": "x", "cache_salt": "s"}, dataclasses.replace(INFO, prompt_cache=True))
    assert r.cache_salt == "s"                  # the prompt cache honours the salt
    assert parse_completion({"prompt": "x"}, INFO).cache_salt is None


def test_chat_messages():
    r = parse_chat({"messages": [{"role": "system", "content": "s"},
                                 {"role": "user", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]},
                                 {"role": "assistant", "content": None}, {"role": "tool", "content": "t"}]}, INFO)
    assert r.messages[1]["content"] == "ab"
    assert r.chat_kwargs == {"enable_thinking": True}
    off = parse_chat({"messages": [{"role": "user", "content": "x"}],
                      "chat_template_kwargs": {"enable_thinking": False}}, INFO)
    assert off.chat_kwargs["enable_thinking"] is False
    for messages, param in (([], "messages"), ("x", "messages"), ([{"role": "bot", "content": "x"}],
                            "messages[0].role"), ([{"role": "user"}], "messages[0].content"), ([5], "messages[0]")):
        assert err(parse_chat, {"messages": messages}, INFO).param == param
    e = err(parse_chat, {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, INFO)
    assert e.param == "tools[0]"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = parse_chat({"messages": [{"role": "user", "content": "x"}], "tools": [tool]}, INFO)
    assert r.tools == [tool] and r.chat_kwargs["tools"] == [tool]
    r = parse_chat({"messages": [{"role": "user", "content": "x"}], "tools": [tool], "tool_choice": "none"}, INFO)
    assert r.tools is None and "tools" not in r.chat_kwargs
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):     # a grammar forces the call
        r = parse_chat({"messages": [{"role": "user", "content": "x"}], "tools": [tool], "tool_choice": choice}, INFO)
        assert r.tools == [tool] and r.sampling["guide"].kind == "tool_call"
    dev = parse_chat({"messages": [{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}]}, INFO)
    assert dev.messages[0]["role"] == "system"


def test_fit_context():
    r = parse_completion({"prompt": "x"}, INFO)
    assert fit_context(r, 10, INFO)["max_tokens"] == 90
    e = err(fit_context, r, 100, INFO)
    assert e.code == "context_length_exceeded" and e.param == "prompt"
    r2 = parse_completion({"prompt": "x", "max_tokens": 50}, INFO)
    assert err(fit_context, r2, 60, INFO).param == "max_tokens"
    assert fit_context(r2, 50, INFO)["max_tokens"] == 50


def test_stop_limits():
    stops = [f"s{i}" for i in range(MAX_STOP_STRINGS)]
    assert MAX_STOP_STRINGS >= 64
    assert parse_completion({"prompt": "x", "stop": stops}, INFO).sampling["stop"] == tuple(stops)
    e = err(parse_completion, {"prompt": "x", "stop": stops + ["z"]}, INFO)
    assert e.param == "stop" and f"at most {MAX_STOP_STRINGS}" in e.message
    assert err(parse_completion, {"prompt": "x", "stop": [""]}, INFO).param == "stop"


def test_reply_shapes():
    r = Reply(id="c1", model="m", created=1, prompt_ids=[1, 2], token_ids=[3, 4], text="hi", finish_reason="stop")
    chat = chat_response(r, return_token_ids=True)
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert chat["choices"][0]["token_ids"] == [3, 4] and chat["choices"][0]["prompt_token_ids"] == [1, 2]
    assert chat["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert chat["token_sha"] == token_sha([3, 4])
    first = chunk("chat", r, text="h", first=True, prompt_ids=[1, 2], token_ids=[3])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "h"} and "token_sha" not in first
    last = chunk("completion", r, text="i", finish_reason="stop")
    assert last["token_sha"] == token_sha([3, 4]) and last["choices"][0]["text"] == "i"
    assert usage_chunk("chat", r)["choices"] == []


def test_best_of():
    r = parse_completion({"prompt": "x", "best_of": 3, "n": 2}, INFO)
    assert (r.n, r.best_of, r.per) == (2, 3, 3)
    assert parse_completion({"prompt": "x", "n": 2}, INFO).per == 2
    assert err(parse_completion, {"prompt": "x", "best_of": 1, "n": 2}, INFO).param == "best_of"
    assert err(parse_completion, {"prompt": "x", "best_of": 2, "stream": True}, INFO).param == "best_of"
    assert parse_completion({"prompt": "x", "best_of": 2, "n": 2, "stream": True}, INFO).per == 2
    assert err(parse_completion, {"prompt": ["a"] * 5, "best_of": 16}, INFO).param == "best_of"


def test_best_of_pick():
    from cupyglm.server.best_of import pick, score
    from cupyglm.server.responses import Reply

    def rep(i, lps):
        return Reply(id="c", model="m", created=0, prompt_ids=[1], token_ids=list(range(len(lps))),
                     logprobs=[(t, lp, []) for t, lp in enumerate(lps)], index=i, counts_prompt=i % 3 == 0)
    rs = [rep(0, [-1.0, -2.0]), rep(1, [-0.5]), rep(2, [-0.5]), rep(3, [-3.0]), rep(4, [-0.1, -0.1]), rep(5, [-9.0])]
    assert score(rs[0]) == -3.0
    got = pick(rs, 3, 2, asked_logprobs=False)
    assert [(r.index, r.token_ids, r.counts_prompt, r.logprobs) for r in got] == [
        (0, [0], True, None), (1, [0], False, None), (2, [0, 1], True, None), (3, [0], False, None)]
    assert pick(rs, 3, 1, asked_logprobs=True)[0].logprobs == rs[1].logprobs


def test_draft_follows_the_server_and_true_needs_drafts():
    import dataclasses

    drafting = dataclasses.replace(INFO, mtp_drafts=3)
    assert parse_completion({"prompt": "x", "draft": True}, drafting).sampling["draft"] is True
    assert parse_completion({"prompt": "x", "draft": False}, INFO).sampling["draft"] is False
    assert parse_completion({"prompt": "x"}, drafting).sampling["draft"] is None      # the server decides
