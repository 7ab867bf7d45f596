"""The state every route reads: `ServerState` (the bridge, metrics, the served names, limits, and the model's
info and tokenizer once the engine is ready), the 503 of a server not ready, and `model_info`."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from cupyglm.server.bridge import EngineBridge
from cupyglm.server.errors import ApiError
from cupyglm.server.guards import BODY_TIMEOUT_S
from cupyglm.server.metrics import Metrics
from cupyglm.server.prompt import PromptBuilder, WorkPool
from cupyglm.server.requests import ModelInfo
from cupyglm.server.responses import now

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass
class ServerState:
    """Everything the routes need. `info`, `tokenizer` and `make_params` are set once the engine is ready."""

    bridge: EngineBridge
    metrics: Metrics
    served_id: str
    root: str
    api_keys: tuple[bytes, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    info: ModelInfo | None = None
    tokenizer: Any = None
    make_params: Callable[..., Any] | None = None
    allow_control_tokens: bool = False
    body_timeout_s: float = BODY_TIMEOUT_S
    vision: Any = None                    # images.ImagePrep while images are served (set with info)
    created: int = dataclasses.field(default_factory=now)
    pool: WorkPool = dataclasses.field(default_factory=WorkPool)
    _prompts: PromptBuilder | None = None

    def prompts(self) -> PromptBuilder:
        """The prompt builder of the loaded tokenizer (built on first use, once `info` and `tokenizer` are set)."""
        if self._prompts is None or self._prompts.tok is not self.tokenizer:
            assert self.info is not None
            self._prompts = PromptBuilder(self.tokenizer, self.info.max_model_len,
                                          allow_control_tokens=self.allow_control_tokens)
        return self._prompts

    @property
    def ready(self) -> bool:
        return self.bridge.ready and self.bridge.dead is None and not self.bridge.closing and self.info is not None


def not_ready(state: ServerState) -> ApiError:
    """The 503 of a server that cannot take a request now, saying why (engine stopped, shutting down, loading)."""
    b = state.bridge
    if b.dead is not None:
        why = f"the engine stopped ({b.dead})"
    elif b.closing:
        why = "the server is shutting down"
    else:
        why = "the model is loading"
    return ApiError(503, f"not ready: {why}", code="service_unavailable", headers={"Retry-After": "1"})


def model_info(served_id: str, root: str, max_model_len: int, vocab_size: int, prompt_cache: bool = False,
               mtp_drafts: int = 0, vision_max_images: int = 0) -> ModelInfo:
    aliases = {root, os.path.basename(root.rstrip("/"))} - {""}
    return ModelInfo(served_id=served_id, aliases=frozenset(aliases), max_model_len=max_model_len,
                     vocab_size=vocab_size, prompt_cache=prompt_cache, mtp_drafts=mtp_drafts,
                     vision_max_images=vision_max_images)
