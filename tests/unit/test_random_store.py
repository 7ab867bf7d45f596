"""bench's random models: tensors memoized on disk per (config, seed), quantised projections drawn directly as
codes and scales (never quantised from bf16), read back identical; micro's predicted-vs-measured join."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench import micro_join, random_store  # noqa: E402
from bench.big_random import RandomCheckpoint, big_config  # noqa: E402
from cupyglm.backend import qweight as qw  # noqa: E402
from cupyglm.checkpoint import tiny_quant  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGLM_CACHE_DIR", str(tmp_path))
    return tmp_path


def _no_quantising(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a random model quantised a bf16 tensor")
    for mod, name in ((qw, "quantize_nvfp4"), (qw, "quantize_fp8"), (tiny_quant, "quantise")):
        monkeypatch.setattr(mod, name, refuse)


def test_built_once_then_read_back(cache, monkeypatch):
    _no_quantising(monkeypatch)
    cfg = big_config("small")
    first = RandomCheckpoint(cfg, quant="nvfp4")
    made = first.build(threads=2)
    assert made > 0
    again = RandomCheckpoint(cfg, quant="nvfp4")
    assert again.build(threads=2) == 0                         # every tensor memoized
    bf = RandomCheckpoint(cfg)
    assert 0 < bf.build(threads=2) < made                      # shares the unquantised tensors, adds the bf16 ones
    name = sorted(first.quantised)[0]
    a, b = first.shard(0, 1)[name], again.shard(0, 1)[name]
    assert isinstance(a, qw.QWeight) and a.fmt == "nvfp4"
    assert np.array_equal(a.values, b.values) and np.array_equal(a.scale, b.scale)
    emb = next(n for n in first.shard(0, 1) if n.endswith("embed_tokens.weight"))
    assert np.array_equal(np.asarray(first.shard(0, 1)[emb]).view(np.uint16),
                          np.asarray(bf.shard(0, 1)[emb]).view(np.uint16))
    assert str(first.shard(0, 1)[emb].dtype) == "bfloat16"


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_direct_codes_have_the_init_rules_scale(cache, monkeypatch, fmt):
    _no_quantising(monkeypatch)
    cfg = big_config("small")
    ck = RandomCheckpoint(cfg, quant=fmt)
    for name in sorted(ck.quantised)[:4]:
        spec = ck.store.specs[name]
        w = qw.dequant(ck.shard(0, 1)[name])
        assert w.shape == spec.shape and np.isfinite(w).all()
        rms = float(np.sqrt(np.mean(np.square(w, dtype=np.float64))))
        assert rms == pytest.approx(random_store._std(spec), rel=0.25), name


def test_a_different_seed_is_another_store(cache):
    cfg = big_config("small")
    assert random_store.store_dir(cfg, 0) != random_store.store_dir(cfg, 1)
    assert random_store.store_dir(cfg, 0) != random_store.store_dir(big_config("small", hidden_size=256), 0)


def test_join_tolerates_missing_rows():
    pred = [{"kernel": "gemv_lane16", "role": "decode", "rows": 1, "dtype": "bf16", "predicted_us": 10.0,
             "bound": "issue"},
            {"kernel": "attention_rows", "role": "decode", "rows": 16, "dtype": "bf16", "predicted_us": 5.0,
             "bound": "memory"}]
    meas = [{"kernel": "gemv_lane16", "form": "dense", "role": "decode", "rows": 1, "dtype": "bf16",
             "measured_us": 25.0},
            {"kernel": "gemv_lane16_q", "form": "dense", "role": "decode", "rows": 1, "dtype": "nvfp4",
             "measured_us": 30.0}]
    lines = micro_join.join_lines(pred, meas)
    assert any("gemv_lane16 " in x and "2.50" in x and "issue" in x for x in lines)
    assert any("gemv_lane16_q" in x and "(no prediction)" in x for x in lines)
    assert any("attention_rows" in x and "(not measured)" in x for x in lines)
