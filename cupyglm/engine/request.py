"""A request's life in the engine: its prompt, parameters, pages, generated tokens and outputs."""
from __future__ import annotations

import dataclasses
import enum

from cupyglm.engine.sampling import SamplingParams


class EngineError(RuntimeError):
    pass


class QueueFull(EngineError):
    """The waiting queue is at --max-queue (HTTP 429)."""


class RequestTooLong(ValueError):
    """A request that can never fit the context window or the KV pool; refused before it takes any page."""


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass(eq=False)
class Request:
    id: int
    prompt: tuple[int, ...]
    params: SamplingParams
    max_tokens: int                         # resolved (params.max_tokens, or what the window leaves)
    status: Status = Status.WAITING
    pages: list[int] = dataclasses.field(default_factory=list)   # page table (exact pool ids)
    fed: int = 0                            # positions whose KV is written (the model state's length)
    output: list[int] = dataclasses.field(default_factory=list)  # generated token ids
    announced: bool = False                 # admitted: every rank knows it
    finish_reason: str | None = None
    arrival: int = 0
    salt: str = ""                          # cache_salt: kept states are found only under the same salt
    cached: int = 0                         # prompt positions restored from a kept state
    miss_reason: str | None = None          # why nothing was restored (None when something was)
    draft_rate: float = 1.0                 # the price's acceptance average (draft.Pricer; starts optimistic)
    draft_skipped: int = 0                  # steps the price skipped drafting
    images: tuple = ()                      # images.ImageInput in prompt order (encoded when admitted)
    image_key: tuple | None = None          # with images: the prompt as the prompt cache keys it (images.cache_tokens)

    @property
    def key(self) -> tuple[int, ...] | None:
        """The token ids the prompt cache matches on; None: this prompt is neither kept nor restored."""
        return self.image_key if self.images else self.prompt

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def max_positions(self) -> int:
        """Positions this request can ever write: the prompt and every generated token but the last."""
        return self.prompt_len + self.max_tokens - 1

    @property
    def prefilling(self) -> bool:
        return self.fed < self.prompt_len

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


@dataclasses.dataclass
class RequestOutput:
    """What one engine step produced for one request (deltas)."""

    request_id: int
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int                  # generated so far, this step included
    cached_tokens: int = 0
    cache_miss_reason: str | None = None    # why no prompt positions were restored
    logprobs: list | None = None            # per new token (logprob, [(id, logprob)] top k), if requested
    prompt_logprobs: list | None = None     # with the first token: [(prompt token, logprob, top)] from token 1
    error: str | None = None                # finish_reason "error": why the engine refused the request
    draft: tuple[int, int] | None = None    # (drafts proposed, accepted) this step; None: the request drafts off
