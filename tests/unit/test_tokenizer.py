"""The tiny checkpoint's tokenizer: byte-level BPE, GLM special tokens, chat template, streaming decode."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cupyglm.checkpoint.chat_template import GLM_CHAT_TEMPLATE, ChatTemplateError
from cupyglm.checkpoint.incremental_decoder import IncrementalDecoder
from cupyglm.checkpoint.tiny_tokenizer import (
    ADDED_TOKENS, build_tiny_tokenizer, tiny_eos_token_ids, tiny_tokenizer_config,
)
from cupyglm.checkpoint.tokenizer import Tokenizer
from cupyglm.config import preset


@pytest.fixture(scope="module")
def tok(tiny_ckpt) -> Tokenizer:
    return tiny_ckpt.tokenizer


def test_vocab_is_exactly_the_config_vocab(tok):
    assert tok.vocab_size == 512 == preset("tiny").vocab_size
    assert [tok.token_id(t) for t in ADDED_TOKENS] == list(range(496, 512))
    assert tok.token_id("<|endoftext|>") == 496 and tok.token_id("</tool_call>") == 511
    with pytest.raises(KeyError, match="nope"):
        tok.token_id("<|nope|>")


def test_eos_ids_match_glm45_and_the_tiny_preset(tok, tiny_ckpt):
    want = (tok.token_id("<|endoftext|>"), tok.token_id("<|user|>"), tok.token_id("<|observation|>"))
    assert tok.eos_token_ids == want == (496, 503, 505)
    assert preset("tiny").eos_token_ids == want == tiny_ckpt.config.eos_token_ids


def test_tokenizer_build_is_deterministic():
    a, b = build_tiny_tokenizer(), build_tiny_tokenizer()
    assert a.to_str() == b.to_str()
    assert tiny_eos_token_ids(a) == (496, 503, 505)


@pytest.mark.parametrize("text", [
    "Hello, world! The quick brown fox.",
    "def f(x):\n    return x * 2\n",
    "héllo 世界 🙂",
    "  leading and trailing spaces  \n\n\ttabs",
    "",
])
def test_encode_decode_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < 496 for i in ids)          # plain text never yields added tokens
    assert tok.decode(ids) == text


def test_merges_compress_english(tok):
    text = "The quick brown fox jumps over the lazy dog."
    assert len(tok.encode(text)) < 0.6 * len(text.encode())      # 240 merges: modest, but real


def test_special_token_strings_become_their_ids(tok):
    text = "[gMASK]<sop><|user|>\nhi<|assistant|>\n<think>x</think>ok<|endoftext|>"
    ids = tok.encode(text)
    for t in ("[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<think>", "</think>", "<|endoftext|>"):
        assert tok.token_id(t) in ids
    assert ids[:3] == [tok.token_id("[gMASK]"), tok.token_id("<sop>"), tok.token_id("<|user|>")]
    assert tok.decode(ids) == text
    # specials go, the reasoning markers (added but not special) stay, as in GLM-4.5
    assert tok.decode(ids, skip_special_tokens=True) == "\nhi\n<think>x</think>ok"


def test_encode_inserts_nothing(tok):
    assert tok.encode("") == []
    assert tok.encode("a") == [tok.token_id("a")]


# ---- chat template -------------------------------------------------------------------------------------
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "How are you?"},
]


def test_chat_template_multi_turn_thinking_off_matches_glm45(tok):
    # GLM-4.5's template: no newline after <sop>; "\n" after each role token; /nothink on every user turn
    # when thinking is off; history assistant turns get an empty think block; the generation prompt with
    # thinking off is "<|assistant|>\n<think></think>" (no trailing newline).
    got = tok.apply_chat_template(CONVERSATION, add_generation_prompt=True, enable_thinking=False)
    assert got == ("[gMASK]<sop><|system|>\nYou are a helpful assistant.<|user|>\nHello/nothink"
                   "<|assistant|>\n<think></think>\nHi there<|user|>\nHow are you?/nothink"
                   "<|assistant|>\n<think></think>")


def test_chat_template_thinking_on(tok):
    got = tok.apply_chat_template(CONVERSATION)
    assert got == ("[gMASK]<sop><|system|>\nYou are a helpful assistant.<|user|>\nHello"
                   "<|assistant|>\n<think></think>\nHi there<|user|>\nHow are you?<|assistant|>")
    no_prompt = tok.apply_chat_template(CONVERSATION, add_generation_prompt=False)
    assert no_prompt == got[:-len("<|assistant|>")]


def test_chat_template_drops_history_reasoning_and_keeps_it_after_the_last_user(tok):
    msgs = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>secret plan</think>\n\nA1"},
        {"role": "user", "content": [{"type": "text", "text": "q2 "}, {"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": "A2", "reasoning_content": "  why  "},
    ]
    got = tok.apply_chat_template(msgs, add_generation_prompt=False)
    assert got == ("[gMASK]<sop><|user|>\nq1<|assistant|>\n<think></think>\nA1"
                   "<|user|>\nq2 part two<|assistant|>\n<think>why</think>\nA2")


def test_chat_template_user_already_nothink_is_not_doubled(tok):
    got = tok.apply_chat_template([{"role": "user", "content": "hi/nothink"}], enable_thinking=False)
    assert got == "[gMASK]<sop><|user|>\nhi/nothink<|assistant|>\n<think></think>"


def test_chat_template_tool_turns(tok):
    msgs = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "warm"},
    ]
    got = tok.apply_chat_template(msgs)
    assert got == ("[gMASK]<sop><|user|>\nweather?<|assistant|>\n<think></think>"
                   "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
                   "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
                   "<|observation|>\n<tool_response>\nsunny\n</tool_response>"
                   "\n<tool_response>\nwarm\n</tool_response><|assistant|>")


def test_chat_template_tools_preamble(tok):
    tools = [{"type": "function", "function": {"name": "f", "description": "é <b>", "parameters": {}}}]
    got = tok.apply_chat_template([{"role": "user", "content": "x"}], tools=tools)
    assert got.startswith("[gMASK]<sop><|system|>\n# Tools\n\n")
    assert '\n<tools>\n{"type": "function", "function": {"name": "f", "description": "é <b>", ' \
           '"parameters": {}}}\n</tools>\n' in got
    assert got.endswith("</tool_call><|user|>\nx<|assistant|>")


@pytest.mark.parametrize("role", ["developer", "robot", None])
def test_unknown_role_is_refused(tok, role):
    with pytest.raises(ValueError, match=re.escape(repr(role))):
        tok.apply_chat_template([{"role": "user", "content": "hi"}, {"role": role, "content": "x"}])


def test_template_raise_exception_reaches_the_caller():
    # The template's own guard (for roles the Python check would let through, e.g. a custom template caller).
    from cupyglm.checkpoint.chat_template import compile_chat_template

    with pytest.raises(ChatTemplateError, match="unknown message role: ghost"):
        compile_chat_template(GLM_CHAT_TEMPLATE).render(messages=[{"role": "ghost", "content": "x"}])


def test_non_text_content_part_is_refused(tok):
    with pytest.raises(ValueError, match="video_url"):
        tok.apply_chat_template([{"role": "user", "content": [{"type": "video_url", "video_url": "x"}]}])


def test_image_part_renders_one_placeholder_between_begin_and_end(tok):
    text = tok.apply_chat_template([{"role": "user", "content": ["Look: ", {"type": "image_url", "url": "x"}, "!"]}])
    assert "<|user|>\nLook: <|begin_of_image|><|image|><|end_of_image|>!" in text


def test_chat_prompt_tokenizes_to_special_ids(tok):
    ids = tok.encode(tok.apply_chat_template(CONVERSATION, enable_thinking=False))
    assert ids[:3] == [tok.token_id("[gMASK]"), tok.token_id("<sop>"), tok.token_id("<|system|>")]
    assert ids[-2:] == [tok.token_id("<think>"), tok.token_id("</think>")]


# ---- streaming decode ------------------------------------------------------------------------------------
def _stream(tok, ids, **kw):
    dec = IncrementalDecoder(tok, **kw)
    pieces = [dec.push(i) for i in ids]
    return pieces, dec.flush()


def test_incremental_decoder_multibyte(tok):
    text = "héllo 世界 🙂 — naïve café ✓"
    ids = tok.encode(text)
    pieces, tail = _stream(tok, ids)
    assert "".join(pieces) + tail == text
    assert tail == ""
    assert all("\ufffd" not in p for p in pieces)
    assert "" in pieces                       # some token ended inside a UTF-8 sequence and was held back


def test_incremental_decoder_flush_returns_held_back_bytes(tok):
    ids = tok.encode("🙂")
    dec = IncrementalDecoder(tok)
    assert [dec.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert dec.flush() == tok.decode(ids[:-1])          # an incomplete sequence comes out only at the end
    assert dec.flush() == ""


def test_incremental_decoder_with_specials(tok):
    ids = tok.encode("<|assistant|>\n<think>ok</think>héllo<|endoftext|>")
    pieces, tail = _stream(tok, ids)
    assert "".join(pieces) + tail == tok.decode(ids)
    pieces, tail = _stream(tok, ids, skip_special_tokens=True)
    assert "".join(pieces) + tail == "\n<think>ok</think>héllo"


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_incremental_decoder_property(tok, text):
    ids = tok.encode(text)
    pieces, tail = _stream(tok, ids)
    assert "".join(pieces) + tail == tok.decode(ids) == text
    if "\ufffd" not in text:
        assert all("\ufffd" not in p for p in pieces) and tail == ""


def test_tokenizer_from_config_in_memory():
    raw = build_tiny_tokenizer()
    t = Tokenizer(raw, tiny_tokenizer_config(raw))       # eos from tokenizer_config's eos_token
    assert t.eos_token_ids == (496,)
    assert t.model_max_length == 131072
