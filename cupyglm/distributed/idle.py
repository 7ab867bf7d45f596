"""Waiting for rank 0's next step message without burning a core: spin briefly, then nap.

A rank other than 0 spends an idle server's life waiting in the step broadcast. MPI's blocking Bcast
busy-polls (a full core per idle rank). `wait` polls a nonblocking request instead: it spins for `SPIN_S`
after the wait starts (under load the next message comes within that: latency of a poll, microseconds), then
sleeps between polls, the nap doubling from `NAP_MIN_S` to `NAP_MAX_S`, so an idle rank wakes about
1 / NAP_MAX_S times a second and a message that arrives while it naps waits at most NAP_MAX_S (plus the
scheduler's wake-up) before its step starts.
"""
from __future__ import annotations

import time

SPIN_S = 0.005           # busy-poll this long after a wait starts (covers rank 0's host work between steps)
NAP_MIN_S = 0.00005      # the first nap after the spin
NAP_MAX_S = 0.0005       # the longest nap: the worst-case extra latency of a step that starts a busy period


def wait(request, spin_s: float = SPIN_S, nap_min_s: float = NAP_MIN_S, nap_max_s: float = NAP_MAX_S) -> None:
    """Return once the mpi4py request `request` has completed (`request.Test()` true)."""
    if request.Test():
        return
    deadline = time.monotonic() + spin_s
    while time.monotonic() < deadline:
        if request.Test():
            return
    nap = nap_min_s
    while not request.Test():
        time.sleep(nap)
        nap = min(nap * 2.0, nap_max_s)
