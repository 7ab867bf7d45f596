"""The tiny checkpoint, the cached default, the loader (headers checked against the split table, each rank's
slices read one tensor at a time), TP sharding and the loader's errors."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from cupyglm.checkpoint import names, tiny
from cupyglm.checkpoint.loader import (
    DTYPES, INDEX_FILE, Checkpoint, CheckpointError, SafetensorsFile, open_model, write_safetensors,
)
from cupyglm.checkpoint.tiny import default_tiny_dir, tiny_tensors, write_tiny
from cupyglm.config import preset

BF16 = np.dtype(ml_dtypes.bfloat16)
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
REPO = Path(__file__).resolve().parents[2]
TEXT = names.TEXT_PREFIX


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture()
def ckpt_copy(tiny_dir, tmp_path) -> Path:
    """A private copy of the tiny checkpoint to damage."""
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, dst)
    return dst


# ---- the tiny checkpoint --------------------------------------------------------------------------------
def test_tiny_round_trip(tiny_ckpt):
    cfg = preset("tiny")
    assert tiny_ckpt.config == cfg
    want = tiny_tensors(cfg, seed=0)
    specs = names.checkpoint_specs(cfg)
    assert list(tiny_ckpt.table) == [s.name for s in specs] == list(want)
    assert tiny_ckpt.names() == [s.name for s in names.all_specs(cfg)]
    for s in specs:
        got = tiny_ckpt.tensor(s.name)
        assert got.dtype == np.dtype(DTYPES[s.dtype]) and got.shape == s.shape, s.name
        assert np.array_equal(got.view(np.uint8), want[s.name].view(np.uint8)), s.name


def test_tiny_files(tiny_dir, tiny_ckpt):
    assert {p.name for p in tiny_dir.iterdir()} >= {
        "config.json", SHARD1, SHARD2, INDEX_FILE, "tokenizer.json", "tokenizer_config.json"}
    index = json.loads((tiny_dir / INDEX_FILE).read_text())
    assert set(index["weight_map"].values()) == {SHARD1, SHARD2}
    assert set(index["weight_map"]) == set(tiny_ckpt.table)
    tc = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    assert tc["eos_token"] == "<|endoftext|>" and tc["model_max_length"] > 0 and "[gMASK]<sop>" in tc["chat_template"]
    raw = (tiny_dir / "config.json").read_bytes()
    assert tiny_ckpt.identity == hashlib.sha256(raw).hexdigest()[:16]
    body = json.loads(raw)
    assert body == preset("tiny").to_hf_dict() and {"text_config", "vision_config"} <= body.keys()


def test_tiny_files_read_by_the_safetensors_library(tiny_dir):
    from safetensors import safe_open

    with safe_open(str(tiny_dir / SHARD1), framework="np") as f:
        keys = set(f.keys())
        assert f.metadata() == {"format": "pt"}
    assert keys == set(SafetensorsFile(tiny_dir / SHARD1).keys())


def test_tensors_are_zero_copy_views(tiny_ckpt):
    t = tiny_ckpt.tensor("model.language_model.embed_tokens.weight")
    assert not t.flags.owndata and not t.flags.writeable
    assert t.flags.c_contiguous


def test_tiny_init_is_sane(tiny_ckpt):
    f32 = lambda n: tiny_ckpt.tensor(TEXT + n).astype(np.float32)          # noqa: E731
    d = preset("tiny").hidden_size
    assert abs(f32("embed_tokens.weight").std() - 1.0) < 0.05
    assert abs(tiny_ckpt.tensor("lm_head.weight").astype(np.float32).std() * np.sqrt(d) - 1.0) < 0.05
    a_log = f32("layers.0.self_attn.A_log")
    assert np.all((a_log >= 0) & (a_log <= np.log(16) + 0.01))
    assert abs(f32("norm.weight").mean() - 1.0) < 0.05
    scale = f32("layers.0.hc_attn_scale")
    assert np.all((scale >= 0.5) & (scale <= 1.5))
    # random embeddings through a random projection give O(1) outputs, and the logits are spread out
    x = f32("embed_tokens.weight")[:64]
    h = x @ f32("layers.3.mlp.shared_experts.up_proj.weight").T
    assert 0.5 < h.std() < 2.0
    # the dense layers' MLP is wider on purpose (tiny.DENSE_MLP_GAIN): some pre-activations pass the swiglu limit
    h = x @ f32("layers.0.mlp.up_proj.weight").T
    assert 0.5 * tiny.DENSE_MLP_GAIN < h.std() < 2.0 * tiny.DENSE_MLP_GAIN
    assert 0.001 < np.mean(np.abs(h) > preset("tiny").swiglu_limit) < 0.05
    logits = x @ tiny_ckpt.tensor("lm_head.weight").astype(np.float32).T
    assert 0.5 < logits.std() < 2.0 and np.unique(logits.argmax(-1)).size > 32


def test_adding_a_tensor_shifts_no_other():
    cfg = preset("tiny")
    spec = names.all_specs(cfg)[5]
    a = tiny.init_tensor(spec, cfg, seed=0)
    b = tiny.init_tensor(names.TensorSpec(spec.name, spec.shape, spec.split, spec.dtype), cfg, seed=0)
    assert np.array_equal(_bits(a), _bits(b))
    c = tiny.init_tensor(spec, cfg, seed=1)
    assert not np.array_equal(_bits(a), _bits(c))


def test_make_tiny_is_deterministic(tmp_path, tiny_dir):
    a = write_tiny(tmp_path / "a", seed=0)
    # the CLI, in a fresh process, gives the very same bytes (and those of the cached default)
    subprocess.run([sys.executable, "-m", "cupyglm.cli.make_tiny", str(tmp_path / "b"), "--seed", "0"],
                   check=True, cwd=REPO, capture_output=True)
    fa, fb = _files(a), _files(tmp_path / "b")
    assert fa == fb
    cached = {k: v for k, v in _files(tiny_dir).items() if k in fa}
    assert cached == fa
    c = write_tiny(tmp_path / "c", seed=1)
    fc = _files(c)
    assert fc[SHARD1] != fa[SHARD1] and fc[SHARD2] != fa[SHARD2]
    assert fc["config.json"] == fa["config.json"] and fc["tokenizer.json"] == fa["tokenizer.json"]


def test_make_tiny_cli_main(tmp_path, capsys):
    from cupyglm.cli.make_tiny import main

    assert main([str(tmp_path / "t"), "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert f"{len(names.checkpoint_specs(preset('tiny')))} tensors" in out
    assert f"{len(names.vision_specs(preset('tiny')))} of the vision tower" in out
    ckpt = Checkpoint.open(tmp_path / "t")
    want = tiny_tensors(seed=3)["lm_head.weight"]
    assert np.array_equal(_bits(ckpt.tensor("lm_head.weight")), _bits(want))


# ---- the cached default ------------------------------------------------------------------------------
def test_default_tiny_dir_builds_once(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGLM_CACHE_DIR", str(tmp_path / "cache"))
    before = tiny.BUILD_COUNT
    d1 = default_tiny_dir()
    assert tiny.BUILD_COUNT == before + 1
    assert d1.parent == tmp_path / "cache" and preset("tiny").identity() in d1.name and d1.name.endswith("seed0")
    marker = d1 / tiny.MARKER
    stamp = marker.stat().st_mtime_ns, (d1 / SHARD1).stat().st_mtime_ns
    d2 = default_tiny_dir()
    assert d2 == d1 and tiny.BUILD_COUNT == before + 1
    assert (marker.stat().st_mtime_ns, (d1 / SHARD1).stat().st_mtime_ns) == stamp
    assert Checkpoint.open(d2).config == preset("tiny")
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == [d1.name]   # no temp dirs left


def test_default_tiny_dir_rebuilds_an_incomplete_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGLM_CACHE_DIR", str(tmp_path))
    stale = tmp_path / tiny.tiny_dir_name()
    stale.mkdir()
    (stale / "config.json").write_text("{}")          # a crashed copy: no completion marker
    d = default_tiny_dir()
    assert d == stale and (d / tiny.MARKER).is_file()
    Checkpoint.open(d)


def test_default_tiny_dir_lost_rename_race(tmp_path, monkeypatch, tiny_dir):
    """Without a working lock, a builder whose rename loses discards its copy and uses the winner's."""
    import contextlib

    monkeypatch.setenv("CUPYGLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiny, "_file_lock", lambda path: contextlib.nullcontext())
    final = tmp_path / tiny.tiny_dir_name()
    real_write = tiny.write_tiny

    def write_then_lose(out, **kw):
        real_write(out, **kw)
        shutil.copytree(tiny_dir, final)          # another process finished first

    monkeypatch.setattr(tiny, "write_tiny", write_then_lose)
    before = tiny.BUILD_COUNT
    assert default_tiny_dir() == final
    assert tiny.BUILD_COUNT == before
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [final.name]


def test_default_tiny_dir_concurrent_builders(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "CUPYGLM_CACHE_DIR": str(cache)}
    code = ("from cupyglm.checkpoint.tiny import default_tiny_dir\n"
            "from cupyglm.checkpoint.loader import Checkpoint\n"
            "d = default_tiny_dir(); Checkpoint.open(d); print(d)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    dirs = {o.strip() for o, _ in outs}
    assert len(dirs) == 1
    built = Path(dirs.pop())
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [built.name]
    ckpt = Checkpoint.open(built)
    assert np.array_equal(_bits(ckpt.tensor("lm_head.weight")), _bits(tiny_tensors()["lm_head.weight"]))


def test_open_model(tiny_dir):
    assert open_model(None).path == tiny_dir
    assert open_model(str(tiny_dir)).identity == Checkpoint.open(tiny_dir).identity


# ---- tensor-parallel shards ---------------------------------------------------------------------------
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shards_reassemble(tiny_ckpt, tp):
    shards = [tiny_ckpt.shard(r, tp) for r in range(tp)]
    kinds = set()
    for spec in names.all_specs(tiny_ckpt.config):
        full = tiny_ckpt.tensor(spec.name)
        parts = [s[spec.name] for s in shards]
        kinds.add(spec.split)
        for p in parts:
            assert p.shape == spec.shard_shape(tp) and p.flags.c_contiguous, spec.name
        if spec.split == "rep":
            assert all(np.array_equal(_bits(p), _bits(full)) for p in parts), spec.name
        else:
            axis = 0 if spec.split == "row" else 1
            assert np.array_equal(_bits(np.concatenate(parts, axis=axis)), _bits(full)), spec.name
    assert kinds == {"rep", "row", "col"}


def test_shard_bad_rank(tiny_ckpt):
    with pytest.raises(ValueError, match="rank 2"):
        tiny_ckpt.shard(2, 2)


# ---- the loader on other layouts -------------------------------------------------------------------------
def test_single_file_checkpoint(ckpt_copy, tiny_ckpt):
    merged = {n: np.array(tiny_ckpt.tensor(n)) for n in tiny_ckpt.table}
    for f in (SHARD1, SHARD2, INDEX_FILE):
        (ckpt_copy / f).unlink()
    write_safetensors(ckpt_copy / "model.safetensors", merged)
    ck = Checkpoint.open(ckpt_copy)
    assert np.array_equal(_bits(ck.tensor("lm_head.weight")), _bits(tiny_ckpt.tensor("lm_head.weight")))


def test_write_safetensors_f32_round_trip(tmp_path):
    tensors = {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.ones(3, BF16),
               "e": np.zeros((0, 4), np.float32)}
    write_safetensors(tmp_path / "x.safetensors", tensors)
    f = SafetensorsFile(tmp_path / "x.safetensors")
    assert f.keys() == ["a", "b", "e"]
    for k, v in tensors.items():
        assert f.get(k).dtype == v.dtype and np.array_equal(f.get(k), v)


# ---- errors name the file -----------------------------------------------------------------------------
def _rewrite_shard(path: Path, drop: str | None = None, reshape: tuple[str, tuple] | None = None):
    f = SafetensorsFile(path)
    tensors = {n: np.array(f.get(n)) for n in f.keys() if n != drop}
    if reshape:
        name, shape = reshape
        tensors[name] = np.zeros(shape, BF16)
    del f
    write_safetensors(path, tensors, metadata={"format": "pt"})


def test_missing_dir(tmp_path):
    with pytest.raises(CheckpointError, match="nowhere"):
        Checkpoint.open(tmp_path / "nowhere")


def test_missing_config(ckpt_copy):
    (ckpt_copy / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json"):
        Checkpoint.open(ckpt_copy)


def test_missing_tokenizer(ckpt_copy):
    (ckpt_copy / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer\.json"):
        Checkpoint.open(ckpt_copy)


def test_corrupt_tokenizer(ckpt_copy):
    (ckpt_copy / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json"):
        Checkpoint.open(ckpt_copy)


def test_missing_shard_file(ckpt_copy):
    (ckpt_copy / SHARD2).unlink()
    with pytest.raises(CheckpointError, match=SHARD2):
        Checkpoint.open(ckpt_copy)


def test_no_weights_at_all(ckpt_copy):
    for f in (SHARD1, SHARD2, INDEX_FILE):
        (ckpt_copy / f).unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        Checkpoint.open(ckpt_copy)


def test_corrupt_index(ckpt_copy):
    (ckpt_copy / INDEX_FILE).write_text('{"weight_map": ')
    with pytest.raises(CheckpointError, match=INDEX_FILE):
        Checkpoint.open(ckpt_copy)


def test_truncated_header_length(ckpt_copy):
    (ckpt_copy / SHARD1).write_bytes(b"\x10\x00\x00")
    with pytest.raises(CheckpointError, match=f"{SHARD1}.*truncated"):
        Checkpoint.open(ckpt_copy)


def test_bad_header_length(ckpt_copy):
    p = ckpt_copy / SHARD1
    data = bytearray(p.read_bytes())
    data[:8] = (len(data) + 1).to_bytes(8, "little")
    p.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{SHARD1}.*header length"):
        Checkpoint.open(ckpt_copy)


def test_invalid_header_json(ckpt_copy):
    p = ckpt_copy / SHARD1
    data = bytearray(p.read_bytes())
    data[8:12] = b"#!@$"
    p.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{SHARD1}.*not valid JSON"):
        Checkpoint.open(ckpt_copy)


def test_data_offsets_past_end(ckpt_copy):
    p = ckpt_copy / SHARD2
    data = p.read_bytes()
    p.write_bytes(data[:-100])            # the last tensor's bytes run past the end
    with pytest.raises(CheckpointError, match=f"{SHARD2}.*past the end"):
        Checkpoint.open(ckpt_copy)


def test_missing_tensor_in_shard(ckpt_copy):
    index = json.loads((ckpt_copy / INDEX_FILE).read_text())["weight_map"]
    name = TEXT + "layers.0.self_attn.A_log"
    fname = index[name]
    _rewrite_shard(ckpt_copy / fname, drop=name)
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(ckpt_copy)
    assert name in str(e.value) and fname in str(e.value)


def test_missing_tensor_in_index(ckpt_copy):
    p = ckpt_copy / INDEX_FILE
    index = json.loads(p.read_text())
    del index["weight_map"][TEXT + "norm.weight"]
    p.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"{INDEX_FILE}.*model\\.language_model\\.norm\\.weight"):
        Checkpoint.open(ckpt_copy)


def test_shape_mismatch(ckpt_copy):
    index = json.loads((ckpt_copy / INDEX_FILE).read_text())["weight_map"]
    name = TEXT + "layers.3.self_attn.kv_b_proj.weight"
    _rewrite_shard(ckpt_copy / index[name], reshape=(name, (7, 64)))
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(ckpt_copy)
    msg = str(e.value)
    assert name in msg and "(7, 64)" in msg and str(names_shape(name)) in msg and index[name] in msg


def names_shape(name: str) -> tuple:
    return {s.name: s.shape for s in names.checkpoint_specs(preset("tiny"))}[name]


def test_unsupported_config_is_named(ckpt_copy):
    p = ckpt_copy / "config.json"
    cfg = json.loads(p.read_text())
    cfg["text_config"]["qk_rope_head_dim"] = 64
    p.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json.*qk_rope_head_dim"):
        Checkpoint.open(ckpt_copy)
