"""The vision tower's numpy reference on the tiny checkpoint (shape, determinism, one image's rows independent of
another's), its 2-D rotary, vision_config's refusals by field, and the tiny checkpoint complete for images
(token ids inside the vocabulary, pad_token_id, image tokens, preprocessor_config.json; transformers loads it)."""
from __future__ import annotations

import copy
import io

import numpy as np
import pytest
from PIL import Image

from cupyglm.backend.erf_f32 import gelu_f32
from cupyglm.checkpoint.vision_weights import vision_weights
from cupyglm.config import ConfigError, ModelConfig, preset
from cupyglm.vision import rotary
from cupyglm.vision.processor import ProcessorConfig, process_bytes
from cupyglm.vision.tower import VisionTower


def _png(h: int, w: int, seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def tower(tiny_ckpt):
    return VisionTower(tiny_ckpt.config.vision, vision_weights(tiny_ckpt))


@pytest.fixture(scope="module")
def proc(tiny_dir, tiny_ckpt):
    cfg = ProcessorConfig.from_dir(tiny_dir)
    cfg.check_tower(tiny_ckpt.config.vision)
    return cfg


def test_rows_have_the_text_width_and_are_deterministic(tower, proc):
    img = process_bytes(_png(112, 150, 0), proc)
    a, b = tower.encode(img.pixel_values, img.grid), tower.encode(img.pixel_values.copy(), img.grid)
    assert img.grid == (1, 8, 12) and a.shape == (img.n_tokens, 256) == (24, 256)
    assert a.dtype == np.dtype("bfloat16") and np.isfinite(a.astype(np.float32)).all()
    assert a.tobytes() == b.tobytes()
    assert float(np.abs(a.astype(np.float32)).std()) > 0.01          # not a constant row


def test_an_image_rows_depend_on_that_image_only(tower, proc):
    one, two = process_bytes(_png(112, 112, 1), proc), process_bytes(_png(112, 112, 2), proc)
    a = tower.encode(one.pixel_values, one.grid)
    tower.encode(two.pixel_values, two.grid)
    assert tower.encode(one.pixel_values, one.grid).tobytes() == a.tobytes()
    assert a.tobytes() != tower.encode(two.pixel_values, two.grid).tobytes()


def test_the_tower_refuses_a_mismatched_grid_and_missing_tensors(tower, tiny_ckpt, proc):
    img = process_bytes(_png(112, 112, 0), proc)
    with pytest.raises(ValueError, match="do not match grid"):
        tower.encode(img.pixel_values, (1, 4, 8 * 2 + 1))
    weights = dict(vision_weights(tiny_ckpt))
    del weights["blocks.1.attn.q_norm.weight"]
    with pytest.raises(ValueError, match="model.visual.blocks.1.attn.q_norm.weight"):
        VisionTower(tiny_ckpt.config.vision, weights)


def test_patch_positions_follow_the_merge_blocks():
    pos = rotary.patch_positions(4, 4, 2)
    assert pos[:8].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3]]
    with pytest.raises(ValueError, match="2x2 blocks"):
        rotary.patch_positions(3, 4, 2)


def test_rotary_tables_rotate_h_then_w_over_the_whole_head():
    cos, sin = rotary.cos_sin(np.array([[0, 0], [3, 5]], np.int32), 16, 10000.0)
    inv = rotary.inv_freq(16, 10000.0)
    assert inv.shape == (4,) and inv[0] == 1.0
    assert np.array_equal(cos[0], np.ones(16, np.float32)) and np.array_equal(sin[0], np.zeros(16, np.float32))
    want = np.concatenate([3 * inv, 5 * inv, 3 * inv, 5 * inv]).astype(np.float32)
    assert np.array_equal(cos[1], np.cos(want)) and np.array_equal(sin[1], np.sin(want))
    x = np.random.default_rng(0).standard_normal((2, 1, 16)).astype(np.float32)
    y = rotary.rotate(x, cos, sin)
    assert np.array_equal(y[0], x[0])                                     # position (0, 0): no turn
    assert np.allclose(np.linalg.norm(y[1]), np.linalg.norm(x[1]), rtol=1e-6)   # a rotation keeps the norm


def test_gelu_is_the_exact_erf_form():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0], np.float32)
    assert np.allclose(gelu_f32(x), [-0.0040497, -0.1586553, 0.0, 0.3457312, 1.9544997], atol=1e-6)


# ---- vision_config and the tiny checkpoint ----------------------------------------------------------------
def _raw() -> dict:
    return copy.deepcopy(preset("tiny").to_hf_dict())


def test_vision_config_round_trips_with_token_ids_and_pad():
    cfg = ModelConfig.from_dict(_raw())
    assert cfg == preset("tiny") and cfg.vision.token_ids["image_token_id"] == 492 and cfg.pad_token_id == 496
    raw = _raw()
    for f in ("rms_norm_eps", "swiglu_limit", "rope_parameters"):
        del raw["vision_config"][f]
    for f in cfg.vision.token_ids:
        del raw[f]
    v = ModelConfig.from_dict({**raw, "text_config": {**raw["text_config"], "vocab_size": 154880}}).vision
    assert (v.rms_norm_eps, v.swiglu_limit, v.rope_theta, v.image_token_id) == (1e-5, 10.0, 10000.0, 154854)


@pytest.mark.parametrize("where, field, value, match", [
    ("vision_config", "hidden_act", "gelu", "vision_config.hidden_act"),
    ("vision_config", "in_channels", 1, "vision_config.in_channels"),
    ("vision_config", "rope_parameters", {"rope_type": "default"}, "vision_config.rope_parameters.rope_type"),
    ("vision_config", "num_heads", 32, "vision_config.num_heads"),            # head width 2: no h/w halves
    ("vision_config", "swiglu_limit", 0, "vision_config.swiglu_limit"),
    ("vision_config", "depth", 0, "vision_config.depth"),
    ("top", "image_token_id", 154854, "image_token_id=154854 lies outside the vocabulary"),
    ("top", "video_token_id", 492, "must be distinct"),
    ("text_config", "pad_token_id", 512, "pad_token_id"),
])
def test_vision_refusals_name_the_field(where, field, value, match):
    raw = _raw()
    (raw if where == "top" else raw[where])[field] = value
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict(raw)


def test_the_tiny_checkpoint_is_complete_for_images(tiny_dir, tiny_ckpt):
    import tokenizers

    from cupyglm.checkpoint.tiny_tokenizer import vision_token_ids

    tok = tokenizers.Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    cfg = tiny_ckpt.config
    assert vision_token_ids(tok) == cfg.vision.token_ids
    assert all(0 <= i < cfg.vocab_size for i in cfg.vision.token_ids.values())
    assert tok.id_to_token(cfg.pad_token_id) == "<|endoftext|>"
    assert tok.encode("<|begin_of_image|><|image|><|image|><|end_of_image|>").ids == [506, 492, 492, 507]
    assert (tiny_dir / "preprocessor_config.json").is_file()


def test_transformers_loads_the_tiny_config_tokenizer_and_processor(tiny_dir):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Glm5NextConfig.from_pretrained(tiny_dir)
    assert cfg.text_config.pad_token_id == 496 and cfg.text_config.vocab_size == 512
    assert (cfg.image_token_id, cfg.image_start_token_id, cfg.image_end_token_id) == (492, 506, 507)
    assert cfg.vision_config.out_hidden_size == cfg.text_config.hidden_size
    from transformers.models.glm5_next.image_processing_pil_glm5_next import Glm5NextImageProcessorPil

    proc = Glm5NextImageProcessorPil.from_pretrained(tiny_dir)
    assert (proc.min_image_tokens, proc.max_image_tokens, proc.merge_size) == (16, 64, 2)
    tok = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    text = tok.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "[gMASK]<sop><|user|>\n<|begin_of_image|><|image|><|end_of_image|>hi<|assistant|>"
