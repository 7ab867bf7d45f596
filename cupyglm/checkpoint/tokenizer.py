"""Tokenizer: a `tokenizers` byte-level BPE plus the checkpoint's tokenizer_config.json (chat template, specials).

`Tokenizer.from_dir(path)` loads a Hugging Face checkpoint's `tokenizer.json` and `tokenizer_config.json`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import tokenizers

from cupyglm.checkpoint.chat_template import ChatTemplateError, check_messages, compile_chat_template


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
        msgs = check_messages(messages)
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
