"""Shared host-memory segments: header, map-and-count lifecycle, failed creation, stale cleanup."""
from __future__ import annotations

import multiprocessing as mp
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cupyglm.cli import cleanup_shm
from cupyglm.distributed import shm
from cupyglm.distributed.shm import HEADER_SIZE, SharedSegment, ShmError, new_token, open_local, read_header


@pytest.fixture
def shm_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGLM_SHM_DIR", str(tmp_path))
    return tmp_path


def test_names():
    t = new_token()
    assert shm.segment_name(t, "kv_pages") == f"cupyglm-{t}-kv_pages"
    assert new_token() != t
    for bad in ("", "A", "a-b", "x" * 33, "a/b"):
        with pytest.raises(ShmError):
            shm.segment_name(t, bad)
    with pytest.raises(ShmError):
        shm.segment_name("../x", "p")


def test_lifecycle_one_rank_in_dev_shm():
    # The real /dev/shm: the name is gone as soon as the only rank has mapped it.
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    t = new_token()
    seg = open_local(t, "unit", 1 << 16, local_rank=0, local_size=1, fingerprint_hash="ab" * 32)
    assert seg.unlinked_here and not os.path.exists(f"/dev/shm/cupyglm-{t}-unit")
    a = seg.array(np.float32, (128, 128))
    a[:] = 3.0
    assert seg.nbytes == 1 << 16 and float(a.sum()) == 3.0 * 128 * 128
    assert seg.mapped() == 1
    del a
    seg.close()


def test_header_fields(shm_tmp):
    t = new_token()
    seg = SharedSegment.create(t, "hdr", 100, local_size=3, fingerprint_hash="f" * 64)
    h = read_header(seg.path)
    assert (h.magic, h.version, h.header_size, h.creator_pid, h.payload_bytes, h.local_size, h.mapped) == \
        (shm.MAGIC, shm.VERSION, HEADER_SIZE, os.getpid(), 100, 3, 0)
    assert h.purpose == "hdr" and h.fingerprint_hash == "f" * 64 and h.host
    assert h.creator_start == shm.process_start(os.getpid()) and h.created_ns <= time.time_ns()
    assert seg.path.stat().st_size == HEADER_SIZE + 100
    seg.close()


def test_count_unlinks_on_the_last_mapping(shm_tmp):
    t = new_token()
    first = SharedSegment.create(t, "two", 64, local_size=2)
    second = SharedSegment.attach(t, "two")
    first.payload[:3] = b"abc"
    assert bytes(second.payload[:3]) == b"abc"
    assert first.count_mapping() is False
    assert (shm_tmp / first.name).exists()
    assert second.count_mapping() is True
    assert not (shm_tmp / first.name).exists()
    second.payload[3:5] = b"de"
    assert bytes(first.payload[:5]) == b"abcde", "mappings stay valid after the unlink"
    assert first.mapped() == 2
    first.close()
    second.close()


def test_attach_checks_fingerprint_and_header(shm_tmp):
    t = new_token()
    seg = SharedSegment.create(t, "fp", 16, local_size=2, fingerprint_hash="a" * 64)
    with pytest.raises(ShmError, match="made for fingerprint aaaaaaaaaaaa"):
        SharedSegment.attach(t, "fp", fingerprint_hash="b" * 64)
    seg.remove_name()
    seg.close()
    (shm_tmp / f"cupyglm-{t}-junk").write_bytes(b"\0" * (HEADER_SIZE + 8))
    with pytest.raises(ShmError, match="not a version 1 cupyglm segment"):
        SharedSegment.attach(t, "junk")
    with pytest.raises(FileNotFoundError):
        SharedSegment.attach(t, "absent")


def test_failed_creation_leaves_nothing(shm_tmp, monkeypatch):
    t = new_token()

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shm.os, "ftruncate", boom)
    with pytest.raises(OSError, match="No space"):
        SharedSegment.create(t, "fail", 1 << 20, local_size=1)
    assert list(shm_tmp.iterdir()) == []
    with pytest.raises(ShmError, match="local rank 0 could not create"):
        open_local(t, "fail", 10, local_rank=0, local_size=1)
    assert list(shm_tmp.iterdir()) == []


def test_existing_name_is_not_reused(shm_tmp):
    t = new_token()
    seg = SharedSegment.create(t, "dup", 8, local_size=2)
    with pytest.raises(FileExistsError):
        SharedSegment.create(t, "dup", 8, local_size=2)
    seg.remove_name()
    seg.close()


def _child(token: str, directory: str, q) -> None:
    os.environ["CUPYGLM_SHM_DIR"] = directory
    deadline = time.monotonic() + 10
    while True:
        try:
            seg = SharedSegment.attach(token, "mp")
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    seg.array(np.int64, (2,))[1] = 42
    q.put(seg.count_mapping())
    seg.close()


def test_two_processes(shm_tmp):
    t = new_token()
    seg = SharedSegment.create(t, "mp", 16, local_size=2)
    seg.count_mapping()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(t, str(shm_tmp), q))
    p.start()
    assert q.get(timeout=30) is True, "the child's mapping completed the count"
    p.join(timeout=30)
    assert p.exitcode == 0
    assert int(seg.array(np.int64, (2,))[1]) == 42
    assert list(shm_tmp.iterdir()) == []
    seg.close()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _stale(directory: Path, token: str, purpose: str) -> Path:
    seg = SharedSegment.create(token, purpose, 32, local_size=2)
    with open(seg.path, "r+b") as fh:  # pretend a process that is gone made it
        fh.seek(16)
        fh.write(struct.pack("<QQ", _dead_pid(), 0))
    seg.close()
    return seg.path


def test_judge_and_cleanup(shm_tmp, capsys):
    t = new_token()
    stale = _stale(shm_tmp, t, "stale")
    live = SharedSegment.create(t, "live", 32, local_size=2)
    half = shm_tmp / f"cupyglm-{t}-half"
    half.write_bytes(b"\0" * 10)
    old_half = shm_tmp / f"cupyglm-{t}-oldhalf"
    old_half.write_bytes(b"")
    os.utime(old_half, (time.time() - 3600, time.time() - 3600))
    other = shm_tmp / "mpich_shm_1234"
    other.write_bytes(b"x")

    verdicts = {v.path.name: v for v in shm.stale_segments(shm_tmp)}
    assert set(verdicts) == {stale.name, live.path.name, half.name, old_half.name}
    assert verdicts[stale.name].stale and "gone" in verdicts[stale.name].reason
    assert not verdicts[live.path.name].stale and "alive" in verdicts[live.path.name].reason
    assert not verdicts[half.name].stale
    assert verdicts[old_half.name].stale

    assert cleanup_shm.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would remove {stale}" in out and f"would remove {old_half}" in out
    assert stale.exists() and old_half.exists()

    assert cleanup_shm.main([]) == 0
    out = capsys.readouterr().out
    assert f"removed {stale} (creator pid" in out and f"removed {old_half}" in out
    assert not stale.exists() and not old_half.exists()
    assert live.path.exists() and half.exists() and other.exists()
    assert "removed 2 stale segment(s), kept 2" in out
    live.remove_name()
    live.close()


def test_process_alive():
    assert shm.process_alive(os.getpid(), shm.process_start(os.getpid()))
    assert not shm.process_alive(os.getpid(), shm.process_start(os.getpid()) + 1), "pid reused by another process"
    assert not shm.process_alive(_dead_pid())
    assert not shm.process_alive(0)


def test_cleanup_script(shm_tmp):
    t = new_token()
    stale = _stale(shm_tmp, t, "script")
    script = Path(__file__).resolve().parents[2] / "launch" / "cleanup-shm"
    env = dict(os.environ, CUPYGLM_SHM_DIR=str(shm_tmp))
    out = subprocess.run([str(script), "--dry-run"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"would remove {stale}" in out.stdout, out.stderr
    out = subprocess.run([str(script), "--dir", str(shm_tmp), "-q"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip().startswith(f"removed {stale}"), out.stderr
    assert not stale.exists()


def test_mpich_segments_stale_only_when_no_live_process_maps_them(shm_tmp):
    import mmap
    import secrets

    from cupyglm.distributed import mpich_shm

    old = time.time() - 3600
    dead = shm_tmp / f"mpich_shm_{secrets.token_hex(4)}_0"
    young = shm_tmp / f"mpich_shm_{secrets.token_hex(4)}_0"
    for p in (dead, young):
        p.write_bytes(b"\0" * 4096)
    os.utime(dead, (old, old))
    (shm_tmp / "mpich_shm_notours").write_bytes(b"x")
    verdicts = {v.path.name: v for v in mpich_shm.stale(shm_tmp)}
    assert set(verdicts) == {dead.name, young.name}
    assert verdicts[dead.name].stale and not verdicts[young.name].stale
    assert [v.path for v in mpich_shm.remove_stale(shm_tmp)] == [dead]
    assert not dead.exists() and young.exists()

    # a segment in /dev/shm that a live process maps is never stale, however old
    live = Path("/dev/shm") / f"mpich_shm_{secrets.token_hex(4)}_7"
    live.write_bytes(b"\0" * 4096)
    try:
        os.utime(live, (old, old))
        with open(live, "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
            assert str(live) in mpich_shm.mapped_by()
            v = next(v for v in mpich_shm.stale(Path("/dev/shm")) if v.path == live)
            assert not v.stale and "mapped" in v.reason
            m[0] = 1
        os.utime(live, (old, old))
        v = next(v for v in mpich_shm.stale(Path("/dev/shm")) if v.path == live)
        assert v.stale
    finally:
        live.unlink(missing_ok=True)


def test_open_local_unlinks_at_once_and_sweeps_dead_creators(shm_tmp):
    # A dead creator's segment goes when the host makes its next one; the new one has no name once made, and a
    # second process maps it through the creator's held descriptor.
    t = new_token()
    stale = _stale(shm_tmp, t, "old")
    seg = open_local(t, "new", 64, local_rank=0, local_size=1)
    assert not stale.exists() and list(shm_tmp.iterdir()) == [] and seg.unlinked_here and seg.mapped() == 1
    seg.close()
    first = SharedSegment.create(t, "held", 16, local_size=2)
    via = first.hold()
    first.remove_name()
    first.count_mapping()
    second = SharedSegment.attach(t, "held", via=via)
    second.count_mapping()
    second.array(np.int64, (2,))[0] = 7
    assert list(shm_tmp.iterdir()) == [] and first.mapped() == 2 and int(first.array(np.int64, (2,))[0]) == 7
    second.close()
    first.close()
