"""The bounds on structured-output guides, checked by name before anything compiles: the count of choices, the
characters of a guide, and JSON given as a string parsed under the body's nesting limit (400, never a 500)."""
from __future__ import annotations

import json

import pytest

from cupyglm.server.errors import ApiError
from cupyglm.server.fields import MAX_DEPTH
from cupyglm.server.requests import ModelInfo, parse_chat
from cupyglm.server.structured import MAX_GUIDE_CHARS, MAX_GUIDED_CHOICES

INFO = ModelInfo(served_id="m", aliases=frozenset(), max_model_len=100, vocab_size=50)
MSG = [{"role": "user", "content": "hi"}]


def _refused(extra: dict) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse_chat({"model": "m", "messages": MSG, **extra}, INFO)
    assert e.value.status == 400
    return e.value


@pytest.mark.parametrize("depth", [100_000, 5_000, MAX_DEPTH + 2])
@pytest.mark.parametrize("field", ["guided_json", "structured_outputs.json", "response_format.json_schema.schema"])
def test_a_deep_schema_in_a_string_is_a_400(depth, field):
    text = '{"a":' * depth + "1" + "}" * depth
    extra = {"guided_json": text} if field == "guided_json" else {"structured_outputs": {"json": text}} \
        if field.startswith("structured") else {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": text}}}
    if len(text) > MAX_GUIDE_CHARS:
        e = _refused(extra)
        assert e.param == field and f"at most {MAX_GUIDE_CHARS}" in e.message
        return
    e = _refused(extra)
    assert e.param == field and f"deeper than {MAX_DEPTH} levels" in e.message, e.message


def test_deep_schema_strings_under_the_size_bound_are_parsed_under_the_depth_limit():
    for depth in (MAX_DEPTH + 2, 2_000, 20_000):
        text = "[" * depth + "]" * depth                   # 20,000 deep: json.loads's own RecursionError
        e = _refused({"guided_json": text})
        assert e.param == "guided_json" and "deeper than" in e.message, e.message
    ok = '{"type":' * 1 + '"object"}'
    req = parse_chat({"model": "m", "messages": MSG, "guided_json": ok}, INFO)
    assert json.loads(req.sampling["guide"].text) == {"type": "object"}


def test_guided_choices_and_guide_sizes_are_bounded_by_name():
    e = _refused({"guided_choice": [f"c{i}" for i in range(100_000)]})
    assert e.param == "guided_choice" and f"at most {MAX_GUIDED_CHOICES}" in e.message and e.code == "too_large"
    e = _refused({"guided_choice": ["x" * 70_000] * 4})
    assert e.param == "guided_choice" and f"at most {MAX_GUIDE_CHARS}" in e.message
    e = _refused({"guided_regex": "a" * (MAX_GUIDE_CHARS + 1)})
    assert e.param == "guided_regex" and e.code == "too_large"
    e = _refused({"structured_outputs": {"grammar": "start: " + "a" * MAX_GUIDE_CHARS}})
    assert e.param == "structured_outputs.grammar"
    e = _refused({"guided_regex": "a{1,10"})
    assert e.param == "guided_regex" and "\n" not in e.message and "repetition" in e.message
    assert "/" not in e.message.replace("a{1,10", "")
    req = parse_chat({"model": "m", "messages": MSG, "guided_choice": [f"c{i}" for i in range(MAX_GUIDED_CHOICES)]},
                     INFO)
    assert req.sampling["guide"].kind == "choice"
