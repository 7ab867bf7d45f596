"""Rank 0's one record of a request: everything the front end keeps about it beside its scheduling.

The scheduler's `Request` (prompt, parameters, pages, positions fed, tokens generated, the draft price's rate,
which the scheduler's pricer reads as it plans) is the record's `req`; the rest lives here and nowhere else: the
seed it samples with, the text (incremental detokenization and stop-string state), the grammar matcher, the prompt
logprobs gathered until the first token, and this step's sampled logprobs and draft counts. What must stay true: a record exists exactly while its request
is live (from `Frontend.add` to `Frontend.end`), so ending it leaves nothing of the request behind on rank 0.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

from cupyglm.engine.request import Request
from cupyglm.engine.text import RequestText


@dataclasses.dataclass(eq=False)
class Record:
    req: Request
    seed: int                                # the RNG seed (params.seed, or one from the front end's sequence)
    text: RequestText
    matcher: object | None = None            # the llguidance matcher of a request with a grammar
    prompt_lp: list | None = None            # [(prompt token, logprob, top)] gathered until the first token
    logprobs: list = dataclasses.field(default_factory=list)    # this step's (logprob, top) per token taken
    drafts: tuple[int, int] = (0, 0)         # this step's drafts (proposed, accepted)

    @property
    def id(self) -> int:
        return self.req.id

    def add_prompt_logprobs(self, got: list) -> None:
        self.prompt_lp = (self.prompt_lp or []) + list(got)

    def take_prompt_logprobs(self) -> list | None:
        """The prompt logprobs, once: they travel with the request's first output."""
        got, self.prompt_lp = self.prompt_lp, None
        return got

    def clear_step(self) -> None:
        """Forget this step's logprobs and draft counts (a stop may leave some unused)."""
        self.logprobs, self.drafts = [], (0, 0)


class Matchers(Mapping):
    """The live records' grammar matchers by request id: what `grammar.Guides` reads on rank 0, so the record
    stays the matcher's only holder."""

    def __init__(self, records: dict[int, Record]):
        self._records = records

    def __getitem__(self, request_id: int):
        rec = self._records.get(request_id)
        if rec is None or rec.matcher is None:
            raise KeyError(request_id)
        return rec.matcher

    def __iter__(self) -> Iterator[int]:
        return (rid for rid, rec in list(self._records.items()) if rec.matcher is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)
