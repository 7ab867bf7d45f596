"""Kept prompt states on disk at TP=2 (real `mpirun -n 2` numpy servers, greedy, return_token_ids): a 4-turn
conversation survives a SIGTERM and a restart on the same directory and equals a cold server without it; files
of other settings (TP=1 vs TP=2, another page size), a flipped body byte, a truncated file and a newer header
version are refused by name and served fresh; SIGKILL while a state is being written leaves nothing that is ever
restored and the torn temp file is cleaned at the next start. The tests of this module run in order."""
from __future__ import annotations

import re
import signal
import struct
import threading
import time

import httpx
import pytest

from cupyglm.kv import disk_file as df

pytestmark = pytest.mark.mpi

KEY = "disk-admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BASE = ["--context", "512", "--parallel", "4", "--prefill-chunk", "64"]


def _warm(d) -> list[str]:
    return BASE + ["--prompt-cache-gib", "0.05", "--prompt-cache-dir", str(d), "--api-key", KEY]


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("prompt-cache-disk")


@pytest.fixture(scope="module")
def cold(start_server):
    s = start_server(BASE + ["--prompt-cache-gib", "0", "--api-key", KEY])
    with httpx.Client(base_url=s.base, timeout=120, headers=AUTH) as c:
        yield c
    s.kill()


def _chat(c, messages) -> tuple[list[int], int, str, str | None]:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    p = r.json()
    u = p["usage"]
    return (p["choices"][0]["token_ids"], u["prompt_tokens_details"]["cached_tokens"],
            p["choices"][0]["message"]["content"], u.get("cache_miss_reason"))


def _complete(c, prompt) -> tuple[list[int], int, str | None]:
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    p = r.json()
    return (p["choices"][0]["token_ids"], p["usage"]["prompt_tokens_details"]["cached_tokens"],
            p["usage"].get("cache_miss_reason"))


def _metric(c, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", c.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def _stop(s) -> None:
    s.proc.send_signal(signal.SIGTERM)
    rc, _ = s.wait(60)
    assert rc == 0, s.output


def _convs(n: int, seed: int) -> list[list[int]]:
    import numpy as np

    return [[int(t) for t in np.random.default_rng(seed + i).integers(3, 480, size=90)] for i in range(n)]


ASKS = ["Name a colour.", "And a fruit?", "And a tree?", "And a river?"]
@pytest.fixture(scope="module")
def restarted(start_server, cold, disk_dir):
    """Turns 1-2, a stop, a restart on the same directory, turns 3-4, each equal to the cold server; -> (the three
    extra conversations saved for the refusal tests, (turn, cached_tokens) per turn, disk hits, bytes read). A
    fixture, not test state, so the refusal tests find the files on whichever worker runs them."""
    s = start_server(_warm(disk_dir))
    messages = [{"role": "system", "content": "Answer briefly."}]
    seen = []
    with httpx.Client(base_url=s.base, timeout=120, headers=AUTH) as c:
        for turn in range(2):
            messages.append({"role": "user", "content": ASKS[turn]})
            got = _chat(c, messages)
            assert got[0] == _chat(cold, messages)[0], turn
            seen.append((turn + 1, got[1]))
            messages.append({"role": "assistant", "content": got[2]})
        # three more conversations for the refusal test, saved explicitly (behind the key)
        extra = _convs(3, 40)
        for p in extra:
            _complete(c, p)
        assert httpx.post(s.base + "/v1/cache/save").status_code == 401
        r = c.post("/v1/cache/save")
        assert r.status_code == 200 and r.json()["disk_ok"] is True, r.text
    _stop(s)                                               # the stop saves what is left in memory
    files = sorted(p.name for p in disk_dir.iterdir())
    assert files and all(f.endswith(df.SUFFIX) for f in files), files
    assert sum(f.endswith("-r0.cgkv") for f in files) == sum(f.endswith("-r1.cgkv") for f in files) >= 4

    s2 = start_server(_warm(disk_dir))
    m = re.search(r"prompt cache on disk: .*, (\d+) state\(s\) usable by every rank", s2.output)
    assert m and int(m.group(1)) == len(files) // 2, s2.output
    with httpx.Client(base_url=s2.base, timeout=120, headers=AUTH) as c:
        for turn in range(2, 4):
            messages.append({"role": "user", "content": ASKS[turn]})
            got = _chat(c, messages)
            assert got[0] == _chat(cold, messages)[0], turn
            seen.append((turn + 1, got[1]))
            messages.append({"role": "assistant", "content": got[2]})
        hits = _metric(c, "cupyglm:prefix_cache_disk_hits_total")
        read = _metric(c, "cupyglm:prefix_cache_disk_read_bytes_total")
    _stop(s2)
    return extra, seen, hits, read


def test_four_turns_survive_a_restart(restarted):
    _, seen, hits, read = restarted
    print("four turns across a restart (turn, cached_tokens):", seen, f"disk hits {hits:.0f}, read {read:.0f} B")
    assert seen[0][1] == 0 and seen[2][1] > seen[1][1] > 0 and seen[3][1] > seen[2][1]
    assert hits >= 1 and read > 0


def test_tp1_refuses_tp2_states_and_page_size_refuses_both(start_server, disk_dir, restarted):
    (p, *_) = restarted[0]
    s = start_server(_warm(disk_dir), ranks=1)
    assert re.search(r"rank 0 refused \S+-r0\.cgkv: fingerprint: tp 2, this server 1", s.output), s.output
    with httpx.Client(base_url=s.base, timeout=120, headers=AUTH) as c:
        assert _complete(c, p + [5])[1:] == (0, "no prefix")
        assert _metric(c, 'cupyglm:prefix_cache_disk_refused_total{reason="fingerprint"}') >= 4
        assert c.post("/v1/cache/save").json()["states_written"] >= 1      # TP=1 states beside the TP=2 ones
    _stop(s)
    s = start_server(_warm(disk_dir) + ["--page-tokens", "32"])
    s.wait_for(r"prompt cache on disk", timeout=30)
    assert re.search(r"rank 0 refused \S+-r0\.cgkv: fingerprint: tp 1, this server 2", s.output), s.output
    assert re.search(r"rank 0 refused \S+-r0\.cgkv: fingerprint: page_tokens 16, this server 32", s.output)
    assert re.search(r"rank 1 refused \S+-r1\.cgkv: fingerprint: page_tokens 16, this server 32", s.output)
    with httpx.Client(base_url=s.base, timeout=120, headers=AUTH) as c:
        assert _complete(c, p + [5])[1:] == (0, "no prefix")
    s.kill()


def _file(d, prompt, rank: int):
    (path,) = [x for x in d.glob(f"*-r{rank}{df.SUFFIX}") if df.read_header(x, _fp_of(x)).tokens == tuple(prompt)
               and _fp_of(x)["tp"] == 2]
    return path


def _fp_of(path):
    import json

    raw = path.read_bytes()
    meta_len = struct.unpack_from("<I", raw, 12)[0]
    return json.loads(raw[df.PREFIX_BYTES:df.PREFIX_BYTES + meta_len])["fingerprint"]


def test_corrupt_files_refused_by_name_and_served_fresh(start_server, cold, disk_dir, restarted):
    flip, trunc, newer = restarted[0]
    paths = _file(disk_dir, flip, 1), _file(disk_dir, trunc, 0), _file(disk_dir, newer, 0)
    p = paths[0]                                           # rank 1's body: rank 0 reads its own file fine
    blob = bytearray(p.read_bytes())
    blob[-7] ^= 0x10
    p.write_bytes(bytes(blob))
    p = paths[1]
    p.write_bytes(p.read_bytes()[:-64])
    p = paths[2]
    blob = bytearray(p.read_bytes())
    struct.pack_into("<H", blob, 8, df.VERSION + 1)
    p.write_bytes(bytes(blob))
    s = start_server(_warm(disk_dir))
    out = s.output
    assert re.search(r"rank 0 refused \S+-r0\.cgkv: truncated: .*; deleted", out), out
    assert re.search(r"rank 0 refused \S+-r0\.cgkv: newer header version: header version 2", out), out
    with httpx.Client(base_url=s.base, timeout=120, headers=AUTH) as c:
        for prompt, miss in ((flip, "disk state unreadable"), (trunc, "no prefix"), (newer, "no prefix")):
            got = _complete(c, prompt + [5])
            assert got[1:] == (0, miss) and got[0] == _complete(cold, prompt + [5])[0], miss
        assert _metric(c, 'cupyglm:prefix_cache_disk_refused_total{reason="truncated"}') == 1
    assert re.search(r"rank 1 refused \S+-r1\.cgkv: checksum: the body's checksum does not match; deleted", s.output)
    s.kill()


def _save_until_killed(base: str) -> None:
    try:
        httpx.post(base + "/v1/cache/save", headers=AUTH, timeout=120)
    except httpx.HTTPError:                                # the server is killed while the save waits
        pass


def test_sigkill_while_writing_leaves_nothing_restorable(start_server, tmp_path):
    d = tmp_path / "killed"
    s = start_server(_warm(d), observe=["--disk-write-pause", "60"])
    (p,) = _convs(1, 90)
    with httpx.Client(base_url=s.base, timeout=120, headers=AUTH) as c:
        _complete(c, p)
        t = threading.Thread(target=_save_until_killed, args=(s.base,), daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while len(list(d.glob(f"{df.TMP_PREFIX}*"))) < 2:
            assert time.monotonic() < deadline, list(d.iterdir())
            time.sleep(0.05)
    s.kill()                                               # SIGKILL the launcher and both ranks mid-write
    assert list(d.glob(f"*{df.SUFFIX}")) == [] and len(list(d.glob(f"{df.TMP_PREFIX}*"))) == 2
    s2 = start_server(_warm(d))
    assert len(re.findall(r"removed the torn temp file", s2.output)) == 2, s2.output
    assert list(d.iterdir()) == []
    with httpx.Client(base_url=s2.base, timeout=120, headers=AUTH) as c:
        assert _complete(c, p + [5])[1:] == (0, "no prefix")
    s2.kill()


def test_a_directory_and_a_fifo_named_like_state_files_are_skipped(start_server, tmp_path):
    """Neither stops the start nor blocks it (a FIFO would block open() forever); one line each; states are saved
    and cleared beside them, which stay, and one SIGTERM stops the job."""
    import os

    d = tmp_path / "odd"
    d.mkdir()
    odd = []
    for rank in (0, 1):
        (d / f"0123456789ab-{'a' * 32}-r{rank}{df.SUFFIX}").mkdir()
        os.mkfifo(d / f"0123456789ab-{'b' * 32}-r{rank}{df.SUFFIX}")
        odd += [f"{c * 32}-r{rank}" for c in "ab"]
    names = sorted(x.name for x in d.iterdir())
    s = start_server(_warm(d))
    for name in odd:
        assert len(re.findall(rf"skipped \S*{name}\S*: not a regular file", s.output)) == 1, s.output
    (p,) = _convs(1, 95)
    with httpx.Client(base_url=s.base, timeout=120, headers=AUTH) as c:
        assert c.get("/health").json() == {"status": "ok"}
        first = _complete(c, p)
        assert c.post("/v1/cache/save").status_code == 200
        assert c.post("/v1/cache/clear").status_code == 200          # leaves what is not a state file alone
    _stop(s)
    assert sorted(x.name for x in d.iterdir()) == names and first[1] == 0
