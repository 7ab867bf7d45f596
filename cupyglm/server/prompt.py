"""A request's prompt as token ids: the chat template rendered and the text tokenized, in a bounded worker pool.

`PromptBuilder`'s work runs off the event loop (through `WorkPool`, a bounded thread pool), after a
cheap bound: a token covers at most `max_token_chars` characters, so text of more than
`max_model_len * max_token_chars` characters cannot fit the context and is refused before any tokenizing.

Control tokens: the text of a special token (`<|assistant|>`, `[gMASK]`, ...) inside a message's content is
plain text by default: such content is tokenized with special-token matching off, so a user cannot forge a turn.
`allow_control_tokens=True` (`cupyglm-serve --allow-control-tokens`, for trusted clients) keeps the old
behaviour: the rendered conversation is tokenized as one text and such text becomes the control token.
A completion prompt is raw model input and always keeps special-token text as control tokens.
"""
from __future__ import annotations

import asyncio
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cupyglm.server.errors import ApiError, bad
from cupyglm.server.jsonproc import JsonProcess

DEFAULT_WORKERS = 2
DEFAULT_PENDING = 32       # preparations queued or running at once; more answer 429


def _too_long(param: str, chars: int, limit: int, max_model_len: int) -> ApiError:
    return ApiError(400, f"This model's maximum context length is {max_model_len} tokens; '{param}' holds {chars} "
                    f"characters, more than {max_model_len} tokens can hold (at most {limit} characters)",
                    param=param, code="context_length_exceeded")


class WorkPool:
    """Request preparation off the event loop, at most `pending` jobs queued or running at once: a thread pool,
    and a child process for big JSON bodies (`parse_big`: json.loads holds the GIL throughout its one C call)."""

    def __init__(self, workers: int = DEFAULT_WORKERS, pending: int = DEFAULT_PENDING):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cupyglm-prepare")
        self._json = JsonProcess()
        self._pending = pending
        self._busy = 0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._json.close()

    async def run(self, fn, *args):
        """`fn(*args)` in the pool (event loop thread only); 429 when `pending` jobs are queued or running."""
        if self._busy >= self._pending:
            raise ApiError(429, "too many requests are being prepared at once; retry later", code="queue_full",
                           headers={"Retry-After": "1"})
        self._busy += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        finally:
            self._busy -= 1

    async def parse_big(self, raw: bytes) -> dict:
        """A big body as a JSON object, parsed in the child process (cupyglm.server.jsonproc)."""
        return await self.run(self._json.parse, raw)


class PromptBuilder:
    """Renders and tokenizes prompts (called in WorkPool threads), after the cheap bound (on the event loop)."""

    def __init__(self, tokenizer: Any, max_model_len: int, *, allow_control_tokens: bool = False):
        self.tok = tokenizer
        self.max_model_len = max_model_len
        self.allow_control_tokens = allow_control_tokens
        raw = tokenizer.raw
        added = raw.get_added_tokens_decoder().values()
        self._specials = tuple(t.content for t in added if t.special)
        self._special_re = re.compile("|".join(re.escape(s) for s in self._specials)) if self._specials else None
        longest = max((len(k) for k in raw.get_vocab(with_added_tokens=True)), default=1)
        self.max_token_chars = max(1, longest)
        self.char_limit = max_model_len * self.max_token_chars
        self._plain: Any = None          # a copy of the raw tokenizer that matches no special token

    # ---- the cheap bound (event loop) ---------------------------------------------------------------------------
    def check_chars(self, param: str, chars: int) -> None:
        if chars > self.char_limit:
            raise _too_long(param, chars, self.char_limit, self.max_model_len)

    def check_messages(self, messages: list[dict]) -> None:
        chars = sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))
        self.check_chars("messages", chars)

    # ---- the work (worker threads) ------------------------------------------------------------------------------
    def text_ids(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def chat_ids(self, messages: list[dict], add_generation_prompt: bool, kwargs: dict) -> list[int]:
        forged = [] if self.allow_control_tokens or self._special_re is None else [
            i for i, m in enumerate(messages)
            if isinstance(m.get("content"), str) and self._special_re.search(m["content"])]
        if not forged:
            return self.tok.encode(self._render(messages, add_generation_prompt, kwargs))
        # content holding control-token text goes through the template as a marker, then is tokenized as text
        mark = f"\x00cupyglm-{secrets.token_hex(8)}-"
        swapped = [dict(m, content=f"{mark}{i}\x00") if i in forged else m for i, m in enumerate(messages)]
        text = self._render(swapped, add_generation_prompt, kwargs)
        pieces = re.split(re.escape(mark) + r"(\d+)\x00", text)
        ids: list[int] = []
        for j, piece in enumerate(pieces):
            if j % 2 == 0:
                ids += self.tok.encode(piece) if piece else []
            else:
                ids += self._plain_encode(messages[int(piece)]["content"])
        return ids

    def _render(self, messages: list[dict], add_generation_prompt: bool, kwargs: dict) -> str:
        try:
            return self.tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        except (ValueError, TypeError) as e:
            raise bad("messages", f"cannot render the chat template: {e}") from None
        except Exception as e:  # noqa: BLE001 - jinja errors raised by the template itself
            raise bad("messages", f"cannot render the chat template: {type(e).__name__}: {e}") from None

    def _plain_encode(self, text: str) -> list[int]:
        if self._plain is None:
            import tokenizers

            plain = tokenizers.Tokenizer.from_str(self.tok.raw.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return list(self._plain.encode(text, add_special_tokens=False).ids)
