"""MPICH's own shared memory: `/dev/shm/mpich_shm_<world id>_<node>`, which MPICH unlinks only in MPI_Finalize.

MPICH (ch4, POSIX shm) `shm_open`s that segment in MPI_Init under a fixed name, with no setting for its place,
and removes it in MPI_Finalize, so a job that is killed or aborts leaves it behind. Two remedies:

- `release(local_rank)`: once every rank of the host is past MPI_Init (the world handshake proves it), the
  host's first rank unlinks the segments this process maps. The mappings stay valid (MPICH's later unlink finds
  nothing to do), and from then on a kill or an abort of the job leaves nothing behind.
- `unlink_mapped()`: a rank about to abort the job (failure.abort) unlinks them too, since MPI_Finalize will not
  run; a rank that failed before the handshake (a usage error) would otherwise leave them.
- `stale(directory)`: segments that no live process maps (every readable /proc/*/maps is read), older than
  `min_age_s` (a job between its shm_open and its mmap is not yet in any map), are a dead job's; the next start
  and `cupyglm-cleanup-shm` remove them. A segment that any process might map is never judged stale.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from cupyglm.distributed.shm import Verdict

NAME = re.compile(r"^mpich_shm_[0-9a-f]+_\d+$")
_MAPPED = re.compile(r"\s(/dev/shm/mpich_shm_[0-9a-f]+_\d+)(?: \(deleted\))?$", re.M)
SHM_DIR = Path("/dev/shm")


def mapped_by(pid: int | str = "self") -> set[str] | None:
    """The /dev/shm mpich_shm_* paths process `pid` maps; None when its maps cannot be read."""
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return set(_MAPPED.findall(text))


def release(local_rank: int) -> list[str]:
    """The host's first rank, after every local rank is past MPI_Init: unlink the MPICH segments it maps."""
    return unlink_mapped() if local_rank == 0 else []


def unlink_mapped() -> list[str]:
    """Unlink the MPICH segments this process maps (a job about to abort: MPI_Finalize will never run)."""
    gone = []
    for path in sorted(mapped_by() or ()):
        try:
            os.unlink(path)
            gone.append(path)
        except FileNotFoundError:
            pass
        except OSError:
            pass                       # not ours to remove; MPI_Finalize will
    return gone


def _mapped_anywhere() -> set[str]:
    """Paths mapped by every process whose maps can be read. One whose maps cannot be read (another user's, a
    non-dumpable one, another namespace's init) is no rank of a job of this user: MPICH makes its segment 0600
    and its ranks are ordinary processes of the user who started it."""
    mapped: set[str] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            mapped |= mapped_by(entry.name) or set()
    return mapped


def stale(directory: Path = SHM_DIR, *, min_age_s: float = 60.0, now: float | None = None) -> list[Verdict]:
    """A verdict for every mpich_shm_* file in `directory` (see the module docstring)."""
    try:
        files = sorted(p for p in directory.iterdir() if NAME.match(p.name))
    except FileNotFoundError:
        return []
    if not files:
        return []
    now = time.time() if now is None else now
    mapped = _mapped_anywhere()
    out = []
    for p in files:
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        if str(SHM_DIR / p.name) in mapped:
            out.append(Verdict(p, False, "mapped by a live process", st.st_size))
        elif now - st.st_mtime < min_age_s:
            out.append(Verdict(p, False, f"younger than {min_age_s:g} s", st.st_size))
        else:
            out.append(Verdict(p, True, "MPICH segment no live process maps", st.st_size))
    return out


def remove_stale(directory: Path = SHM_DIR, *, min_age_s: float = 60.0) -> list[Verdict]:
    """Unlink this user's stale segments (`stale`); the ones removed."""
    gone = []
    for v in stale(directory, min_age_s=min_age_s):
        if v.stale:
            try:
                if v.path.stat().st_uid == os.geteuid():
                    os.unlink(v.path)
                    gone.append(v)
            except OSError:
                pass
    return gone
