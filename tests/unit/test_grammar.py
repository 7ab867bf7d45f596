"""engine/grammar.py and engine/token_mask.py: llguidance's view of the tiny tokenizer is the server's id for id,
the NumPy mask equals llguidance's own, the masks are computed on the worker thread, and grammars are checked."""
import json
import threading

import numpy as np
import pytest

from cupyglm.engine.grammar import Guide, Guides, one_line
from cupyglm.backend.numpy_token_mask import allowed, mask_rows, words


def _byte_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet: the printable bytes stand for themselves, the rest map to 256 + n in order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, n = {chr(b): b for b in keep}, 0
    for b in range(256):
        if b not in keep:
            out[chr(256 + n)] = b
            n += 1
    return out


@pytest.fixture(scope="module")
def guides(tiny_ckpt):
    return Guides(tiny_ckpt.tokenizer, tiny_ckpt.config.vocab_size, tiny_ckpt.config.eos_token_ids)


def test_token_view_is_the_servers(tiny_ckpt, guides):
    tok, lt = tiny_ckpt.tokenizer, guides.view()
    assert lt.vocab_size == tiny_ckpt.config.vocab_size and sorted(lt.eos_tokens) == sorted(tok.eos_token_ids)
    dec = _byte_decoder()
    added = {i for i in range(tok.vocab_size) if tok.raw.id_to_token(i) in tok.raw.get_added_tokens_decoder().values()
             or i in tok.raw.get_added_tokens_decoder()}
    for i in range(tok.vocab_size):
        name = tok.id_to_token(i)
        if i in added:                               # the GLM added tokens: llguidance's specials, by name
            assert lt.is_special_token(i) and lt.decode_bytes([i]) == name.encode(), i
        elif name == dec_inv(0xFF):                  # byte 0xFF: llguidance's special marker, never allowed
            assert lt.decode_bytes([i]) == b""
        else:
            assert not lt.is_special_token(i) and lt.decode_bytes([i]) == bytes(dec[c] for c in name), i
    text = 'Hi {"a": [1, 2.5, "x\\n"]} <think>ok</think><tool_call>f\n<|user|> end'
    assert lt.tokenize_str(text) == tok.encode(text)


def dec_inv(b: int) -> str:
    return next(c for c, v in _byte_decoder().items() if v == b)


def test_numpy_mask_equals_llguidance():
    from llguidance.numpy import apply_token_bitmask_inplace
    rng = np.random.default_rng(0)
    v = 1000
    x = rng.standard_normal((6, v)).astype(np.float32)
    x[2, 7] = np.nan
    bits = rng.integers(-2**31, 2**31, (3, words(v)), dtype=np.int64).astype(np.int32)
    rows = np.array([4, 0, 2], np.int32)
    mine = x.copy()
    mask_rows(mine, rows, bits)
    want = x.copy()
    sub = want[rows]
    apply_token_bitmask_inplace(sub, bits)
    want[rows] = sub
    want[2, 7] = np.nan                              # a NaN stays NaN (llguidance's own writes -inf there)
    np.testing.assert_array_equal(mine, want)
    assert allowed(bits, v).sum() == np.isfinite(mine[rows]).sum() + int(allowed(bits, v)[2, 7])


def test_masks_are_computed_on_the_worker_thread(guides):
    names = []
    fill = guides._fill
    guides._fill = lambda *a: (names.append(threading.current_thread().name), fill(*a))[1]
    try:
        guides.put(7, guides.compile(Guide("choice", '["yes", "no"]')))
        handle = guides.start([3, 7, 4])
        rows, fut = handle
        bits = fut.result()
        assert rows == [1] and names and names[0].startswith("cupyglm-grammar")
        ids = np.nonzero(allowed(bits, guides.vocab)[0])[0]
        got = {guides.view().decode_bytes([int(i)]) for i in ids}
        assert got and all(b"yes".startswith(t) or b"no".startswith(t) for t in got) and b"" not in got
        assert guides.start([3, 4]) is None
    finally:
        guides._fill = fill
        guides.drop(7)


def test_guide_checks():
    assert Guide("json_schema", json.dumps({"type": "object"})).check() == ""
    assert Guide("regex", "(").check()
    assert "not valid JSON" in Guide("json_schema", "{").check()
    assert "nowhere" in Guide("grammar", "start: nowhere").check()
    with pytest.raises(ValueError, match="guide kind"):
        Guide("xml", "x")


def test_errors_are_one_line_without_paths_or_backtraces():
    msg = Guide("regex", "a{1,10").check()
    assert "\n" not in msg and "unclosed counted repetition" in msg and "^" not in msg
    panic = ("thread '<unnamed>' panicked at /home/b/.cargo/registry/src/x/llguidance-1.0/src/earley/grammar.rs:9:5:\n"
             "too many items at src/api.rs:3\nstack backtrace:\n   0: rust_begin_unwind\n at /rustc/a/std.rs:1:2")
    assert one_line(panic) == "too many items"
    assert one_line("") == "the grammar is invalid" and len(one_line("x" * 1000)) == 300


def test_a_prepared_guide_is_copied_not_compiled(guides, monkeypatch):
    with pytest.raises(ValueError, match="^structured output: the regex does not compile: .*repetition$"):
        guides.prepare(Guide("regex", "a{1,10"))
    g = Guide("choice", json.dumps(["yes", "no"]))
    guides.prepare(g)
    monkeypatch.setattr(guides, "_build", lambda guide: pytest.fail("compiled again"))
    a, b = guides.compile(g), guides.compile(g)
    assert a is not b and not a.is_error() and not b.is_error()
