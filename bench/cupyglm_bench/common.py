"""What every subcommand shares: the run context, request bodies, fixed token arrays, salts, comparisons."""
from __future__ import annotations

import hashlib
import sys
import threading
import uuid
from dataclasses import dataclass, field

from tqdm import tqdm

from .client import Client, StreamResult, first_difference
from .prompts import FIXED_TEXT


class UsageError(Exception):
    """A bad combination of options or a server that cannot run this benchmark (exit 2)."""


@dataclass
class Outcome:
    results: dict
    failures: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    tables: list = field(default_factory=list)


@dataclass
class Context:
    client: Client
    model: str
    models_entry: dict | None
    args: object
    show_progress: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def progress(self, total: int, desc: str):
        return tqdm(total=total, desc=desc, disable=not self.show_progress, leave=False, file=sys.stderr,
                    dynamic_ncols=True)

    def log(self, msg: str) -> None:
        with self._lock:
            print(msg, file=sys.stderr, flush=True)

    @property
    def max_model_len(self) -> int | None:
        v = (self.models_entry or {}).get("max_model_len")
        return int(v) if isinstance(v, int) and v > 0 else None

    # ---- request bodies ----
    def _common(self, max_tokens: int, temperature: float, seed: int | None, ignore_eos: bool) -> dict:
        body = {
            "model": self.model,
            "max_tokens": int(max_tokens),
            "temperature": float(temperature),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if temperature > 0 and seed is not None:
            body["seed"] = int(seed)
        if ignore_eos:
            body["ignore_eos"] = True
        if not getattr(self.args, "no_token_ids", False):
            body["return_token_ids"] = True
        body.update(getattr(self.args, "extra_body", None) or {})
        return body

    def completion_body(self, prompt, max_tokens: int, temperature: float = 0.0, seed: int | None = None,
                        ignore_eos: bool = True, **extra) -> dict:
        body = self._common(max_tokens, temperature, seed, ignore_eos)
        body["prompt"] = prompt
        body.update(extra)
        return body

    def chat_body(self, messages: list, max_tokens: int, temperature: float = 0.0, seed: int | None = None,
                  ignore_eos: bool = True, **extra) -> dict:
        body = self._common(max_tokens, temperature, seed, ignore_eos)
        body["messages"] = messages
        body["chat_template_kwargs"] = {"enable_thinking": False}
        body.update(extra)
        return body

    def send(self, body: dict, client: Client | None = None) -> StreamResult:
        c = client or self.client
        return c.chat(body) if "messages" in body else c.completion(body)


def new_salt(given: str | None = None) -> str:
    return given if given else uuid.uuid4().hex[:12]


def salt_int(salt: str, k: int = 0) -> int:
    return int.from_bytes(hashlib.sha256(f"{salt}#{k}".encode()).digest()[:8], "big")


def fixed_token_ids(ctx: Context) -> tuple[list[int], str]:
    """The fixed text's token ids: the server's /tokenize, else the prompt_token_ids a text completion streams
    back (return_token_ids), else the vocabulary cycled deterministically (--vocab-size or the /v1/models entry's
    vocab_size)."""
    ids = ctx.client.tokenize(FIXED_TEXT, ctx.model)
    if ids:
        return ids, "tokenize"
    r = ctx.send(ctx.completion_body(FIXED_TEXT, 1, ignore_eos=False, return_token_ids=True))
    if r.ok and r.prompt_token_ids:
        return list(r.prompt_token_ids), "prompt_token_ids"
    vocab = getattr(ctx.args, "vocab_size", None) or (ctx.models_entry or {}).get("vocab_size")
    if isinstance(vocab, int) and vocab > 0:
        lo = min(1000, vocab // 4)                # skip the low ids, where special tokens usually live
        n = max(1, vocab - lo)
        return [lo + (i * 7919) % n for i in range(min(n, 4096))], "vocab-cycle"
    raise UsageError("cannot build token-id prompts: the server has no /tokenize, does not return "
                     "prompt_token_ids, and no --vocab-size was given")


def exact_tokens(base: list[int], length: int) -> list[int]:
    """`base` cycled to exactly `length` tokens."""
    reps = -(-length // len(base))
    return (base * reps)[:length]


def salted_tokens(base: list[int], length: int, salt: str, vary: int = 4) -> list[int]:
    """`base` cycled to `length`, its first `vary` tokens replaced deterministically from `salt`, so no prefix
    of it was ever sent by another run (or another length of this run)."""
    toks = exact_tokens(base, length)
    pool = sorted(set(base))
    for j in range(min(vary, length)):
        toks[j] = pool[salt_int(salt, j) % len(pool)]
    return toks


def compare(a: StreamResult, b: StreamResult) -> dict:
    """Exactness of two replies: status equal / unequal / unverified (a hash missing) / failed."""
    if not a.ok or not b.ok:
        return {"status": "failed", "first_diff": None}
    sa, sb = a.token_sha, b.token_sha
    if sa is None or sb is None:
        return {"status": "unverified", "first_diff": None}
    if sa == sb:
        return {"status": "equal", "first_diff": None}
    return {"status": "unequal", "first_diff": first_difference(a.token_ids, b.token_ids)}


def parse_list(text: str, kind=int, name: str = "list") -> list:
    try:
        vals = [kind(x.strip()) for x in str(text).split(",") if x.strip()]
    except ValueError as e:
        raise UsageError(f"{name}: cannot parse {text!r}") from e
    if not vals:
        raise UsageError(f"{name}: empty")
    return vals


def run_parallel(fns: list, release_together: bool = True) -> list:
    """Run callables in threads, released at once by one Event; returns their results in order."""
    out = [None] * len(fns)
    go = threading.Event()
    ready = threading.Barrier(len(fns) + 1)

    def work(i, fn):
        ready.wait()
        if release_together:
            go.wait()
        try:
            out[i] = fn()
        except BaseException as e:  # noqa: BLE001 - surfaced to the caller below
            out[i] = e

    threads = [threading.Thread(target=work, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    ready.wait()
    go.set()
    for t in threads:
        t.join()
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out
