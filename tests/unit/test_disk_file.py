"""The state file format, the disk section of the step message, and rank 0's disk index (LRU by bytes)."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.engine.disk_tier import DISK_CLEAR, DISK_SYNC, DiskIndex, DiskOps
from cupyglm.engine.ops.codec import decode, encode
from cupyglm.engine.step_message import assemble
from cupyglm.kv import disk_file as df

FP = df.state_fingerprint(model="m", backend="numpy", arithmetic="arithmetic 1, tensor core sm_90", tp=2, rank=1,
                          page_tokens=16, kv_cache="bf16", storage="bf16 in 2 bytes", mtp=False)


def _write(tmp_path, body=None, tokens=(5, 6, 7)):
    body = np.arange(1000, dtype=np.uint8) if body is None else body
    lay = [("a", 600), ("b", body.size - 600)]
    salt = df.salt_digest("tenant")
    name = df.file_name(FP, df.state_key(salt, tokens), 1)
    df.write_state(tmp_path, name, FP, salt, tokens, lay, body)
    return tmp_path / name, body


def test_round_trip_and_no_temp_left(tmp_path):
    path, body = _write(tmp_path)
    h = df.read_header(path, FP)
    assert h.tokens == (5, 6, 7) and h.layout == (("a", 600), ("b", 400)) and h.salt == df.salt_digest("tenant")
    out = np.empty(h.body_len, dtype=np.uint8)
    df.read_body(path, h, out)
    assert np.array_equal(out, body) and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_state_of_another_arithmetic_is_refused_by_name(tmp_path):
    path, _ = _write(tmp_path)
    for other in ("arithmetic 1, tensor core sm_120", "arithmetic 2, tensor core sm_90"):
        with pytest.raises(df.StateRefused, match="fingerprint: arithmetic 'arithmetic 1, tensor core sm_90', "
                                                  f"this server '{other}'") as e:
            df.read_header(path, dict(FP, arithmetic=other))
        assert e.value.reason == df.FINGERPRINT and not e.value.corrupt
    old = {k: v for k, v in FP.items() if k != "arithmetic"}      # a file of a build before the key existed
    df.write_state(tmp_path, "old" + df.SUFFIX, old, df.salt_digest("t"), (1,), [("a", 4)], np.zeros(4, np.uint8))
    with pytest.raises(df.StateRefused, match="fingerprint: arithmetic None"):
        df.read_header(tmp_path / ("old" + df.SUFFIX), FP)


def test_each_refusal_is_named(tmp_path):
    path, _ = _write(tmp_path)
    other = dict(FP, tp=1)
    with pytest.raises(df.StateRefused, match="fingerprint: tp 2, this server 1") as e:
        df.read_header(path, other)
    assert not e.value.corrupt
    raw = path.read_bytes()
    path.write_bytes(raw[:-1])
    with pytest.raises(df.StateRefused, match="^truncated") as e:
        df.read_header(path, FP)
    assert e.value.corrupt
    blob = bytearray(raw)
    blob[-1] ^= 1
    path.write_bytes(bytes(blob))
    h = df.read_header(path, FP)                            # the header is fine, the body is not
    with pytest.raises(df.StateRefused, match="^checksum"):
        df.read_body(path, h, np.empty(h.body_len, dtype=np.uint8))
    blob = bytearray(raw)
    blob[8] = df.VERSION + 1
    path.write_bytes(bytes(blob))
    with pytest.raises(df.StateRefused, match="^newer header version") as e:
        df.read_header(path, FP)
    assert not e.value.corrupt
    blob = bytearray(raw)
    blob[df.PREFIX_BYTES + 3] ^= 1                          # a header byte
    path.write_bytes(bytes(blob))
    with pytest.raises(df.StateRefused, match="^checksum: the header"):
        df.read_header(path, FP)


def test_layout_must_cover_the_body(tmp_path):
    with pytest.raises(ValueError, match="layout covers"):
        df.write_state(tmp_path, "x.cgkv", FP, df.salt_digest(""), [1], [("a", 3)], np.zeros(4, np.uint8))


def test_step_message_disk_section_round_trip():
    ops = DiskOps(spills=((3, b"s" * 16, b"k" * 16),), loads=((9, 460, b"q" * 16),), unlinks=(b"u" * 16, b"v" * 16),
                  ops=DISK_SYNC | DISK_CLEAR)
    msg = assemble(4, drops=(1, 2), disk=ops)
    assert decode(encode(msg)) == msg
    assert [type(op).__name__ for op in msg.ops] == \
        ["Spill", "Drop", "Unlink", "Clear", "Load", "Sync"]
    assert decode(encode(assemble(5, disk=DiskOps()))).ops == ()     # no disk work: no operation


def test_disk_index_lru_by_bytes():
    idx = DiskIndex(budget_bytes=250)
    assert idx.add("a", "s", (1, 2), 100) == [] and idx.add("b", "s", (1, 2, 3), 100) == []
    idx.touch("a")
    assert idx.add("c", "s", (4,), 100) == ["b"]            # b is least recently used
    assert idx.longest("s", (1, 2, 3, 9), 3) == ("a", 2) and idx.longest("t", (1, 2, 3), 3) == (None, 0)
    assert idx.held == 200


def test_checkpoint_identity(tiny_dir, tmp_path):
    import shutil

    a = df.checkpoint_identity(tiny_dir)
    assert a == df.checkpoint_identity(tiny_dir) and a != df.checkpoint_identity(tiny_dir, builtin=True)
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dir, copy)
    assert df.checkpoint_identity(copy) == a                 # a moved checkpoint keeps its states
    cfg = (copy / "config.json").read_text()
    (copy / "config.json").write_text(cfg.replace('"hidden_size": 256', '"hidden_size": 256 '))
    assert df.checkpoint_identity(copy) != a


def test_checkpoint_identity_hashes_the_quant_config(tiny_dir, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_dir, copy)
    plain = df.checkpoint_identity(copy)
    (copy / "hf_quant_config.json").write_text('{"quantization": {"quant_algo": "NVFP4", "group_size": 16}}')
    quant = df.checkpoint_identity(copy)
    (copy / "hf_quant_config.json").write_text('{"quantization": {"quant_algo": "NVFP4", "group_size": 32}}')
    assert len({plain, quant, df.checkpoint_identity(copy)}) == 3


def test_disk_settings_are_checked_and_the_directory_is_not_compared():
    from cupyglm.distributed.fingerprint import fingerprint
    from cupyglm.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match="--prompt-cache-dir needs --prompt-cache-gib > 0"):
        Settings.from_argv(["--prompt-cache-dir", "/tmp/x"])
    with pytest.raises(SettingsError, match="--prompt-cache-disk-gib needs --prompt-cache-dir"):
        Settings.from_argv(["--prompt-cache-gib", "1", "--prompt-cache-disk-gib", "2"])
    a = Settings.from_argv(["--prompt-cache-gib", "1", "--prompt-cache-dir", "/a", "--prompt-cache-disk-gib", "2"])
    b = Settings.from_argv(["--prompt-cache-gib", "1", "--prompt-cache-dir", "/b", "--prompt-cache-disk-gib", "2"])
    off = Settings.from_argv(["--prompt-cache-gib", "1"])
    assert fingerprint(a, backend="numpy") == fingerprint(b, backend="numpy") != fingerprint(off, backend="numpy")
    assert fingerprint(a, backend="numpy")["prompt_cache_disk_gib"] == 2.0


def test_only_regular_files_are_read(tmp_path):
    """A directory, a FIFO and a symlink under a state's name: never opened blocking, refused as unreadable."""
    import os

    path, _ = _write(tmp_path)
    d, fifo, link = (tmp_path / f"x-{i}-r1{df.SUFFIX}" for i in range(3))
    d.mkdir()
    os.mkfifo(fifo)
    link.symlink_to(path)
    assert df.is_regular(path) and not any(df.is_regular(p) for p in (d, fifo, link, tmp_path / "gone"))
    for p in (d, fifo, link):
        with pytest.raises(df.StateRefused, match="^unreadable") as e:
            df.read_header(p, FP)                           # a FIFO would block here without O_NONBLOCK
        assert e.value.corrupt
