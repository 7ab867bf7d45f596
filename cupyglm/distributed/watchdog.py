"""Liveness of a served job: heartbeats from every rank to rank 0, a deadline on every step, a confirmed stop.

A `Link` is a duplicate of COMM_WORLD (made collectively by every rank, so its traffic never meets the
lockstep collectives). Every rank other than 0 runs a `Beater` thread that sends rank 0 `(BEAT, last step
done)` every HEARTBEAT_S, while loading, idle or busy; after its worker loop ends it stops beating and sends
`(BYE, step)` once. Rank 0 runs a `Watchdog` thread that

- fires when a rank has not been heard for `step_timeout_s` (a frozen or dead rank, idle or not), naming it;
- fires when a step runs past its deadline, naming the ranks that had not finished it (rank 0 itself when all
  others had). The deadline of a step of `rows` rows is `step_timeout_s * (1 + rows / ROWS_PER_TIMEOUT)`, floor
  `step_timeout_s`, times FIRST_STEP_FACTOR for the first step (kernels are compiled on first use);
- after the stop message, `confirm_stop()` waits STOP_CONFIRM_S for every rank's BYE.

Silence and step ages are measured on rank 0's awake clock: a gap longer than STALL_S between the watchdog's own
polls is time rank 0 itself did not run (SIGSTOP, a starved host), and it is taken out of every measurement, with
one line saying so. So rank 0's own pause is never blamed on another rank, and the job survives it: the other
ranks wait for rank 0's next step message without a deadline, and rank 0 resumes serving where it stopped.

When it fires: `on_fire(reason)` (the server fails every open request and turns /health 503 with the reason),
FIRE_GRACE_S for rank 0 to write those replies, one line `rank 0: watchdog: <reason>; aborting the job`, then
`MPI_Abort(1)`. So a frozen rank ends the job within step_timeout_s + HEARTBEAT_S + FIRE_GRACE_S (+ the
launcher's kill, about a second), a step stuck on every rank within its deadline + FIRE_GRACE_S.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HEARTBEAT_S = 0.5
POLL_S = 0.05
ROWS_PER_TIMEOUT = 256
FIRST_STEP_FACTOR = 10.0
STALL_S = 1.0         # a gap this long between the watchdog's polls: rank 0 itself was not running
FIRE_GRACE_S = 2.0
STOP_CONFIRM_S = 5.0
DEFAULT_STEP_TIMEOUT_S = 30.0
BEAT, BYE = 1, 2
_TAG = 77


def step_deadline(step_timeout_s: float, rows: int, first: bool) -> float:
    """Seconds a step of `rows` rows may take (see the module docstring)."""
    d = step_timeout_s * (1.0 + max(rows, 0) / ROWS_PER_TIMEOUT)
    return d * FIRST_STEP_FACTOR if first else d


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Link:
    """The heartbeat communicator; `open_link(world)` on every rank in the same order (it is collective)."""

    def __init__(self, mpi_comm: Any):
        self.comm = mpi_comm
        self.rank = mpi_comm.Get_rank() if mpi_comm is not None else 0
        self.size = mpi_comm.Get_size() if mpi_comm is not None else 1

    def abort(self, code: int = 1) -> None:
        if self.comm is not None:
            from cupyglm.distributed.failure import abort

            abort(self.comm, code)
        os._exit(code)


def open_link(world) -> Link:
    return Link(world.mpi.Dup() if world.mpi is not None and world.size > 1 else None)


class Beater:
    """A rank other than 0: sends rank 0 a heartbeat every HEARTBEAT_S; `bye()` stops it and confirms the stop."""

    def __init__(self, link: Link, step_of: Callable[[], int]):
        self.link = link
        self.step_of = step_of
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cupyglm-heartbeat", daemon=True)
        self._thread.start()

    def _send(self, kind: int) -> None:
        self.link.comm.Send(np.array([kind, self.step_of()], dtype=np.int64), dest=0, tag=_TAG)

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self._send(BEAT)

    def bye(self) -> None:
        self._stop.set()
        self._thread.join()
        self._send(BYE)


class Watchdog:
    """Rank 0: watches heartbeats and step deadlines; fires at most once (see the module docstring)."""

    def __init__(self, link: Link, step_timeout_s: float, on_fire: Callable[[str], None],
                 abort: Callable[[int], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 start: bool = True):
        self.link = link
        self.step_timeout_s = step_timeout_s
        self.on_fire = on_fire
        self.abort = abort or link.abort
        self.clock = clock
        self.lost = 0.0                 # seconds rank 0 itself did not run (taken out of every measurement)
        self._last_tick = clock()
        now = clock()
        self.heard = {r: now for r in range(1, link.size)}
        self.done_step = {r: -1 for r in range(1, link.size)}
        self.byes: set[int] = set()
        self.fired: str | None = None
        self._step: tuple[int, float, float] | None = None      # (step, started, deadline s)
        self._first = True
        self._lock = threading.Lock()
        self._bufs = {r: np.zeros(2, dtype=np.int64) for r in self.heard}
        self._reqs = {r: link.comm.Irecv(self._bufs[r], source=r, tag=_TAG) for r in self.heard} \
            if link.comm is not None else {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cupyglm-watchdog", daemon=True)
        if start:
            self._thread.start()

    def awake(self) -> float:
        """Rank 0's awake clock: the clock less the time rank 0 itself did not run."""
        return self.clock() - self.lost

    # ---- called by the engine thread ----------------------------------------------------------------------------
    def step_started(self, step: int, rows: int) -> None:
        with self._lock:
            self._step = (step, self.awake(), step_deadline(self.step_timeout_s, rows, self._first))
            self._first = False

    def step_done(self) -> None:
        with self._lock:
            self._step = None

    # ---- the watchdog thread ------------------------------------------------------------------------------------
    def _poll(self) -> None:
        for r, req in list(self._reqs.items()):
            while req is not None and req.Test():
                kind, step = (int(x) for x in self._bufs[r])
                self.heard[r] = self.awake()
                self.done_step[r] = step
                if kind == BYE:
                    self.byes.add(r)
                    req = None
                else:
                    req = self.link.comm.Irecv(self._bufs[r], source=r, tag=_TAG)
            if req is None:
                self._reqs.pop(r)
            else:
                self._reqs[r] = req

    def tick(self) -> float:
        """Called every poll: a gap since the previous tick longer than STALL_S is time rank 0 itself did not run;
        it joins `lost`. Returns the seconds taken out (0.0 for an ordinary poll)."""
        now = self.clock()
        gap, self._last_tick = now - self._last_tick, now
        if gap <= STALL_S:
            return 0.0
        with self._lock:
            self.lost += gap - POLL_S
        return gap - POLL_S

    def check(self) -> str | None:
        """The reason to fire now, or None."""
        now = self.awake()
        for r, t in self.heard.items():
            if r not in self.byes and now - t > self.step_timeout_s:
                return (f"rank {r} has not answered its heartbeat for {now - t:.1f} s (--step-timeout "
                        f"{self.step_timeout_s:g}; its last finished step {self.done_step[r]})")
        with self._lock:
            cur = self._step
        if cur is not None and now - cur[1] > cur[2]:
            step, _, deadline = cur
            behind = [r for r, s in self.done_step.items() if s < step] or [0]
            who = ", ".join(f"rank {r}" for r in behind)
            return f"step {step} ran past its deadline of {deadline:.1f} s; not finished on {who}"
        return None

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            paused = self.tick()
            if paused:
                _say(f"rank 0: watchdog: rank 0 itself did not run for {paused:.1f} s (stopped or starved); "
                     "that time is not counted against the other ranks")
            self._poll()
            reason = self.check()
            if reason is not None:
                self.fire(reason)
                return

    def fire(self, reason: str) -> None:
        self.fired = reason
        try:
            self.on_fire(reason)
        finally:
            time.sleep(FIRE_GRACE_S)
            _say(f"rank 0: watchdog: {reason}; aborting the job")
            self.abort(1)

    def silent_ranks(self, for_s: float) -> list[int]:
        """Ranks not heard for more than `for_s` seconds (that have not confirmed the stop)."""
        now = self.awake()
        return [r for r, t in self.heard.items() if r not in self.byes and now - t > for_s]

    # ---- the stop -------------------------------------------------------------------------------------------------
    def confirm_stop(self, timeout_s: float = STOP_CONFIRM_S) -> list[int]:
        """After the stop message: wait for every rank's BYE; returns the ranks that did not confirm in time."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        deadline = self.clock() + timeout_s
        while self._reqs and self.clock() < deadline:
            self._poll()
            time.sleep(POLL_S / 5)
        missing = sorted(self._reqs)
        return missing
