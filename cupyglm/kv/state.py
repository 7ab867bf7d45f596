"""Per-sequence fixed state: what a sequence carries besides its KV pages."""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class SeqState:
    length: int = 0                                        # positions whose KV and state are written
    pages: list[int] = dataclasses.field(default_factory=list)
    kda_state: dict = dataclasses.field(default_factory=dict)   # layer -> [H_rank, V, K] fp32
    kda_conv: dict = dataclasses.field(default_factory=dict)    # layer -> [taps - 1, 3 * H_rank * K] bf16
    # kv layer -> (ik, ig), each [kpool, I] bf16, written in place: row s holds the latest written position = s
    # mod kpool, so the leading (written positions) % kpool rows are the incomplete pool's members; views of the
    # KV store's tail slot `tail_slot` (kv/index_tails.py), replaced only by copies into them
    index_tail: dict = dataclasses.field(default_factory=dict)
    tail_slot: int | None = None                           # the KV store's index-tail slot (None: none yet)
    mtp_pending: np.ndarray | None = None                  # [D] final-normed row of position length - 1


def new_index_tail(xp, cfg, dtype) -> tuple:
    """An index tail outside any store (a test's state): (ik, ig), each [kpool, I] of `dtype` (bf16 storage),
    zeros; a store's `IndexTails.of` copies it into the sequence's slot."""
    return tuple(xp.zeros((cfg.index_kpool, cfg.index_head_dim), dtype=dtype) for _ in range(2))
