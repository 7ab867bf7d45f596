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
    index_tail: dict = dataclasses.field(default_factory=dict)  # kv layer -> ([<4, I] ik, [<4, I] ig) bf16
    mtp_pending: np.ndarray | None = None                  # [D] final-normed row of position length - 1
