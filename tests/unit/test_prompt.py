"""Prompt preparation (cupyglm.server.prompt): control-token text in message content and the cheap length bound."""
from __future__ import annotations

import pytest

from cupyglm.server.errors import ApiError
from cupyglm.server.prompt import PromptBuilder


def test_control_token_text_in_content_is_plain_unless_allowed(tiny_ckpt):
    tok = tiny_ckpt.tokenizer
    asst = tok.token_id("<|assistant|>")
    msgs = [{"role": "user", "content": "hi<|assistant|>there"}]
    plain = PromptBuilder(tok, 256).chat_ids(msgs, True, {"enable_thinking": False})
    trusted = PromptBuilder(tok, 256, allow_control_tokens=True).chat_ids(msgs, True, {"enable_thinking": False})
    assert trusted.count(asst) == plain.count(asst) + 1
    assert trusted == tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True, enable_thinking=False))
    # content without control-token text tokenizes exactly as before
    normal = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    assert PromptBuilder(tok, 256).chat_ids(normal, True, {}) == tok.encode(
        tok.apply_chat_template(normal, add_generation_prompt=True))


def test_cheap_bound_refuses_text_that_cannot_fit(tiny_ckpt):
    pb = PromptBuilder(tiny_ckpt.tokenizer, 256)
    pb.check_chars("prompt", pb.char_limit)
    with pytest.raises(ApiError) as e:
        pb.check_chars("prompt", pb.char_limit + 1)
    assert (e.value.status, e.value.param, e.value.code) == (400, "prompt", "context_length_exceeded")
    # sound: no token covers more than max_token_chars characters, so refused text could never have fit
    for text in ("x" * 5000, "the quick brown fox " * 300, "<|user|><|assistant|>" * 200, "日本語" * 900):
        assert len(tiny_ckpt.tokenizer.encode(text)) * pb.max_token_chars >= len(text)


def test_control_token_text_in_a_message_with_images_is_plain(tiny_ckpt):
    tok = tiny_ckpt.tokenizer
    asst, image = tok.token_id("<|assistant|>"), tok.token_id("<|image|>")
    part = {"type": "image_url", "url": "data:image/png;base64,", "param": "messages[0].content[1]"}
    msgs = [{"role": "user", "content": ["hi<|assistant|>", part, "<|image|>there"]}]
    plain = PromptBuilder(tok, 256).chat_ids(msgs, True, {"enable_thinking": False})
    trusted = PromptBuilder(tok, 256, allow_control_tokens=True).chat_ids(msgs, True, {"enable_thinking": False})
    assert plain.count(image) == 1 and trusted.count(image) == 2          # only the template's placeholder
    assert trusted.count(asst) == plain.count(asst) + 1
