"""A row's role (DESIGN §3b): a decode or verify row (its token was sampled or drafted: one row of a running
sequence, or a call's up to 16 MTP verify rows) or a prompt row (a chunk of a prompt being prefilled).

A forward call puts its decode/verify rows first (model/batch.py orders the segments), so every GEMM of the
call is told one number, `decode`: its leading rows [0, decode) are decode/verify rows, the rest prompt rows.
The kernel backends choose each row's path by that role (the weight-streaming gemv for decode/verify rows, the
tiled gemm for prompt rows), never by how many rows share the call. The role fixes the order: a decode row's
bf16 GEMV sums in the tensor core's decode order (tc_order.py), a prompt row (and a quantised weight) in lane-16
order, and the numpy reference follows the same split, so a row's bits depend on its role, never on its batch.
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
