"""Tokenizer: a `tokenizers` byte-level BPE plus the checkpoint's jinja2 chat template.

`Tokenizer.from_dir(path)` loads a Hugging Face checkpoint's `tokenizer.json` and `tokenizer_config.json`.
`build_tiny_tokenizer()` trains the tiny checkpoint's tokenizer: the 256-byte alphabet, BPE merges learned
from a fixed built-in text, and the GLM special tokens at the top ids. `IncrementalDecoder` turns a stream of
token ids into text pieces that never end inside a UTF-8 sequence.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors, trainers

# ---- GLM special tokens ------------------------------------------------------------------------------
# In GLM-4.5 order. The last four are added tokens that are not "special": they survive
# skip_special_tokens so reasoning and tool-call parsers can see them.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>",
)
PLAIN_ADDED_TOKENS: tuple[str, ...] = ("<think>", "</think>", "<tool_call>", "</tool_call>")
ADDED_TOKENS: tuple[str, ...] = SPECIAL_TOKENS + PLAIN_ADDED_TOKENS
EOS_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|user|>", "<|observation|>")   # as GLM-4.5
TINY_VOCAB_SIZE = 512
TINY_MODEL_MAX_LENGTH = 131072


class ChatTemplateError(ValueError):
    """A chat template refused its input (raise_exception) or a message is malformed."""


# ---- the chat template ---------------------------------------------------------------------------------
# A GLM-4.5-style template (rendered with trim_blocks + lstrip_blocks, as Hugging Face renders templates):
#   [gMASK]<sop>, then per message <|system|>\n{text} | <|user|>\n{text}[/nothink] |
#   <|assistant|>\n<think>{reasoning}</think>\n{text} | <|observation|>\n<tool_response>...;
#   reasoning is kept only for assistant turns after the last user turn; the generation prompt is
#   <|assistant|>, plus \n<think></think> when thinking is off.
GLM_CHAT_TEMPLATE = r"""[gMASK]<sop>
{%- macro text_of(content) -%}
    {%- if content is none -%}
    {%- elif content is string -%}
        {{- content -}}
    {%- elif content is mapping -%}
        {{- raise_exception('message content must be a string or a list of text parts') -}}
    {%- elif content is iterable -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part is mapping and part.type == 'text' -%}
                {{- part.text -}}
            {%- else -%}
                {{- raise_exception('unsupported content part type: ' ~ (part.type if part is mapping else part)) -}}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content -}}
    {%- endif -%}
{%- endmacro -%}
{%- set thinking_off = enable_thinking is defined and not enable_thinking -%}
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
<arg_key>{arg-key-2}</arg_key>
<arg_value>{arg-value-2}</arg_value>
...
</tool_call>
{%- endif -%}
{%- set state = namespace(last_user=-1) -%}
{%- for m in messages -%}
    {%- if m.role == 'user' -%}{%- set state.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}
        {{- '<|system|>\n' + text_of(m.content) -}}
    {%- elif m.role == 'user' -%}
        {%- set text = text_of(m.content) -%}
        {{- '<|user|>\n' + text -}}
        {%- if thinking_off and not text.endswith('/nothink') -%}{{- '/nothink' -}}{%- endif -%}
    {%- elif m.role == 'assistant' -%}
        {%- set text = text_of(m.content) -%}
        {%- set reasoning = '' -%}
        {%- if m.reasoning_content is string -%}
            {%- set reasoning = m.reasoning_content -%}
        {%- elif '</think>' in text -%}
            {%- set reasoning = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set text = text.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {{- '<|assistant|>' -}}
        {%- if loop.index0 > state.last_user and reasoning -%}
            {{- '\n<think>' + reasoning.strip() + '</think>' -}}
        {%- else -%}
            {{- '\n<think></think>' -}}
        {%- endif -%}
        {%- if text.strip() -%}{{- '\n' + text.strip() -}}{%- endif -%}
        {%- if m.tool_calls -%}
            {%- for call in m.tool_calls -%}
                {%- set fn = call.function if call.function is defined else call -%}
                {{- '\n<tool_call>' + fn.name + '\n' -}}
                {%- set args = fn.arguments -%}
                {%- if args is string -%}{%- set args = args | fromjson -%}{%- endif -%}
                {%- for key, value in args.items() -%}
                    {{- '<arg_key>' + key + '</arg_key>\n<arg_value>' -}}
                    {{- value if value is string else value | tojson(ensure_ascii=False) -}}
                    {{- '</arg_value>\n' -}}
                {%- endfor -%}
                {{- '</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|observation|>' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + text_of(m.content) + '\n</tool_response>' -}}
    {%- else -%}
        {{- raise_exception('unknown message role: ' ~ m.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>' -}}
    {%- if thinking_off -%}{{- '\n<think></think>' -}}{%- endif -%}
{%- endif -%}
"""

CHAT_ROLES = ("system", "user", "assistant", "tool")


def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Hugging Face's tojson: plain json.dumps, no HTML escaping (jinja2's builtin escapes <, >, &).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


_TEMPLATE_CACHE: dict[str, Any] = {}


def compile_chat_template(source: str):
    """A jinja2 template in an immutable sandbox, compiled once per source text."""
    tpl = _TEMPLATE_CACHE.get(source)
    if tpl is None:
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.filters["fromjson"] = json.loads
        env.globals["raise_exception"] = _raise_exception
        tpl = env.from_string(source)
        _TEMPLATE_CACHE[source] = tpl
    return tpl


def _check_messages(messages: Sequence[dict]) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"message {i} is not an object")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise ChatTemplateError(f"message {i}: unknown role {role!r} (expected one of {', '.join(CHAT_ROLES)})")
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, str):
                    continue
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ChatTemplateError(f"message {i}: content part {j} has unsupported type {kind!r}")
        elif content is not None and not isinstance(content, str):
            raise ChatTemplateError(f"message {i}: content must be a string or a list of text parts")
        out.append(m)
    return out


# ---- the tokenizer ---------------------------------------------------------------------------------------
class Tokenizer:
    """A checkpoint's tokenizer: `tokenizers.Tokenizer` plus tokenizer_config.json (chat template, specials)."""

    def __init__(self, raw: tokenizers.Tokenizer, config: dict | None = None,
                 eos_token_ids: Sequence[int] | None = None, source: str = "<memory>"):
        self.raw = raw
        self.config = dict(config or {})
        self.source = source
        self._vocab = raw.get_vocab(with_added_tokens=True)
        self._special_ids = frozenset(i for i, t in raw.get_added_tokens_decoder().items() if t.special)
        if eos_token_ids is None:
            eos = self.config.get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            eos_token_ids = [self._vocab[eos]] if isinstance(eos, str) and eos in self._vocab else []
        self.eos_token_ids: tuple[int, ...] = tuple(int(i) for i in eos_token_ids)
        self.chat_template: str | None = self.config.get("chat_template")
        if isinstance(self.chat_template, list):       # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in self.chat_template}
            self.chat_template = named.get("default") or next(iter(named.values()), None)
        self.model_max_length = self.config.get("model_max_length")

    # -- loading --
    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load `tokenizer.json` (+ `tokenizer_config.json`, and eos ids from generation_config.json or
        config.json when present) from a checkpoint directory. Errors name the file."""
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{tok_file}: missing tokenizer.json")
        try:
            raw = tokenizers.Tokenizer.from_file(str(tok_file))
        except Exception as e:     # tokenizers raises a bare Exception on parse errors
            raise ValueError(f"{tok_file}: cannot read tokenizer ({e})") from None
        config: dict = {}
        cfg_file = path / "tokenizer_config.json"
        if cfg_file.is_file():
            config = _read_json(cfg_file)
        eos = None
        for name in ("generation_config.json", "config.json"):
            f = path / name
            if f.is_file():
                raw_cfg = _read_json(f)
                raw_cfg = raw_cfg.get("text_config") or raw_cfg
                value = raw_cfg.get("eos_token_id")
                if value is not None:
                    eos = value if isinstance(value, list) else [value]
                    break
        return cls(raw, config, eos, source=str(path))

    # -- vocabulary --
    @property
    def vocab_size(self) -> int:
        return self.raw.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        """Id of a vocabulary entry (e.g. a special token); KeyError if absent."""
        try:
            return self._vocab[token]
        except KeyError:
            raise KeyError(f"token {token!r} is not in the vocabulary of {self.source}") from None

    def id_to_token(self, token_id: int) -> str | None:
        return self.raw.id_to_token(int(token_id))

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    # -- text <-> ids --
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`. Nothing is inserted; special-token strings in the text become their ids."""
        return list(self.raw.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self.raw.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.raw.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # -- chat --
    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            enable_thinking: bool = True, tools: Sequence[dict] | None = None,
                            **kwargs) -> str:
        """Render `messages` with the checkpoint's chat template. Extra kwargs reach the template
        (chat_template_kwargs). Unknown roles and malformed content raise ChatTemplateError (a ValueError)."""
        if not self.chat_template:
            raise ChatTemplateError(f"{self.source}: tokenizer_config.json has no chat_template")
        msgs = _check_messages(messages)
        tpl = compile_chat_template(self.chat_template)
        specials = {k: self.config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        specials = {k: (v.get("content") if isinstance(v, dict) else v) for k, v in specials.items()}
        ctx = {**specials, **kwargs}
        return tpl.render(messages=msgs, tools=list(tools) if tools else None,
                          add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking, **ctx)

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab_size={self.vocab_size}, eos={list(self.eos_token_ids)})"


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return value


# ---- streaming detokenization ----------------------------------------------------------------------------
class IncrementalDecoder:
    """Turns a stream of token ids into text pieces.

    `push(id)` returns the text newly completed by that token ("" while the decoded tail ends in U+FFFD,
    i.e. inside a UTF-8 sequence split across tokens); `flush()` returns whatever is held back. The pieces
    concatenate to `tokenizer.decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0        # start of the window decoded for context
        self._read = 0          # ids before this are emitted
        self._prefix_text = ""  # decode(ids[_prefix:_read])

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self._decode(self.ids[self._prefix:])
        if len(text) > len(self._prefix_text) and not text.endswith("\ufffd"):
            piece = text[len(self._prefix_text):]
            self._prefix = self._read
            self._read = len(self.ids)
            self._prefix_text = self._decode(self.ids[self._prefix:self._read])
            return piece
        return ""

    def flush(self) -> str:
        if self._read >= len(self.ids):
            return ""
        text = self._decode(self.ids[self._prefix:])
        piece = text[len(self._prefix_text):]
        self._prefix = self._read = len(self.ids)
        self._prefix_text = ""
        return piece


# ---- the tiny tokenizer ----------------------------------------------------------------------------------
_TRAINING_TEXT = r'''
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of
foolishness. In the beginning there was nothing, and then there was a model that could read and write.
The server receives a request, tokenizes the prompt, and streams the answer back to the user one token at
a time. Every sentence here is part of a small, fixed training text so that the merges never change.
What is the capital of France? The capital of France is Paris. How are you today? I am fine, thank you.
Please answer the question below with a short explanation, and then give the final answer on its own line.
Hello world! Good morning, good evening, and good night. Once upon a time, in a land far away, there lived
a king and a queen who had three children. They were happy, and they lived there for many years.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 256 512 1024 2048 4096 65536 3.14159 2.71828 -1 +1 = == != <= >=
The weather is nice and the sky is blue. Water boils at one hundred degrees. The earth turns around the sun.
System messages set the rules; user messages ask; assistant messages answer; tool messages return results.

def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Request:
    def __init__(self, prompt, max_tokens=16, temperature=0.0):
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.temperature = temperature

    def __repr__(self):
        return f"Request(prompt={self.prompt!r}, max_tokens={self.max_tokens})"


import json
import numpy as np

def softmax(x):
    x = np.asarray(x, dtype=np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)

if __name__ == "__main__":
    print(json.dumps({"result": fibonacci(10), "ok": True}))

#include <stdio.h>
int main(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        printf("%d: %s\n", i, argv[i]);
    }
    return 0;
}

function add(a, b) { return a + b; }
const items = [1, 2, 3].map((x) => x * 2);
SELECT name, count(*) FROM users WHERE active = true GROUP BY name ORDER BY name;
'''


def build_tiny_tokenizer(vocab_size: int = TINY_VOCAB_SIZE) -> tokenizers.Tokenizer:
    """A byte-level BPE of exactly `vocab_size` ids: the 256-byte alphabet, merges trained on a fixed text,
    then the GLM added tokens at the top ids. Deterministic."""
    n_base = vocab_size - len(ADDED_TOKENS)
    if n_base < 256:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for the 256-byte alphabet")
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=n_base, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    lines = [ln for ln in _TRAINING_TEXT.splitlines(keepends=True)]
    tok.train_from_iterator(lines * 2, trainer=trainer)
    if tok.get_vocab_size() != n_base:
        raise RuntimeError(f"tiny tokenizer training produced {tok.get_vocab_size()} ids, wanted {n_base}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED_TOKENS])
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError(f"tiny tokenizer has {tok.get_vocab_size(with_added_tokens=True)} ids, wanted {vocab_size}")
    for i, t in enumerate(ADDED_TOKENS):
        assert tok.token_to_id(t) == n_base + i, t
    return tok


def tiny_tokenizer_config(tok: tokenizers.Tokenizer, model_max_length: int = TINY_MODEL_MAX_LENGTH) -> dict:
    """tokenizer_config.json for the tiny tokenizer (Hugging Face layout)."""
    decoder = {}
    for t in ADDED_TOKENS:
        decoder[str(tok.token_to_id(t))] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": t in SPECIAL_TOKENS,
        }
    return {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
        "remove_space": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": GLM_CHAT_TEMPLATE,
    }


def tiny_eos_token_ids(tok: tokenizers.Tokenizer) -> tuple[int, ...]:
    return tuple(tok.token_to_id(t) for t in EOS_TOKENS)
