"""engine/tool_grammar.py and engine/tool_values.py: the forced tool-call grammar enforces each argument's JSON
schema inside GLM's call format (driven token by token through llguidance's matcher on the tiny tokenizer), bounds
the calls under parallel_tool_calls false, and refuses by name what a strict tool's schema asks beyond it."""
import json

import pytest

from cupyglm.engine.grammar import Guide, Guides
from cupyglm.engine.tool_values import Unenforceable

PROPS = {
    "unit": {"type": "string", "enum": ["c", "f"]},
    "city": {"type": "string", "minLength": 2, "maxLength": 6},
    "code": {"type": "string", "pattern": "^[a-z]{3}-\\d{2}$"},
    "tag": {"type": "string", "pattern": "ab"},
    "either": {"type": "string", "pattern": "^a|b$"},
    "days": {"type": "integer", "minimum": 1, "maximum": 9},
    "ratio": {"type": "number", "minimum": 0.5, "exclusiveMaximum": 2},
    "where": {"$ref": "#/$defs/Place"},
    "hits": {"type": "array", "items": {"type": "string", "maxLength": 2}, "maxItems": 2},
    "any": {},
    "when": {"type": "string", "format": "date-time"},
    "odd": {"type": "string", "enum": ["a.b", "x|y", "1/2", "[\\n]"], "pattern": "^(.*\\/.*|[^/]+)$"},
}
PLACE = {"type": "object", "properties": {"lat": {"type": "integer", "maximum": 90}}, "required": ["lat"],
         "additionalProperties": False}
FN = {"name": "probe", "strict": True, "parameters": {"type": "object", "properties": PROPS, "required": ["unit"],
                                                      "additionalProperties": False, "$defs": {"Place": PLACE}}}
TOOLS = [{"type": "function", "function": FN},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def guides(tiny_ckpt):
    return Guides(tiny_ckpt.tokenizer, tiny_ckpt.config.vocab_size, tiny_ckpt.config.eos_token_ids)


def call(name: str, **args: str) -> str:
    return (f"<tool_call>{name}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                                             for k, v in args.items()) + "</tool_call>")


def matches(guides, text: str, choice=None, parallel: bool = True, tools=TOOLS, **auto) -> bool:
    """Whether the whole text drives the tool-call matcher token by token to an accepting state."""
    spec = {"tools": tools, "name": choice, "parallel": parallel, **auto}
    m = guides.compile(Guide("tool_call", json.dumps(spec)))
    return all(m.consume_token(t) for t in guides.tokenizer.encode(text)) and m.is_accepting()


@pytest.mark.parametrize("args", [
    {"unit": "c"}, {"unit": "f", "city": "Paris"}, {"unit": "c", "city": "ab"}, {"unit": "c", "code": "abc-12"},
    {"unit": "c", "tag": "xxaby y"}, {"unit": "c", "either": "ax"}, {"unit": "c", "either": "xxb"},
    {"unit": "c", "days": "9"}, {"unit": "c", "ratio": "1.5"}, {"unit": "c", "where": '{"lat":-3}'},
    {"unit": "c", "hits": '["ab","c"]'}, {"unit": "c", "any": '"x"'}, {"unit": "c", "any": '[1,{"a":null}]'},
    {"unit": "f", "city": "Lyon", "code": "xyz-00", "days": "1", "hits": "[]"},
    {"unit": "c", "odd": "a.b"}, {"unit": "c", "odd": "x|y"}, {"unit": "c", "odd": "1/2"},
    {"unit": "c", "odd": "[\\n]"}, {"unit": "c", "when": "2026-12-04T16:05:08.5+01:00"},
])
def test_valid_arguments_are_accepted(guides, args):
    assert matches(guides, call("probe", **args), "probe")
    assert matches(guides, call("probe", **args))


@pytest.mark.parametrize("args", [
    {"unit": "k"}, {"unit": "cf"}, {"unit": "C"},                      # enum
    {"unit": "c", "city": "a"}, {"unit": "c", "city": "Londonx"},       # minLength 2, maxLength 6
    {"unit": "c", "code": "abc-1x"}, {"unit": "c", "code": "xabc-12"}, {"unit": "c", "code": "abc-123"},
    {"unit": "c", "tag": "a-b"}, {"unit": "c", "either": "xbx"},        # a pattern found anywhere / anchored
    {"unit": "c", "days": "0"}, {"unit": "c", "days": "10"}, {"unit": "c", "days": "2.0"}, {"unit": "c", "days": '"3"'},
    {"unit": "c", "ratio": "0.4"}, {"unit": "c", "ratio": "2"},         # minimum, exclusiveMaximum
    {"unit": "c", "where": '{"lat":91}'}, {"unit": "c", "where": '{"lat":1,"x":2}'}, {"unit": "c", "where": "{}"},
    {"unit": "c", "hits": '["abc"]'}, {"unit": "c", "hits": '["a","b","c"]'},
    {"unit": "c", "odd": "axb"}, {"unit": "c", "odd": "x"}, {"unit": "c", "odd": "[\n]"},
    {"unit": "c", "when": "2026-13-04T16:05:08Z"}, {"unit": "c", "when": "2026-12-04 16:05"},
    {"unit": "c", "any": "x"},                                          # an untyped value is JSON
    {"unit": "c", "days": " 3"}, {"unit": "c", "where": '{"lat": 3}'},  # JSON is compact
    {"city": "Paris"},                                                  # the required key is missing
    {"unit": "c", "other": "1"},                                        # no key outside properties
    {"city": "Paris", "unit": "c"},                                     # keys in the schema's order
])
def test_invalid_arguments_are_rejected(guides, args):
    assert not matches(guides, call("probe", **args), "probe")


def test_call_count_follows_choice_and_parallel(guides):
    one, two = call("probe", unit="c"), call("probe", unit="c") + "\n" + call("now")
    assert matches(guides, two) and matches(guides, one)
    assert not matches(guides, two, parallel=False) and matches(guides, one, parallel=False)
    assert not matches(guides, two, "probe") and not matches(guides, call("now"), "probe")


@pytest.mark.parametrize("thinking", (True, False))
def test_auto_allows_text_then_calls_that_keep_their_schemas(guides, thinking):
    one, think = call("probe", unit="c"), "<think>Hm, <b>.</think>\n"
    for text in ("", "Just text, <i>no</i> call.", "Let me check." + one, one + "\n" + call("now")):
        assert matches(guides, text, auto=True, thinking=thinking), text
    assert matches(guides, think + "Sure." + one, auto=True, thinking=thinking) is thinking
    assert matches(guides, "\n" + think + "Sure." + one, auto=True, thinking=thinking) is thinking
    assert matches(guides, "\nSure." + one, auto=True, thinking=thinking)
    assert not matches(guides, "x" + call("probe", unit="k"), auto=True, thinking=thinking)
    assert not matches(guides, one + "then more text", auto=True, thinking=thinking)
    assert not matches(guides, "a" + one + "\n" + call("now"), parallel=False, auto=True, thinking=thinking)
    assert matches(guides, "a" + one, parallel=False, auto=True, thinking=thinking)


def _strict(prop: dict, **params) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"x": prop}, **params}}}]


@pytest.mark.parametrize("tools, path", [
    (_strict({"type": "string", "format": "email"}), "tools[0].function.parameters.properties.x.format"),
    (_strict({"type": "string", "pattern": "a(?=b)"}), "tools[0].function.parameters.properties.x.pattern"),
    (_strict({"type": "string", "enum": [1, 2]}), "tools[0].function.parameters.properties.x.enum"),
    (_strict({"type": "string", "maxLength": -1}), "tools[0].function.parameters.properties.x.maxLength"),
    (_strict({"type": "array", "uniqueItems": True}), "tools[0].function.parameters.properties.x"),
    (_strict({"type": "integer"}, anyOf=[{"required": ["x"]}]), "tools[0].function.parameters.anyOf"),
    (_strict({"type": "integer"}, required=["y"]), "tools[0].function.parameters.required"),
])
def test_strict_refuses_what_it_cannot_enforce_by_name(tools, path):
    with pytest.raises(Unenforceable) as e:
        Guide("tool_call", json.dumps({"tools": tools, "name": None})).check()
    assert e.value.path == path and path in str(e.value)


def test_without_strict_the_unenforceable_keywords_are_skipped(guides):
    tools = _strict({"type": "string", "format": "email", "pattern": "a(?=b)", "maxLength": 3})
    tools[0]["function"]["strict"] = False
    tools[0]["function"]["parameters"]["properties"]["y"] = {"type": "array", "uniqueItems": True}
    assert Guide("tool_call", json.dumps({"tools": tools, "name": None})).check() == ""
    assert matches(guides, call("f", x="abc", y="[1,1]"), tools=tools)
    assert not matches(guides, call("f", x="abcd"), tools=tools)


def test_arg_tags_held_as_added_tokens(tiny_ckpt):
    """GLM-4.5's tokenizer holds the <arg_*> tags as added tokens: the grammar then names them as tokens."""
    import llguidance
    import tokenizers

    from cupyglm.engine.tool_grammar import tool_call_lark
    raw = tokenizers.Tokenizer.from_str(tiny_ckpt.tokenizer.raw.to_str())
    tags = ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
    raw.add_tokens([tokenizers.AddedToken(t, normalized=False, special=False) for t in tags])
    added = frozenset(t.content for t in raw.get_added_tokens_decoder().values())
    lt = llguidance.LLTokenizer(raw.to_str(), n_vocab=raw.get_vocab_size(), eos_token=tiny_ckpt.config.eos_token_ids)
    lark = tool_call_lark(TOOLS, "probe", added)
    assert "<arg_value>" in lark and '"<arg_value>"' not in lark

    def ok(text: str) -> bool:
        m = llguidance.LLMatcher(lt, llguidance.grammar_from("lark", lark), log_level=0)
        return all(m.consume_token(t) for t in raw.encode(text, add_special_tokens=False).ids) and m.is_accepting()
    assert ok(call("probe", unit="c", city="Paris", days="4"))
    assert not ok(call("probe", unit="c", city="Parisxx")) and not ok(call("probe", unit="x"))
