"""A row's role (DESIGN §3b): a decode or verify row (its token was sampled or drafted: one row of a running
sequence, or a call's up to 16 MTP verify rows) or a prompt row (a chunk of a prompt being prefilled).

A forward call puts its decode/verify rows first (model/batch.py orders the segments), so every GEMM of the
call is told one number, `decode`: its leading rows [0, decode) are decode/verify rows, the rest prompt rows.
The kernel backends choose each row's path by that role (the weight-streaming gemv for decode/verify rows, the
tiled tensor-core gemm for prompt rows), never by how many rows share the call. Both paths sum in the tensor
core's order (tc_order.py, tc_quant.py), so a row's bits depend neither on its role nor on its batch: a prompt
row equals the same row decoded, and the numpy reference needs the role only to check it.
"""
from __future__ import annotations

import numbers


def decode_rows(op: str, decode, m: int) -> int:
    """The number of leading decode/verify rows of an op's call of m rows, checked: an int in [0, m]."""
    if isinstance(decode, bool) or not isinstance(decode, numbers.Integral):
        raise ValueError(f"{op}: decode must be an int (the call's leading decode/verify rows), got {decode!r}")
    d = int(decode)
    if not 0 <= d <= m:
        raise ValueError(f"{op}: decode must be in [0, {m}] (the call's leading decode/verify rows), got {d}")
    return d
