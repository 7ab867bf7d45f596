"""The one sampler: every drawn token comes from `ops.sample` on fp32 logits rows with per-row columns
(temperature, top_k, top_p, min_p, seed, position), here, whether the step samples eagerly (`eager`: the columns in
one upload) or the runner's captured exit draws them (`packed`: the columns read from rows of the call's feed, which
engine/graph_ends.py uploads with the token ids and captures with the exit).

What stays true: a row's draw is keyed by its (seed, position) and reads that row alone, so the same rows and
columns give the same tokens in either form, and padding rows (greedy columns of zeros) change no real row's draw.
"""
from __future__ import annotations

import dataclasses

import numpy as np

# ops.sample's columns per row: (temperature, top_k, top_p, min_p, seed, position)
SAMPLE_DTYPES = (np.float32, np.int32, np.float32, np.float32, np.uint64, np.int32)
# the packed form: int32 rows, the u64 seeds over the first two (8-byte aligned), then one row a column
COLUMN_ROWS = 7
_SEED, _TEMPERATURE, _TOP_K, _TOP_P, _MIN_P, _POSITION = 0, 2, 3, 4, 5, 6


@dataclasses.dataclass
class SampleRows:
    """Rank 0's sampling columns for a decode call, one (temperature, top_k, top_p, min_p, seed, position) per
    logits row in the call's row order; `tokens` [P] int32 (device, a view the bucket's next replay rewrites) is
    set by the runner when its captured exit drew them, else left None (the caller samples eagerly)."""
    params: list[tuple]
    tokens: object = None


def sample_columns(params: list[tuple]) -> list[np.ndarray]:
    """Per row (temperature, top_k, top_p, min_p, seed, position) -> ops.sample's six host columns, in its dtypes."""
    return [np.array(col, dtype=dt) for col, dt in zip(zip(*params), SAMPLE_DTYPES)]


def upload_params(xp, params: list[tuple]) -> tuple:
    """Per row (temperature, top_k, top_p, min_p, seed, position) -> ops.sample's six [R] columns, uploaded in
    one host-to-device transfer: one byte buffer, the 8-byte seeds first (aligned), each column a view of it."""
    cols = sample_columns(params)
    order = (4, 0, 1, 2, 3, 5)
    dev = xp.asarray(np.concatenate([cols[i].view(np.uint8) for i in order]))
    views, at = [None] * len(cols), 0
    for i in order:
        n = cols[i].nbytes
        views[i] = dev[at:at + n].view(SAMPLE_DTYPES[i])
        at += n
    return tuple(views)


def eager(ops, logits, params: list[tuple]):
    """One token per logits row [R, V] f32 (device [R] int32), the rows' columns uploaded in one transfer."""
    return ops.sample(logits, *upload_params(ops.xp, params))


def pack(host: np.ndarray, params: list[tuple]) -> None:
    """The rows' columns into host [COLUMN_ROWS, B] int32 (B >= rows; the rest left as they are), each a bit
    pattern in the int32 rows."""
    temperature, top_k, top_p, min_p, seed, position = sample_columns(params)
    p = len(params)
    host[_SEED:_SEED + 2].reshape(-1).view(np.uint64)[:p] = seed
    for row, col in ((_TEMPERATURE, temperature), (_TOP_K, top_k), (_TOP_P, top_p), (_MIN_P, min_p),
                     (_POSITION, position)):
        host[row, :p] = col.view(np.int32)


def packed(ops, logits, rows):
    """One token per logits row [B, V] f32 with the columns read from rows [COLUMN_ROWS, B] int32 (device, `pack`'s
    layout): every row drawn, device reads only, so it can be captured."""
    seed = rows[_SEED:_SEED + 2].reshape(-1).view(np.uint64)                     # [B] u64
    f32 = lambda row: rows[row].view(np.float32)                                  # noqa: E731
    return ops.sample(logits, f32(_TEMPERATURE), rows[_TOP_K], f32(_TOP_P), f32(_MIN_P), seed, rows[_POSITION])
