"""The guarded worker process of a `sim` module, seen from the parent: start it on one emulator library, share
the arena (a memfd) with it, exchange length-prefixed pickles over pipes, and report how it died.

The child side is ``sim_worker.py``, run with ``python -I -S`` so it never imports cupyglm.
"""

from __future__ import annotations

import atexit
import mmap
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from .sim_arena import PAGE, round_up
from .sim_build import SimError
from .sim_errors import SimCrash
from .sim_worker import _send as send_message

_WORKER_SCRIPT = str(Path(__file__).with_name("sim_worker.py"))
_live_workers: "weakref.WeakSet[Worker]" = weakref.WeakSet()


class Worker:
    """One guarded worker process serving one emulator library."""

    def __init__(self, so_path: Path):
        self.so_path = so_path
        self.arena_fd = os.memfd_create("cupyglm-sim-arena", os.MFD_CLOEXEC)
        self.arena_size = 0
        self.arena: mmap.mmap | None = None
        self.arena_np: np.ndarray | None = None
        self._grow(1 << 20)
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _WORKER_SCRIPT, str(so_path), str(self.arena_fd), str(req_r), str(resp_w)],
            pass_fds=(self.arena_fd, req_r, resp_w),
            stdin=subprocess.DEVNULL,
        )
        os.close(req_r)
        os.close(resp_w)
        self.pid = os.getpid()
        _live_workers.add(self)
        hello = self.recv(timeout=120.0)
        if hello is None:
            raise SimCrash(f"emulator worker for {so_path} died while loading the library ({self._death()})")
        if not hello.get("ok"):
            self.close()
            raise SimError(f"emulator worker could not load {so_path}: {hello.get('error')}")
        self.signatures: dict[str, list[str]] = hello["kernels"]

    def _grow(self, need: int) -> None:
        if need <= self.arena_size:
            return
        size = max(need, 2 * self.arena_size, 1 << 20)
        size = round_up(size, PAGE)
        os.ftruncate(self.arena_fd, size)
        self.arena_np = None
        if self.arena is not None:
            self.arena.close()
        self.arena = mmap.mmap(self.arena_fd, size)
        self.arena_np = np.frombuffer(self.arena, dtype=np.uint8)
        self.arena_size = size

    def alive(self) -> bool:
        return self.proc.poll() is None and self.pid == os.getpid()

    def recv(self, timeout: float | None) -> Any:
        """Next message, or None if the worker died.  Raises TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        buf = bytearray()
        need = 8
        length = None
        while True:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                r, _, _ = select.select([self.resp_r], [], [], left)
                if not r:
                    raise TimeoutError
            chunk = os.read(self.resp_r, need - len(buf))
            if not chunk:
                return None
            buf += chunk
            if len(buf) == need:
                if length is None:
                    (length,) = struct.unpack("<Q", buf)
                    buf = bytearray()
                    need = length
                    if need == 0:
                        return pickle.loads(b"")
                else:
                    return pickle.loads(bytes(buf))

    def _death(self) -> str:
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        if rc < 0:
            try:
                return signal.Signals(-rc).name
            except ValueError:
                return f"signal {-rc}"
        return f"exit status {rc}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close()

    def close(self) -> None:
        if self.pid != os.getpid():
            return
        if getattr(self, "req_w", -1) >= 0:
            try:
                if self.proc.poll() is None:
                    send_message(self.req_w, {"op": "exit"})
            except OSError:
                pass
            for fd in (self.req_w, self.resp_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.req_w = self.resp_r = -1
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.arena_np = None
        if self.arena is not None:
            try:
                self.arena.close()
            except BufferError:
                pass
            self.arena = None
        if self.arena_fd >= 0:
            os.close(self.arena_fd)
            self.arena_fd = -1


@atexit.register
def _close_all_workers() -> None:
    for w in list(_live_workers):
        try:
            w.close()
        except Exception:  # noqa: BLE001
            pass
