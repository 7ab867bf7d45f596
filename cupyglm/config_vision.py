"""config.json's vision_config (model_type "glm5_next_vision") and the top level's image/video token ids, read
into a VisionConfig and written back.

A missing field takes the value Hugging Face's Glm5NextVisionConfig / Glm5NextConfig assume (written next to the
field); a value the tower does not run is refused with the field named (ConfigError): another activation, another
rotary kind, channels other than RGB, a head width the 2-D rotary cannot split in four, a merger width other
than the text model's, a token id outside the vocabulary.
"""
from __future__ import annotations

import dataclasses

from cupyglm.config import TOKEN_ID_FIELDS, ConfigError, ModelConfig, VisionConfig

VISION_MODEL_TYPE = "glm5_next_vision"
ROPE_TYPE = "axial"                      # 2-D rotary: h and w positions share one frequency table


def read_vision(cfg: ModelConfig, v, top) -> ModelConfig:
    """`cfg` with its tower read from `v` (vision_config's fields) and `top` (the top level's token ids);
    `v` and `top` are config_hf's field readers."""
    v.only("model_type", (VISION_MODEL_TYPE, None))
    v.only("hidden_act", "silu", "silu")
    v.only("in_channels", 3, 3)                                   # the processor gives RGB patches
    rope = _rope(v)
    vision = VisionConfig(
        depth=int(v.need("depth")),
        hidden_size=int(v.need("hidden_size")),
        intermediate_size=int(v.need("intermediate_size")),
        num_heads=int(v.need("num_heads")),
        patch_size=int(v.need("patch_size")),
        temporal_patch_size=int(v.need("temporal_patch_size")),
        spatial_merge_size=int(v.need("spatial_merge_size")),
        out_hidden_size=int(v.need("out_hidden_size")),           # Hugging Face assumes 1536; released 4096
        projection_intermediate_size=int(v.need("projection_intermediate_size")),
        image_size=int(v.get("image_size", 448)),                 # released 448; the processor does not read it
        in_channels=3,
        attention_bias=bool(v.get("attention_bias", True)),       # Hugging Face true
        rms_norm_eps=float(v.get("rms_norm_eps", 1e-5)),          # Hugging Face 1e-5
        swiglu_limit=float(v.get("swiglu_limit", 10.0)),          # Hugging Face 10.0
        rope_theta=float(rope.get("rope_theta", 10000.0)),        # Hugging Face 10000
        **{f: int(top.get(f, getattr(VisionConfig, f))) for f in TOKEN_ID_FIELDS},
    )
    _check(vision, cfg, v, top)
    return dataclasses.replace(cfg, vision=vision)


def _rope(v) -> dict:
    rope = v.get("rope_parameters", None) or v.get("rope_scaling", None) or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"config.json: {v.name('rope_parameters')} is not a JSON object")
    kind = rope.get("rope_type", rope.get("type", ROPE_TYPE))
    if kind != ROPE_TYPE:
        raise ConfigError(f"config.json: unsupported {v.name('rope_parameters')}.rope_type={kind!r} "
                          f"(supported: {ROPE_TYPE!r}, the 2-D rotary over the image's patches)")
    return rope


def _check(vision: VisionConfig, cfg: ModelConfig, v, top) -> None:
    for field in ("depth", "hidden_size", "intermediate_size", "num_heads", "patch_size", "temporal_patch_size",
                  "spatial_merge_size", "projection_intermediate_size"):
        if getattr(vision, field) <= 0:
            raise ConfigError(f"config.json: {v.name(field)} must be positive")
    if vision.hidden_size % vision.num_heads or vision.head_dim % 4:
        raise ConfigError(f"config.json: unsupported {v.name('num_heads')}={vision.num_heads}: hidden_size "
                          f"{vision.hidden_size} must split into heads of a multiple of 4 (h and w rotary halves)")
    if vision.out_hidden_size != cfg.hidden_size:
        raise ConfigError(f"config.json: {v.name('out_hidden_size')}={vision.out_hidden_size} must equal the "
                          f"text hidden_size {cfg.hidden_size}")
    if not vision.swiglu_limit > 0:
        raise ConfigError(f"config.json: unsupported {v.name('swiglu_limit')}: must be positive (the clamp is "
                          "part of the tower)")
    ids = vision.token_ids
    for field, tid in ids.items():
        if not 0 <= tid < cfg.vocab_size:
            raise ConfigError(f"config.json: {top.name(field)}={tid} lies outside the vocabulary "
                              f"(vocab_size {cfg.vocab_size})")
    if len(set(ids.values())) != len(ids):
        raise ConfigError("config.json: the image and video token ids (" + ", ".join(TOKEN_ID_FIELDS) +
                          ") must be distinct")


def vision_dict(v: VisionConfig) -> dict:
    """vision_config's body in the published layout (read_vision reads it back)."""
    return {
        "model_type": VISION_MODEL_TYPE, "depth": v.depth, "hidden_size": v.hidden_size,
        "intermediate_size": v.intermediate_size, "num_heads": v.num_heads, "image_size": v.image_size,
        "patch_size": v.patch_size, "temporal_patch_size": v.temporal_patch_size,
        "spatial_merge_size": v.spatial_merge_size, "out_hidden_size": v.out_hidden_size,
        "projection_intermediate_size": v.projection_intermediate_size, "in_channels": v.in_channels,
        "attention_bias": v.attention_bias, "hidden_act": "silu", "rms_norm_eps": v.rms_norm_eps,
        "swiglu_limit": v.swiglu_limit, "rope_parameters": {"rope_type": ROPE_TYPE, "rope_theta": v.rope_theta},
    }
