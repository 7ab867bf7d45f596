"""The tiny checkpoint is laid out as the published GLM-5.3-Flash checkpoint: every stored tensor name against
the split table (both ways), the name patterns and their dtypes and splits, and the loader's refusals of any
other layout (old names, an unknown tensor, a missing vision tensor, a wrong dtype or shape), each by name."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from cupyglm.checkpoint import names
from cupyglm.checkpoint.loader import INDEX_FILE, Checkpoint, CheckpointError, SafetensorsFile, write_safetensors
from cupyglm.config import preset

T = "model.language_model."
# Every name pattern of the published checkpoint ({i} a layer, {e} an expert, {n} a vision block): split, dtype.
PATTERNS = {
    f"{T}embed_tokens.weight": ("rep", "BF16"),
    f"{T}norm.weight": ("rep", "BF16"),
    "lm_head.weight": ("row", "BF16"),
    **{f"{T}layers.{{i}}.{n}": ("rep", "BF16") for n in (
        "input_layernorm.weight", "post_attention_layernorm.weight", "hc_attn_fn", "hc_ffn_fn",
        "self_attn.f_a_proj.weight", "self_attn.g_a_proj.weight", "self_attn.o_norm.weight",
        "self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight", "self_attn.kv_a_proj_with_mqa.weight",
        "self_attn.kv_a_layernorm.weight", "self_attn.indexer.wq_b.weight", "self_attn.indexer.wk.weight",
        "self_attn.indexer.k_norm.weight", "self_attn.indexer.k_norm.bias", "self_attn.indexer.weights_proj.weight",
        "self_attn.indexer.index_kpool_compress_gate", "self_attn.indexer.index_kpool_compress_ape",
        "mlp.gate.weight", "enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")},
    **{f"{T}layers.{{i}}.{n}": ("rep", "F32") for n in (
        "hc_attn_base", "hc_attn_scale", "hc_ffn_base", "hc_ffn_scale", "mlp.gate.e_score_correction_bias")},
    **{f"{T}layers.{{i}}.{n}": ("row", "BF16") for n in (
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.q_conv1d.weight", "self_attn.k_conv1d.weight", "self_attn.v_conv1d.weight",
        "self_attn.f_b_proj.weight", "self_attn.g_b_proj.weight", "self_attn.b_proj.weight",
        "self_attn.q_b_proj.weight", "self_attn.kv_b_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
        "mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight")},
    **{f"{T}layers.{{i}}.{n}": ("row", "F32") for n in ("self_attn.A_log", "self_attn.dt_bias")},
    **{f"{T}layers.{{i}}.{n}": ("col", "BF16") for n in (
        "self_attn.o_proj.weight", "mlp.down_proj.weight", "mlp.experts.{e}.down_proj.weight",
        "mlp.shared_experts.down_proj.weight")},
    **{f"model.visual.{n}": ("rep", "BF16") for n in (
        "patch_embed.proj.weight", "patch_embed.proj.bias", "post_layernorm.weight", "downsample.weight",
        "downsample.bias", "merger.proj.weight", "merger.post_projection_norm.weight",
        "merger.post_projection_norm.bias", "merger.gate_proj.weight", "merger.up_proj.weight",
        "merger.down_proj.weight")},
    **{f"model.visual.blocks.{{n}}.{n}": ("rep", "BF16") for n in (
        "norm1.weight", "norm2.weight", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
        "attn.q_norm.weight", "attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.gate_proj.bias",
        "mlp.up_proj.weight", "mlp.up_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias")},
}


def _pattern(name: str) -> str:
    name = re.sub(r"\.layers\.\d+\.", ".layers.{i}.", name)
    name = re.sub(r"\.experts\.\d+\.", ".experts.{e}.", name)
    return re.sub(r"\.blocks\.\d+\.", ".blocks.{n}.", name)


def _stored(d: Path) -> dict[str, tuple[str, tuple]]:
    """name -> (dtype, shape) of every tensor in the directory's safetensors files, read from their headers."""
    out = {}
    for p in sorted(d.glob("*.safetensors")):
        for info in SafetensorsFile(p).tensors.values():
            out[info.name] = (info.dtype, info.shape)
    return out


def _rewrite(d: Path, rename=lambda n: n, drop=lambda n: False, change=None) -> None:
    """Rewrite every shard and the index of the checkpoint in `d` with renamed / dropped / replaced tensors."""
    weight_map = {}
    for p in sorted(d.glob("*.safetensors")):
        f = SafetensorsFile(p)
        tensors = {rename(n): np.array(f.get(n)) for n in f.keys() if not drop(n)}
        if change:
            tensors.update({k: v for k, v in change.items() if k in tensors})
        del f
        write_safetensors(p, tensors, metadata={"format": "pt"})
        weight_map.update({n: p.name for n in tensors})
    (d / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.fixture()
def copy_dir(tiny_dir, tmp_path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, dst)
    return dst


def test_every_stored_tensor_is_in_the_table_and_back(tiny_dir):
    cfg = preset("tiny")
    stored = _stored(tiny_dir)
    table = {s.name: (s.dtype, s.shape) for s in names.checkpoint_specs(cfg)}
    assert sorted(stored) == sorted(table)
    assert stored == table
    index = json.loads((tiny_dir / INDEX_FILE).read_text())["weight_map"]
    assert sorted(index) == sorted(table)


def test_name_patterns_dtypes_and_splits():
    for cfg in (preset("tiny"), preset("glm-5.3-flash")):
        got = {}
        for s in names.checkpoint_specs(cfg):
            assert got.setdefault(_pattern(s.name), (s.split, s.dtype)) == (s.split, s.dtype), s.name
        assert got == PATTERNS


def test_layer_contents_follow_the_config():
    cfg = preset("glm-5.3-flash")
    specs = {s.name: s for s in names.checkpoint_specs(cfg)}
    L = f"{T}layers."
    assert f"{L}45.self_attn.indexer.index_kpool_compress_ape" in specs          # the MTP layer is layer 45
    assert not any(n.startswith(f"{L}45.hc_") for n in specs)                     # plain residuals there
    assert not any(n.startswith(f"{L}46.") for n in specs)
    assert f"{L}2.mlp.gate_proj.weight" in specs and f"{L}3.mlp.experts.287.down_proj.weight" in specs
    assert f"{L}3.mlp.gate_proj.weight" not in specs and f"{L}3.self_attn.kv_b_proj.weight" in specs
    assert specs[f"{L}0.self_attn.q_conv1d.weight"].shape == (8192, 1, 4)
    assert specs[f"{L}3.self_attn.indexer.index_kpool_compress_gate"].shape == (128, 4096)
    assert specs[f"{L}3.self_attn.indexer.index_kpool_compress_ape"].shape == (4, 128)
    assert specs[f"{L}0.hc_attn_fn"].shape == (24, 16384) and specs[f"{L}0.hc_attn_scale"].shape == (3,)
    assert specs["model.visual.patch_embed.proj.weight"].shape == (1024, 3, 2, 14, 14)
    assert specs["model.visual.downsample.weight"].shape == (4096, 1024, 2, 2)
    assert len(names.vision_specs(cfg)) == 347 and len(specs) - 347 == 38_423


def test_old_names_are_refused_naming_the_first_unknown_tensor(copy_dir):
    def old(n):
        n = n.replace(T, "model.").replace("indexer.index_kpool_compress_ape", "indexer.ape")
        return n.replace("indexer.index_kpool_compress_gate", "indexer.compress_gate.weight")

    _rewrite(copy_dir, rename=old, drop=lambda n: n.startswith(names.VISION_PREFIX))
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(copy_dir)
    msg = str(e.value)
    assert "unknown tensor 'model.embed_tokens.weight'" in msg and INDEX_FILE in msg
    assert "'model.language_model.'" in msg                       # the hint names the real prefix


def test_an_unknown_tensor_is_refused_by_name(copy_dir):
    extra = f"{T}layers.0.mlp.gate_proj.weight_scale_inv"
    first = sorted(_stored(copy_dir))[0]
    _rewrite(copy_dir, rename=lambda n: extra if n == first else n)
    with pytest.raises(CheckpointError, match=f"unknown tensor '{re.escape(extra)}'"):
        Checkpoint.open(copy_dir)


def test_a_missing_vision_tensor_is_refused(copy_dir):
    gone = "model.visual.blocks.1.attn.qkv.bias"
    _rewrite(copy_dir, drop=lambda n: n == gone)
    with pytest.raises(CheckpointError, match=f"missing tensor '{re.escape(gone)}'"):
        Checkpoint.open(copy_dir)


@pytest.mark.parametrize("name, value, words", [
    (f"{T}layers.0.self_attn.A_log", np.zeros(4, np.float16), "stored as F16, expected F32"),
    (f"{T}layers.3.mlp.gate.e_score_correction_bias", np.zeros(8, np.float64), "stored as F64, expected F32"),
    (f"{T}embed_tokens.weight", np.zeros((512, 256), np.float32), "stored as F32, expected BF16"),
    ("model.visual.merger.proj.weight", np.zeros((256, 255), np.float32), "shape (256, 255)"),
])
def test_wrong_dtype_or_shape_is_refused_by_name(copy_dir, name, value, words):
    _rewrite(copy_dir, change={name: value})
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(copy_dir)
    assert name in str(e.value) and words in str(e.value)


def test_config_layouts_load(copy_dir, tiny_ckpt):
    raw = json.loads((copy_dir / "config.json").read_text())
    assert "text_config" in raw and "vision_config" in raw
    ck = Checkpoint.open(copy_dir)
    assert ck.config == tiny_ckpt.config and ck.config.vision is not None
    # a flat, text-only config: the vision tensors are then unknown, and without them the checkpoint loads
    (copy_dir / "config.json").write_text(json.dumps(raw["text_config"]))
    with pytest.raises(CheckpointError, match="unknown tensor 'model.visual."):
        Checkpoint.open(copy_dir)
    _rewrite(copy_dir, drop=lambda n: n.startswith(names.VISION_PREFIX))
    ck = Checkpoint.open(copy_dir)
    assert ck.config.vision is None and ck.names() == tiny_ckpt.names()
