"""The order in which the emulator runs the threads of a block (between barriers) and the blocks of a grid.

``"forward"``, ``"reverse"`` or ``"shuffled"`` (seeded): process-wide via :func:`set_thread_order` (initial value
from ``CUPYGLM_SIM_ORDER`` / ``CUPYGLM_SIM_SEED``, default forward) or per launch.  A kernel whose output depends on
the order has a race.
"""

from __future__ import annotations

import threading

from cupyglm import env

ORDERS = {"forward": 0, "reverse": 1, "shuffled": 2}
_order_lock = threading.Lock()
_order: tuple[str, int] = (env.get_or("CUPYGLM_SIM_ORDER"), int(env.get_or("CUPYGLM_SIM_SEED")))
if _order[0] not in ORDERS:
    raise ValueError(f"CUPYGLM_SIM_ORDER must be one of {sorted(ORDERS)}, got {_order[0]!r}")


def set_thread_order(order: str, seed: int = 0) -> None:
    """Process-wide default order of threads (and blocks): forward, reverse or shuffled(seed)."""
    global _order
    _check(order)
    with _order_lock:
        _order = (order, int(seed))


def get_thread_order() -> tuple[str, int]:
    return _order


def launch_order(order: str | None, seed: int | None) -> tuple[int, int]:
    """The worker's (order code, 64-bit seed) for one launch; None falls back to the process-wide default."""
    default_order, default_seed = _order
    order = default_order if order is None else order
    _check(order)
    seed = default_seed if seed is None else int(seed)
    return ORDERS[order], seed & 0xFFFFFFFFFFFFFFFF


def _check(order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {sorted(ORDERS)}, got {order!r}")
