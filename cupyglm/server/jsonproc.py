"""Big request bodies parsed as JSON in a child process, so the one long C call of json.loads holds no GIL of
rank 0 (neither the event loop nor the engine thread waits for it).

`JsonProcess.parse(raw)` (from a worker thread; one body at a time) sends `len u64 | raw` on the child's stdin and
reads back `len u64 | pickle((True, value) | (False, ApiError))`. The child (`python -m cupyglm.server.jsonproc`)
exits when its stdin closes, so it never outlives rank 0; it uses pipes only (nothing in /dev/shm).
"""
from __future__ import annotations

import pickle
import struct
import subprocess
import sys
import threading

from cupyglm.server.errors import ApiError

_LEN = struct.Struct("<Q")


def _read(stream, n: int) -> bytes:
    parts, left = [], n
    while left:
        part = stream.read(left)
        if not part:
            raise EOFError("the JSON process closed its pipe")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


class JsonProcess:
    """The child, started on first use and again if it died."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _child(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-m", "cupyglm.server.jsonproc"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, bufsize=0)
        return self._proc

    def parse(self, raw: bytes) -> dict:
        with self._lock:
            proc = self._child()
            try:
                proc.stdin.write(_LEN.pack(len(raw)))
                proc.stdin.write(raw)
                ok, value = pickle.loads(_read(proc.stdout, _LEN.unpack(_read(proc.stdout, _LEN.size))[0]))
            except (OSError, EOFError, pickle.UnpicklingError):
                proc.kill()
                self._proc = None
                raise ApiError(503, "the request body could not be parsed (the JSON process failed); retry",
                               code="service_unavailable", headers={"Retry-After": "1"}) from None
        if not ok:
            raise value
        return value

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._proc.stdin.close()
                try:
                    self._proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                self._proc = None


def _serve() -> None:
    from cupyglm.server.fields import parse_json_object

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            n = _LEN.unpack(_read(stdin, _LEN.size))[0]
            raw = _read(stdin, n)
        except EOFError:
            return
        try:
            reply = (True, parse_json_object(raw))
        except ApiError as e:
            reply = (False, e)
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.write(_LEN.pack(len(data)) + data)
        stdout.flush()


if __name__ == "__main__":
    _serve()
