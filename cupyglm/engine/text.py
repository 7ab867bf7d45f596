"""Rank 0's text of one request: incremental detokenization, stop strings, what was already returned."""
from __future__ import annotations

from cupyglm.engine.sampling import SamplingParams, find_stop, holdback


class RequestText:
    """Rank 0's detokenization of one request: incremental text, stop strings, what was returned."""

    def __init__(self, tokenizer, params: SamplingParams):
        from cupyglm.checkpoint.incremental_decoder import IncrementalDecoder

        self.decoder = IncrementalDecoder(tokenizer, skip_special_tokens=params.skip_special_tokens) \
            if tokenizer is not None else None
        self.stops = params.stop
        self.hold = holdback(self.stops) if self.stops else 0
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, token: int, last: bool, include: bool) -> bool:
        """Add a generated token (include=False: a stop/EOS token whose text is not returned); True when a
        stop string matched (the text is cut before it)."""
        if self.decoder is None or self.stopped:
            return False
        before = len(self.text)
        if include:
            self.text += self.decoder.push(token)
        if last:
            self.text += self.decoder.flush()
        if self.stops and len(self.text) > before:
            i = find_stop(self.text, self.stops, before)
            if i >= 0:
                self.text = self.text[:i]
                self.stopped = True
        return self.stopped

    def take(self, finished: bool) -> str:
        end = len(self.text) if finished else max(self.sent, len(self.text) - self.hold)
        piece = self.text[self.sent:end]
        self.sent = end
        return piece
