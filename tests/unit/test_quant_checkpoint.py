"""Quantised checkpoints: the declared format read and anything else refused by name before a weight is read,
the stored layout checked, TP sizes that would cut a scale block refused naming the tensor, and the NumPy twin's
decode (e4m3, e2m1, ModelOpt's nibble order)."""
from __future__ import annotations

import json
import shutil

import ml_dtypes
import numpy as np
import pytest

from cupyglm.backend.qweight import E2M1, E4M3, QWeight, dequant, quantize_fp8, quantize_nvfp4
from cupyglm.checkpoint import quant
from cupyglm.checkpoint.loader import Checkpoint, CheckpointError
from cupyglm.checkpoint.names import TensorSpec
from cupyglm.checkpoint.tiny import write_tiny


@pytest.fixture(scope="module")
def fp8_dir(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("fp8"), quant="fp8")


@pytest.fixture(scope="module")
def nvfp4_dir(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("nvfp4"), quant="nvfp4")


def _copy(src, tmp_path, corrupt=True):
    """A copy of a checkpoint; with corrupt its weights are zeros, so reaching the loader's reads would fail
    differently than the refusal under test."""
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    if corrupt:
        for f in dst.glob("*.safetensors"):
            f.write_bytes(b"\0" * 16)
    return dst


def _edit(path, fn):
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("change, words", [
    (lambda q: q.update(quant_method="gptq"), "quant_method 'gptq'"),
    (lambda q: q.update(fmt="e5m2"), "fmt 'e5m2'"),
    (lambda q: q.pop("weight_block_size"), "weight_block_size None"),
    (lambda q: q.update(activation_scheme="static"), "activation_scheme 'static'"),
])
def test_fp8_config_refused_by_name_before_weights(fp8_dir, tmp_path, change, words):
    d = _copy(fp8_dir, tmp_path)
    _edit(d / "config.json", lambda c: change(c["quantization_config"]))
    with pytest.raises(CheckpointError, match=words) as e:
        Checkpoint.open(d)
    assert "safetensors" not in str(e.value)


@pytest.mark.parametrize("change, words", [
    (lambda q: q.update(quant_algo="W4A8_AWQ"), "quant_algo 'W4A8_AWQ'"),
    (lambda q: q.update(group_size=32), "group_size 32"),
    (lambda q: q.update(kv_cache_quant_algo="FP8"), "kv_cache_quant_algo 'FP8'"),
])
def test_modelopt_config_refused_by_name_before_weights(nvfp4_dir, tmp_path, change, words):
    d = _copy(nvfp4_dir, tmp_path)
    _edit(d / quant.HF_QUANT_FILE, lambda c: change(c["quantization"]))
    with pytest.raises(CheckpointError, match=words):
        Checkpoint.open(d)


def test_quantised_tensors_without_a_declared_format_are_refused(fp8_dir, tmp_path):
    d = _copy(fp8_dir, tmp_path, corrupt=False)
    _edit(d / "config.json", lambda c: c.pop("quantization_config"))
    with pytest.raises(CheckpointError, match="declares no quantization_config"):
        Checkpoint.open(d)


def test_a_not_converted_module_stored_quantised_is_refused(fp8_dir, tmp_path):
    d = _copy(fp8_dir, tmp_path, corrupt=False)
    mod = "model.layers.3.self_attn.q_a_proj"
    _edit(d / "config.json", lambda c: c["quantization_config"]["modules_to_not_convert"].append(mod))
    with pytest.raises(CheckpointError, match="layers.3.self_attn.q_a_proj.weight.*not converted"):
        Checkpoint.open(d)


def test_both_formats_load_their_projections_quantised(fp8_dir, nvfp4_dir):
    for d, fmt in ((fp8_dir, "fp8"), (nvfp4_dir, "nvfp4")):
        ckpt = Checkpoint.open(d)
        assert ckpt.scheme.fmt == fmt and len(ckpt.quantised) > 100
        name = sorted(ckpt.quantised)[0]
        w = ckpt.read_weight(name, 0, 2)
        assert isinstance(w, QWeight) and w.values.dtype == np.uint8
        full = ckpt.specs[name].shard_shape(2)
        assert w.shape == full


def test_tp_that_cuts_a_scale_block_is_refused_naming_the_tensor(fp8_dir):
    ckpt = Checkpoint.open(fp8_dir)
    ckpt.shard(0, 2)                                         # 32 x 32 blocks: every split at TP=2 is whole
    with pytest.raises(CheckpointError, match=r"experts\.0\.down_proj\.weight: TP=4 would cut its 32x32 FP8"):
        ckpt.shard(0, 4)
    spec = TensorSpec("x.layers.0.mlp.down_proj.weight", (256, 96), "col")
    with pytest.raises(quant.QuantError, match="NVFP4 groups of 16"):
        quant.check_tp(spec, quant.default_scheme("nvfp4"), 4)      # 24 columns a rank
    quant.check_tp(spec, quant.default_scheme("nvfp4"), 2)          # 48: whole groups


def test_e4m3_and_e2m1_decode():
    assert E4M3[0x38] == 1.0 and E4M3[0x01] == 2.0 ** -9 and E4M3[0x7E] == 448.0 and np.isnan(E4M3[0x7F])
    assert E4M3[0xB8] == -1.0 and np.isnan(E4M3[0xFF])
    assert E2M1.tolist() == [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6]


def test_nvfp4_nibble_order_is_modelopts():
    """Byte i holds element 2i in its low nibble: 0x21 is (0.5, 1.0), with unit scales."""
    values = np.full((1, 8), 0x21, np.uint8)
    scale = np.full((1, 1), 0x38, np.uint8)                   # e4m3 1.0
    q = QWeight("nvfp4", (1, 16), values, scale, np.ones(1, np.float32))
    assert dequant(q)[0, :4].tolist() == [0.5, 1.0, 0.5, 1.0]


def test_quantisers_round_trip_within_the_formats_precision():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 80)).astype(np.float32)
    v, s = quantize_fp8(w, (32, 32))
    d = dequant(QWeight("fp8", w.shape, v, s, None, (32, 32)))
    assert np.abs(d - w).max() <= np.abs(w).max() / 16          # e4m3: 3 mantissa bits, values near the block max
    v, s, s2 = quantize_nvfp4(w)
    d = dequant(QWeight("nvfp4", w.shape, v, s, s2.reshape(1)))
    rel = np.sqrt(((d - w) ** 2).mean() / (w ** 2).mean())
    assert 0.02 < rel < 0.15                                     # 4-bit values: a few percent, not exact
    assert s.view(ml_dtypes.float8_e4m3fn).astype(np.float32).max() <= 448
