"""ModelConfig: read from config.json (or text_config), refused by field name when unsupported."""
import json

import pytest

from cupyglm.config import ConfigError, ModelConfig, preset


def _raw():
    return preset("tiny").to_hf_dict()


def test_round_trip_and_text_config():
    cfg = preset("tiny")
    assert ModelConfig.from_dict(_raw()) == cfg
    assert ModelConfig.from_dict({"architectures": ["Glm5Moe"], "text_config": _raw()}) == cfg


def test_full_preset_facts():
    full = preset("glm-5.3-flash")
    assert full.dsa_layers == tuple(range(3, 45, 4)) and len(full.kda_layers) == 34
    assert full.kv_layers == full.dsa_layers + (45,)
    assert full.max_position_embeddings == 1_048_576 and preset("tiny").max_position_embeddings == 131_072
    assert full.dense_limit == 2051 and full.max_pick == 2051
    tiny = preset("tiny")
    assert tiny.dense_limit == 35 and tiny.dsa_layers == (3, 7) and tiny.page_tokens == 16


@pytest.mark.parametrize("field, value", [
    ("qk_rope_head_dim", 64), ("n_group", 8), ("topk_group", 4), ("scoring_func", "softmax"),
    ("hidden_act", "gelu"), ("tie_word_embeddings", True), ("num_nextn_predict_layers", 2),
    ("hc_mult", 2), ("index_kpool", 8), ("layer_types", ["linear_attention"] * 7 + ["mamba"]),
    ("layer_types", ["linear_attention"] * 3), ("hidden_size", 0), ("cupyglm_page_tokens", 6),
])
def test_unsupported_values_are_refused_by_field(field, value):
    raw = _raw()
    raw[field] = value
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_dict(raw)
    assert field in str(e.value)


def test_missing_field_and_bad_file(tmp_path):
    raw = _raw()
    del raw["vocab_size"]
    with pytest.raises(ConfigError, match="'vocab_size'"):
        ModelConfig.from_dict(raw)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_file(tmp_path / "config.json")
    with pytest.raises(ConfigError, match="missing config.json"):
        ModelConfig.from_file(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match="unknown config preset"):
        preset("glm-9")
    (tmp_path / "ok.json").write_text(json.dumps(_raw()))
    assert ModelConfig.from_file(tmp_path / "ok.json") == preset("tiny")


def test_max_position_embeddings_is_read_and_defaulted():
    raw = _raw()
    raw["max_position_embeddings"] = 202_752
    assert ModelConfig.from_dict(raw).max_position_embeddings == 202_752
    del raw["max_position_embeddings"]
    assert ModelConfig.from_dict(raw).max_position_embeddings == 1_048_576      # the default: 1M tokens
    raw["max_position_embeddings"] = 0
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        ModelConfig.from_dict(raw)
