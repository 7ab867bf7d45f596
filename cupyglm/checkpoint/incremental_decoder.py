"""Streaming detokenization: token ids in, text pieces out that never end inside a UTF-8 sequence."""
from __future__ import annotations

from cupyglm.checkpoint.tokenizer import Tokenizer


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
