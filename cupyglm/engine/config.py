"""EngineConfig: what the scheduler and engine need to know, frozen (built from Settings and the memory plan)."""
from __future__ import annotations

import dataclasses

DEFAULT_CHUNK_TOKENS = 512        # the default prefill chunk: the smallest keep-grid multiple at least this


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    context: int                          # window: tokens (prompt + generated) a sequence may hold
    num_pages: int                        # KV pages in the pool
    page_tokens: int                      # tokens per page
    keep_grid: int                        # chunk ends fall on multiples of this (prompt-cache keep points)
    parallel: int = 4                     # running streams
    max_queue: int = 256                  # requests that may wait for a stream (beyond free streams)
    prefill_chunk: int = 0                # prompt tokens per step, a multiple of keep_grid; 0 = the default
    seed: int = 0                         # seeds of requests without one: seed + request counter
    eos_token_ids: tuple[int, ...] = ()
    vocab_size: int = 0                   # 0 = do not check prompt ids
    poison: bool = False                  # KV pages start NaN-filled (tests)
    mtp_drafts: int = 0                   # MTP drafts a decode step may verify, 0..15 (cupyglm.engine.draft)
    draft_pricing: bool = True            # skip drafting where the acceptance rate says it loses (draft.Pricer)

    def __post_init__(self) -> None:
        for name in ("context", "num_pages", "page_tokens", "keep_grid", "parallel"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"EngineConfig.{name} must be a positive integer, got {v!r}")
        if not 0 <= self.mtp_drafts <= 15:
            raise ValueError(f"EngineConfig.mtp_drafts must be in 0..15 (a verify group is at most 16 rows), "
                             f"got {self.mtp_drafts}")
        if self.max_queue < 0:
            raise ValueError(f"EngineConfig.max_queue must be >= 0, got {self.max_queue}")
        if self.prefill_chunk < 0 or self.prefill_chunk % self.keep_grid:
            raise ValueError(f"prefill chunk must be 0 (the default) or a positive multiple of the keep grid "
                             f"({self.keep_grid} tokens), got {self.prefill_chunk}")
        object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))

    @property
    def chunk(self) -> int:
        """Prompt tokens one step may feed (all requests together): a multiple of the keep grid."""
        if self.prefill_chunk:
            return self.prefill_chunk
        return -(-DEFAULT_CHUNK_TOKENS // self.keep_grid) * self.keep_grid

    def pages_needed(self, positions: int) -> int:
        return -(-positions // self.page_tokens)
