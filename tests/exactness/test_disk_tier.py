"""Kept prompt states on disk, one rank (numpy): spilled on eviction and at the stop, restored after a restart
equal to a cold engine, files refused by name (fingerprint, checksum, truncated, newer header version) and
served fresh, torn temp files cleaned, save and clear."""
from __future__ import annotations

import struct

import pytest

from cupyglm.backend.arithmetic import identity
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.config import EngineConfig
from cupyglm.engine.disk_tier import MISS_DISK, agree_index, planner_from
from cupyglm.engine.engine import Engine
from cupyglm.engine.runner import ModelRunner
from cupyglm.kv import disk_file as df
from cupyglm.kv.disk_store import DiskStore, layout
from cupyglm.kv.kept import KeptStore, kept_state_bytes
from cupyglm.memory import storage_of
from model_helpers import random_prompt as _prompt, run_engine as _run

PAGES, PT = 24, 16


def _fp(**kw):
    base = dict(model="builtin-tiny", backend="numpy", arithmetic=identity("numpy"), tp=1, rank=0,
                page_tokens=PT, kv_cache="bf16", storage="bf16 in 2 bytes", mtp=False)
    return df.state_fingerprint(**{**base, **kw})


def _engine(ckpt, directory=None, kept_pages=400, fp=None, log=None, pause_s=0.0):
    c = ckpt.config
    ops = NumpyOps()
    runner = ModelRunner(ckpt, ops, LocalComm(), PAGES, PT, poison=True)
    kept = disk = planner = None
    if kept_pages:
        probe = KeptStore(c, ops, runner.kv, 1, 1 << 30)
        kept = KeptStore(c, ops, runner.kv, 1, kept_pages * probe.page_bytes)
    if directory is not None:
        disk = DiskStore(directory, fp or _fp(), kept, 0, 1, log or (lambda line: None), pause_s=pause_s)
        disk.index()
        agree_index(disk, None)
        planner = planner_from(disk, 1 << 30, kept.state_bytes)
        planner.can_spill = lambda: disk.failed is None
    cfg = EngineConfig(context=PAGES * PT, num_pages=PAGES, page_tokens=PT, keep_grid=c.keep_grid, parallel=2,
                       prefill_chunk=c.keep_grid, eos_token_ids=c.eos_token_ids, vocab_size=c.vocab_size,
                       poison=True)
    return Engine(runner, LocalComm(), cfg, None, kept=kept, disk=disk, planner=planner)


def _files(d):
    return sorted(p for p in d.iterdir() if p.suffix == df.SUFFIX)


def test_layout_matches_the_kept_state(tiny_ckpt):
    c, st = tiny_ckpt.config, storage_of(NumpyOps())
    for n in (0, 1, 63, 64, 200):
        assert sum(b for _, b in layout(c, 1, st, n)) == kept_state_bytes(c, 1, st, PT, n)


def test_stop_saves_and_a_restart_restores_equal_to_cold(tiny_ckpt, tmp_path):
    grid = tiny_ckpt.config.keep_grid
    a = _prompt(grid + 7, seed=1)
    eng = _engine(tiny_ckpt, tmp_path)
    _run(eng, [a])
    eng.shutdown()                                          # the stop saves what memory holds
    assert len(_files(tmp_path)) == 1                       # the end of the prompt (the grid point is superseded)
    follow = a + _prompt(5, seed=2)
    again = _engine(tiny_ckpt, tmp_path)
    got, info = _run(again, [follow])
    cold, _ = _run(_engine(tiny_ckpt, None, kept_pages=0), [follow])
    assert got == cold and info == [(grid + 7, None)]
    store = again.worker.store
    assert store.disk.stats.hits == 1 and store.disk.stats.bytes_read == store.kept.state_bytes(grid + 7)
    assert again.free_pages == PAGES


def test_evicted_states_spill_and_come_back(tiny_ckpt, tmp_path):
    grid = tiny_ckpt.config.keep_grid
    probe = _engine(tiny_ckpt, None, kept_pages=1)
    one = probe.worker.store.kept.pages_for(grid + 3)
    eng = _engine(tiny_ckpt, tmp_path, kept_pages=one + 1)
    a, b = _prompt(grid + 3, seed=3), _prompt(grid + 3, seed=4)
    _run(eng, [a])
    _run(eng, [b])                                          # a is evicted and spills
    eng.worker.store.disk.flush()
    assert len(_files(tmp_path)) == 1
    got, info = _run(eng, [a + [7, 8]])                     # loaded from disk (b spills to make room)
    cold, _ = _run(_engine(tiny_ckpt, None, kept_pages=0), [a + [7, 8]])
    assert got == cold and info == [(grid + 3, None)] and eng.worker.store.disk.stats.hits == 1
    assert eng.free_pages == PAGES


def _saved(tiny_ckpt, d, seeds):
    grid = tiny_ckpt.config.keep_grid
    prompts = [_prompt(grid + 5, seed=s) for s in seeds]
    eng = _engine(tiny_ckpt, d)
    _run(eng, prompts)
    assert eng.cache_admin("save")["states_written"] == len(prompts)
    eng.shutdown()
    return prompts


def _by_prompt(d, prompt, fp=None):
    key = df.state_key(df.salt_digest(""), prompt)
    return d / df.file_name(fp or _fp(), key, 0)


def test_corrupt_files_are_refused_by_name_and_served_fresh(tiny_ckpt, tmp_path):
    flip, trunc, newer, good = _saved(tiny_ckpt, tmp_path, (10, 11, 12, 13))
    p = _by_prompt(tmp_path, flip)
    blob = bytearray(p.read_bytes())
    blob[-10] ^= 0x40                                       # a body byte
    p.write_bytes(bytes(blob))
    p = _by_prompt(tmp_path, trunc)
    p.write_bytes(p.read_bytes()[:-100])
    p = _by_prompt(tmp_path, newer)
    blob = bytearray(p.read_bytes())
    struct.pack_into("<H", blob, 8, df.VERSION + 1)
    p.write_bytes(bytes(blob))
    lines = []
    eng = _engine(tiny_ckpt, tmp_path, log=lines.append)
    cold = _engine(tiny_ckpt, None, kept_pages=0)
    for prompt, want in ((flip, (0, MISS_DISK)), (trunc, (0, "no prefix")), (newer, (0, "no prefix")),
                         (good, (len(good), None))):
        got, info = _run(eng, [prompt + [5, 6]])
        assert info == [want] and got == _run(cold, [prompt + [5, 6]])[0], want
    text = "\n".join(lines)
    assert "truncated" in text and "newer header version" in text and "checksum" in text, text
    assert not _by_prompt(tmp_path, flip).exists() and not _by_prompt(tmp_path, trunc).exists()
    assert _by_prompt(tmp_path, newer).exists()            # another build's file is left alone
    assert dict(eng.worker.store.disk.stats.refused) == {"truncated": 1, "newer header version": 1, "checksum": 1}


@pytest.mark.parametrize("field,value", [("tp", 2), ("page_tokens", 32), ("model", "0" * 64),
                                         ("arithmetic", "arithmetic 1, tensor core sm_120")])
def test_other_settings_are_refused(tiny_ckpt, tmp_path, field, value):
    (prompt,) = _saved(tiny_ckpt, tmp_path, (20,))
    lines = []
    eng = _engine(tiny_ckpt, tmp_path, fp=_fp(**{field: value}), log=lines.append)
    # the file's name carries its own settings' tag, so only the index's header check sees it
    assert eng.worker.store.disk.states == {} and eng.worker.store.disk.stats.refused["fingerprint"] == 1
    assert any(f"fingerprint: {field}" in line for line in lines), lines
    assert _run(eng, [prompt + [1]])[1] == [(0, "no prefix")]
    assert len(_files(tmp_path)) == 1                       # not corrupt: kept for the server it belongs to


def test_torn_temp_files_are_cleaned_and_never_restored(tiny_ckpt, tmp_path):
    torn = tmp_path / f"{df.TMP_PREFIX}{df.file_name(_fp(), 'ab' * 16, 0)}-999999999"
    torn.write_bytes(b"CGKVDISK" + b"\0" * 100)
    lines = []
    _engine(tiny_ckpt, tmp_path, log=lines.append)
    assert not torn.exists() and any("torn temp file" in line for line in lines)


def test_clear_drops_memory_and_disk(tiny_ckpt, tmp_path):
    (prompt,) = _saved(tiny_ckpt, tmp_path, (30,))
    eng = _engine(tiny_ckpt, tmp_path)
    assert _run(eng, [prompt + [1]])[1][0][0] == len(prompt)
    out = eng.cache_admin("clear")
    assert out["disk_cleared"] and out["memory_states_dropped"] >= 1 and _files(tmp_path) == []
    assert _run(eng, [prompt + [1]])[1] == [(0, "no prefix")]
    assert eng.free_pages == PAGES


def test_a_write_error_stops_spilling_and_serving_goes_on(tiny_ckpt, tmp_path, monkeypatch):
    import errno

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(df, "write_state", full)
    lines = []
    eng = _engine(tiny_ckpt, tmp_path, log=lines.append)
    a, b = _prompt(40, seed=50), _prompt(40, seed=51)
    _run(eng, [a])
    assert eng.cache_admin("save")["disk_ok"] is False
    assert any("No space left on device" in x and "spilling to disk stopped, serving continues" in x for x in lines)
    got, info = _run(eng, [a + [3]])
    assert info == [(40, None)] and got == _run(_engine(tiny_ckpt, None, kept_pages=0), [a + [3]])[0]
    _run(eng, [b])
    eng.shutdown()
    assert _files(tmp_path) == [] and sum("spilling to disk stopped" in x for x in lines) == 1
