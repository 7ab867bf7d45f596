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

    async def run_within(self, timeout_s: float, fn, *args):
        """`fn(*args)` in the pool, awaited at most `timeout_s` (TimeoutError past it). A job past its deadline keeps
        its pending slot until its thread is done, so slow jobs cannot pile up beyond `pending`."""
        if self._busy >= self._pending:
            raise ApiError(429, "too many requests are being prepared at once; retry later", code="queue_full",
                           headers={"Retry-After": "1"})
        self._busy += 1
        fut = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        fut.add_done_callback(self._job_done)
        return await asyncio.wait_for(asyncio.shield(fut), timeout_s)

    def _job_done(self, fut) -> None:
        self._busy -= 1
        if not fut.cancelled():
            fut.exception()               # retrieved: a job past its deadline fails silently

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
    def text_ids(self, text: str, cap: int | None = None) -> list[int]:
        return self._encode(text, cap)

    def _encode(self, text: str, cap: int | None = None, tok: Any = None) -> list[int]:
        """The ids of `text`; past `cap` tokens, 400 context_length_exceeded before the ids become a list.
        encode_batch_fast drops the GIL while it tokenizes (encode holds it) and builds no offsets, so the
        encoding is freed quickly; it is freed here, in the worker, never by the event loop (an exception's
        traceback would carry it there)."""
        enc = (tok or self.tok.raw).encode_batch_fast([text], add_special_tokens=False)[0]
        n = len(enc)
        if cap is None or n <= cap:
            return enc.ids
        del enc
        raise ApiError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                       f"your prompt has at least {n} tokens, leaving no room for a completion.",
                       param="prompt", code="context_length_exceeded")

    def chat_ids(self, messages: list[dict], add_generation_prompt: bool, kwargs: dict,
                 cap: int | None = None) -> list[int]:
        try:
            return self._chat_ids(messages, add_generation_prompt, kwargs, cap)
        except ApiError as e:
            e.param = "messages" if e.code == "context_length_exceeded" else e.param
            raise

    def _chat_ids(self, messages: list[dict], add_generation_prompt: bool, kwargs: dict, cap: int | None):
        forged = [] if self.allow_control_tokens or self._special_re is None else self._forged(messages)
        if not forged:
            return self._encode(self._render(messages, add_generation_prompt, kwargs), cap)
        # text holding control-token text goes through the template as a marker, then is tokenized as text
        mark = f"\x00cupyglm-{secrets.token_hex(8)}-"
        swapped = [dict(m) for m in messages]
        for i, j in forged:
            key = f"{mark}{i}.{j}\x00"
            if j < 0:
                swapped[i]["content"] = key
            else:
                swapped[i]["content"] = [key if k == j else p for k, p in enumerate(swapped[i]["content"])]
        text = self._render(swapped, add_generation_prompt, kwargs)
        pieces = re.split(re.escape(mark) + r"(\d+)\.(-?\d+)\x00", text)
        ids: list[int] = []
        for n in range(0, len(pieces), 3):
            ids += self._encode(pieces[n], cap) if pieces[n] else []
            if n + 2 < len(pieces):
                i, j = int(pieces[n + 1]), int(pieces[n + 2])
                ids += self._plain_encode(messages[i]["content"] if j < 0 else messages[i]["content"][j], cap)
        return ids

    def _forged(self, messages: list[dict]) -> list[tuple[int, int]]:
        """(message, part or -1 for string content) of each text holding a special token's text."""
        out = []
        for i, m in enumerate(messages):
            c = m.get("content")
            if isinstance(c, str) and self._special_re.search(c):
                out.append((i, -1))
            elif isinstance(c, list):
                out += [(i, j) for j, p in enumerate(c) if isinstance(p, str) and self._special_re.search(p)]
        return out

    def _render(self, messages: list[dict], add_generation_prompt: bool, kwargs: dict) -> str:
        try:
            return self.tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        except (ValueError, TypeError) as e:
            raise bad("messages", f"cannot render the chat template: {e}") from None
        except Exception as e:  # noqa: BLE001 - jinja errors raised by the template itself
            raise bad("messages", f"cannot render the chat template: {e}") from None

    def _plain_encode(self, text: str, cap: int | None = None) -> list[int]:
        if self._plain is None:
            import tokenizers

            plain = tokenizers.Tokenizer.from_str(self.tok.raw.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._encode(text, cap, self._plain)
