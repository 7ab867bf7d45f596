"""ModelConfig: read from config.json as the published checkpoint lays it out (text_config and vision_config under
the top level, or a flat text-only config), defaults as the released config, refusals by field name."""
import copy
import dataclasses
import json

import pytest

from cupyglm import config_hf
from cupyglm.config import DSA, KDA, ConfigError, ModelConfig, preset


def _raw(name="tiny"):
    return preset(name).to_hf_dict()


def test_round_trip_and_layouts():
    cfg = preset("tiny")
    raw = _raw()
    assert ModelConfig.from_dict(raw) == cfg
    assert raw["model_type"] == "glm5_next" and raw["architectures"] == ["Glm5NextForConditionalGeneration"]
    assert raw["text_config"]["model_type"] == "glm5_next_text"
    assert raw["vision_config"]["model_type"] == "glm5_next_vision"
    # a flat text-only config (the text fields at the top level) is the same text model, no vision tower
    assert ModelConfig.from_dict(raw["text_config"]) == dataclasses.replace(cfg, vision=None)
    no_vision = {k: v for k, v in raw.items() if k != "vision_config"}
    assert ModelConfig.from_dict(no_vision).vision is None


def test_full_preset_facts():
    full = preset("glm-5.3-flash")
    assert full.dsa_layers == tuple(range(3, 45, 4)) and len(full.kda_layers) == 34
    assert full.kv_layers == full.dsa_layers + (45,)
    assert full.dense_limit == 2051 and full.max_pick == 2051
    assert full.max_position_embeddings == 1_048_576 and preset("tiny").max_position_embeddings == 131_072
    text = _raw("glm-5.3-flash")["text_config"]
    assert text["mlp_layer_types"] == ["dense"] * 3 + ["sparse"] * 42
    assert set(text["layer_types"]) == {"linear_attention", "deepseek_sparse_attention"}
    assert text["layer_types"].count("deepseek_sparse_attention") == 11
    tiny = preset("tiny")
    assert tiny.dense_limit == 35 and tiny.dsa_layers == (3, 7) and tiny.page_tokens == 16


# Every field that takes a default when missing, and the full model's value: the released config's.
DEFAULTED = ["index_n_heads", "index_head_dim", "index_topk", "norm_topk_prob", "hc_mult", "hc_sinkhorn_iters",
             "hc_eps", "max_position_embeddings", "qk_rope_head_dim", "n_group", "topk_group", "scoring_func",
             "topk_method", "moe_router_dtype", "hidden_act", "attention_bias", "tie_word_embeddings", "mhc",
             "mla_use_nope", "index_kpool_compress", "index_kpool_always_select_tail", "indexer_types",
             "num_key_value_heads", "qk_head_dim", "first_k_dense_replace"]


def test_missing_fields_take_the_released_values():
    raw = _raw("glm-5.3-flash")
    for field in DEFAULTED:
        del raw["text_config"][field]
    for field in ("num_heads", "head_dim", "short_conv_kernel_size", "gate_lower_bound"):
        del raw["text_config"]["linear_attn_config"][field]
    for field in ("image_size", "in_channels", "attention_bias"):
        del raw["vision_config"][field]
    assert ModelConfig.from_dict(raw) == preset("glm-5.3-flash")


@pytest.mark.parametrize("field", sorted(config_hf.DISPUTED))
def test_disputed_defaults_are_refused(field):
    raw = _raw()
    del raw["text_config"][field]
    if field == "first_k_dense_replace":
        del raw["text_config"]["mlp_layer_types"]
    with pytest.raises(ConfigError, match=f"'text_config.{field}'.*public engines assume different"):
        ModelConfig.from_dict(raw)


def test_layer_types_and_mlp_layer_types():
    raw = _raw()
    text = raw["text_config"]
    legacy = copy.deepcopy(raw)
    legacy["text_config"]["layer_types"] = ["full_attention" if t == DSA else t for t in text["layer_types"]]
    assert ModelConfig.from_dict(legacy) == preset("tiny")           # Hugging Face's legacy name for DSA
    derived = copy.deepcopy(raw)
    del derived["text_config"]["layer_types"]                        # from linear_attn_config.kda_layers
    assert ModelConfig.from_dict(derived) == preset("tiny")
    only_mlp = copy.deepcopy(raw)
    del only_mlp["text_config"]["first_k_dense_replace"]
    assert ModelConfig.from_dict(only_mlp).first_k_dense_replace == 3
    old_key = copy.deepcopy(raw)
    lin = old_key["text_config"]["linear_attn_config"]
    lin["lower_bound"] = lin.pop("gate_lower_bound")
    assert ModelConfig.from_dict(old_key) == preset("tiny")
    eos_top = copy.deepcopy(raw)
    eos_top["eos_token_id"] = eos_top["text_config"].pop("eos_token_id")
    assert ModelConfig.from_dict(eos_top).eos_token_ids == preset("tiny").eos_token_ids
    assert preset("tiny").layer_types[3] == DSA and preset("tiny").layer_types[0] == KDA


@pytest.mark.parametrize("field, value", [
    ("qk_rope_head_dim", 64), ("n_group", 8), ("topk_group", 4), ("scoring_func", "softmax"),
    ("hidden_act", "gelu"), ("tie_word_embeddings", True), ("num_nextn_predict_layers", 2),
    ("hc_mult", 2), ("index_kpool", 8), ("layer_types", ["linear_attention"] * 7 + ["mamba"]),
    ("layer_types", ["linear_attention"] * 3), ("hidden_size", 0), ("cupyglm_page_tokens", 6),
    ("model_type", "glm5"), ("mla_use_nope", False), ("moe_router_dtype", "bfloat16"), ("mhc", False),
    ("topk_method", "greedy"), ("attention_bias", True), ("index_kpool_compress", False),
    ("indexer_types", ["full"] * 7 + ["shared"]), ("swiglu_limit", 0.0), ("qk_head_dim", 96),
    ("mlp_layer_types", ["dense", "sparse", "dense"] + ["sparse"] * 5), ("mlp_layer_types", ["dense"] * 3),
    ("first_k_dense_replace", 2), ("linear_attn_config", {"kda_layers": [0, 1]}),
])
def test_unsupported_values_are_refused_by_field(field, value):
    raw = _raw()
    if field == "linear_attn_config":
        raw["text_config"][field].update(value)
        field = "kda_layers"
    else:
        raw["text_config"][field] = value
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_dict(raw)
    assert field in str(e.value)


@pytest.mark.parametrize("where, field, value", [
    ("top", "model_type", "glm5"), ("top", "tie_word_embeddings", True),
    ("vision_config", "model_type", "glm_ocr_vision"), ("vision_config", "out_hidden_size", 1536),
    ("vision_config", "num_heads", 5),
])
def test_top_level_and_vision_refusals(where, field, value):
    raw = _raw()
    (raw if where == "top" else raw[where])[field] = value
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_dict(raw)


def test_missing_field_and_bad_file(tmp_path):
    raw = _raw()
    del raw["text_config"]["vocab_size"]
    with pytest.raises(ConfigError, match="'text_config.vocab_size'"):
        ModelConfig.from_dict(raw)
    raw = _raw()
    del raw["vision_config"]["depth"]
    with pytest.raises(ConfigError, match="'vision_config.depth'"):
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
    raw["text_config"]["max_position_embeddings"] = 202_752
    assert ModelConfig.from_dict(raw).max_position_embeddings == 202_752
    del raw["text_config"]["max_position_embeddings"]
    assert ModelConfig.from_dict(raw).max_position_embeddings == 1_048_576      # the released value: 1M tokens
    raw["text_config"]["max_position_embeddings"] = 0
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        ModelConfig.from_dict(raw)
