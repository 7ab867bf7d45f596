"""Structured output on rank 0: one llguidance matcher per request with a grammar, its next-token mask computed on a
worker thread while the step's model call runs, applied to the step's fp32 logits rows (op mask_tokens), and the
sampled token consumed after the draw.

Where: the sampler runs on rank 0 only (engine/step_sample.py), so the matchers (each in its request's record,
engine/record.py) and the masks live on rank 0; the step message is unchanged and the other ranks never see a grammar.

A step: `start` (after the schedule, before the broadcast) hands the masks of the rows that will be sampled to
the worker thread (llguidance drops the GIL while it computes); the model call runs; `apply` waits for the masks
and edits the logits after the penalties and before the min_tokens bans and the draw, so the logprobs see the
masked logits (a forbidden id: -inf, reported as -9999); `consume` advances each matcher by its sampled token.
Rows without a grammar are never touched: their tokens equal those of the same request alone.

EOS: llguidance allows the EOS ids only where the grammar accepts, and only them once the grammar is complete, so
a reply ends "stop" exactly when its text is a whole match (or at a stop string / stop id the grammar allowed);
max_tokens ends it "length". A matcher that fails (a grammar's resource limits) ends its request "abort".

The tokenizer view: llguidance reads the checkpoint's tokenizer.json, with n_vocab = the model's vocabulary (ids
past the tokenizer's are never allowed) and the engine's EOS ids; its ids are the server's (tests check every id's
bytes). Byte-level token 0xFF is the one id llguidance cannot hold (its special-token marker): it is never allowed,
and never needed, since 0xFF occurs in no UTF-8 text.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import re
import threading
from collections.abc import Mapping

import numpy as np

from cupyglm.backend.numpy_token_mask import words
from cupyglm.engine.tool_grammar import tool_call_lark
from cupyglm.engine.tool_values import Unenforceable

KINDS = ("json_schema", "regex", "choice", "grammar", "tool_call")
# compact JSON (no free whitespace): a sampler cannot pad a reply with blanks forever; a schema's x-guidance wins
JSON_DEFAULTS = {"whitespace_flexible": False}
PREPARED = 16            # compiled guides kept for the requests about to be added (LRU)
_SOURCE = re.compile(r"(thread '[^']*' )?panicked at |\S*[/\\]\S+\.rs(:\d+)*:?|\s+")


def one_line(msg: str, limit: int = 300) -> str:
    """llguidance's message as one line naming the problem: its first line and its `error:` line, without
    source paths, panic prefixes or backtraces."""
    lines = [ln.strip() for ln in str(msg).split("stack backtrace:")[0].splitlines() if ln.strip()]
    if not lines:
        return "the grammar is invalid"
    if "panicked at" in lines[0] and len(lines) > 1:
        lines = lines[1:]                          # a panic's message follows its location line
    picked = lines[:1] + [ln for ln in lines[1:] if ln.startswith("error:")][:1]
    text = _SOURCE.sub(lambda m: " " if m.group(0).isspace() else "", "; ".join(p.rstrip(":") for p in picked))
    text = text.strip(" :;").removesuffix(" at")
    return (text[: limit - 3] + "...") if len(text) > limit else (text or "the grammar is invalid")


def _llg():
    import llguidance                   # imported on first use: a server without structured output never loads it
    return llguidance


@dataclasses.dataclass(frozen=True)
class Guide:
    """What a request's output must match: kind in KINDS; text is the JSON schema (JSON text), the regex, the
    choices (a JSON array of strings), a grammar (Lark as llguidance reads it, or GBNF), or for tool_call the JSON
    {"tools": [...], "name": a tool's name or null, "parallel": bool, "auto": bool, "thinking": bool}
    (cupyglm.engine.tool_grammar)."""

    kind: str
    text: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"guide kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.text, str):
            raise ValueError("guide text must be a string")

    def grammar(self, added: frozenset[str] = frozenset()) -> str:
        """The llguidance grammar (`added`: the tokenizer's added tokens, for tool_call); ValueError when the text
        is malformed (Unenforceable: a strict tool's schema holds what the tool-call grammar cannot enforce)."""
        llg = _llg()
        if self.kind == "tool_call":
            spec = json.loads(self.text)
            return llg.grammar_from("lark", tool_call_lark(
                spec["tools"], spec["name"], added, spec.get("parallel", True), spec.get("auto", False),
                spec.get("thinking", True)))
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.text)
            except ValueError:
                raise ValueError("the JSON schema is not valid JSON") from None
            return llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
        if self.kind == "choice":
            return llg.grammar_from("choice", self.text)
        return llg.grammar_from("regex" if self.kind == "regex" else "grammar", self.text)

    def check(self) -> str:
        """'' when the grammar compiles, else llguidance's message (no tokenizer needed); Unenforceable raised."""
        try:
            g = self.grammar()
        except Unenforceable:
            raise
        except ValueError as e:
            return one_line(str(e))
        err, msgs = _llg().LLMatcher.validate_grammar_with_warnings(g)
        return one_line(msgs[0]) if err else ""


class Guides:
    """Rank 0's matchers, one per request with a grammar (any thread may `prepare`; the engine's step thread the
    rest). `matchers`: the request id -> matcher mapping to read (the engine's: its records'); else its own dict."""

    def __init__(self, tokenizer, vocab: int, eos_ids, matchers: Mapping | None = None):
        self.tokenizer, self.vocab, self.eos_ids = tokenizer, int(vocab), [int(i) for i in eos_ids]
        self._tok = None
        self._matchers = {} if matchers is None else matchers
        self._prepared: collections.OrderedDict[Guide, object] = collections.OrderedDict()
        self._prep_lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor = None

    def view(self):
        """llguidance's tokenizer, built once from the checkpoint's tokenizer.json."""
        if self._tok is None:
            if self.tokenizer is None:
                raise ValueError("structured output needs the checkpoint's tokenizer")
            self._tok = _llg().LLTokenizer(self.tokenizer.raw.to_str(), n_vocab=self.vocab, eos_token=self.eos_ids)
        return self._tok

    def _build(self, guide: Guide):
        added = frozenset(t.content for t in self.tokenizer.raw.get_added_tokens_decoder().values())
        m = _llg().LLMatcher(self.view(), guide.grammar(added), log_level=0)
        if m.is_error():
            raise ValueError(f"structured output: the {guide.kind} does not compile: {one_line(m.get_error())}")
        return m

    def prepare(self, guide: Guide) -> None:
        """Compile `guide` ahead of `compile` (any thread: llguidance drops the GIL while it compiles, so the server
        does this in a worker, never on its event loop); ValueError naming the grammar's error."""
        m = self._build(guide)
        with self._prep_lock:
            self._prepared[guide] = m
            self._prepared.move_to_end(guide)
            while len(self._prepared) > PREPARED:
                self._prepared.popitem(last=False)

    def compile(self, guide: Guide):
        """A matcher of `guide` at the start of the output (a copy of the prepared one when there is one);
        ValueError naming the grammar's error."""
        with self._prep_lock:
            ready = self._prepared.get(guide)
        return ready.deep_copy() if ready is not None else self._build(guide)

    def put(self, request_id: int, matcher) -> None:
        """Hold a matcher in this object's own dict (not when the matchers are given)."""
        self._matchers[request_id] = matcher

    def drop(self, request_id: int) -> None:
        self._matchers.pop(request_id, None)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._matchers

    def start(self, request_ids: list[int]):
        """Begin the masks of the step's sampled rows (request_ids in row order) on the worker thread; a handle for
        `apply`, or None when no row has a grammar."""
        rows = [(i, self._matchers[rid]) for i, rid in enumerate(request_ids) if rid in self._matchers]
        if not rows:
            return None
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cupyglm-grammar")
            self._executor = _llg().LLExecutor()
        bits = np.full((len(rows), words(self.vocab)), -1, dtype=np.int32)   # [M, ceil(V / 32)] i32
        return [i for i, _ in rows], self._pool.submit(self._fill, [m for _, m in rows], bits)

    def _fill(self, matchers, bits: np.ndarray) -> np.ndarray:
        from llguidance.numpy import fill_next_token_bitmask_par
        fill_next_token_bitmask_par(self._executor, [(m, j) for j, m in enumerate(matchers)], bits)
        return bits

    def apply(self, ops, logits, handle, request_ids: list[int]) -> list[int]:
        """Wait for the masks and apply them to logits [R, V] f32 in place; the requests whose matcher failed
        (their rows are left as they are; the engine aborts them)."""
        if handle is None:
            return []
        rows, fut = handle
        bits = fut.result()
        failed = [request_ids[i] for i in rows if self._matchers[request_ids[i]].is_error()]
        keep = [j for j, i in enumerate(rows) if request_ids[i] not in failed]
        if keep:
            xp = ops.xp
            ops.mask_tokens(logits, xp.asarray(np.asarray([rows[j] for j in keep], dtype=np.int32)),
                            xp.asarray(np.ascontiguousarray(bits[keep])))
        return failed

    def consume(self, request_id: int, token: int) -> bool:
        """Advance the request's matcher by its sampled token; False when it failed."""
        m = self._matchers.get(request_id)
        return True if m is None else bool(m.consume_token(int(token)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
