"""config.json as the published GLM-5.3-Flash checkpoint lays it out, read into a ModelConfig and written back.

Layout: the top level (model_type "glm5_next") holds `text_config` (model_type "glm5_next_text") and
`vision_config` (model_type "glm5_next_vision"); a flat text-only config (the text fields at the top level) is
read too. A missing field takes the value the released config has, written next to the field below; where the
public engines assume different values for a missing field, it is refused instead (DISPUTED), so no reader's
guess silently changes the numbers. Every refusal names the field (ConfigError).
"""
from __future__ import annotations

from cupyglm.config import DSA, KDA, ConfigError, ModelConfig
from cupyglm.config_vision import read_vision, vision_dict

TOP_MODEL_TYPE = "glm5_next"
TEXT_MODEL_TYPE = "glm5_next_text"
ARCHITECTURE = "Glm5NextForConditionalGeneration"
LAYER_TYPE_ALIASES = {"full_attention": DSA}      # the legacy name Hugging Face reads as a DSA layer
MLP_DENSE, MLP_SPARSE = "dense", "sparse"         # mlp_layer_types values

# Fields with no safe default: the public engines assume different values when they are missing.
DISPUTED = {
    "swiglu_limit": "Hugging Face assumes 10.0, TensorFold's MLX engine 0 (no clamp); the released config has 10.0",
    "n_shared_experts": "Hugging Face assumes 1, TensorFold's MLX engine 0; the released config has 1",
    "num_nextn_predict_layers": "Hugging Face has no such field, TensorFold assumes 0; the released config has 1",
    "routed_scaling_factor": "Hugging Face assumes 2.5, TensorFold requires it; the released config has 2.5",
    "rms_norm_eps": "Hugging Face assumes 1e-5, TensorFold requires it; the released config has 1e-5",
    "index_kpool": "Hugging Face assumes 16, TensorFold 4; the released config has 4",
    "first_k_dense_replace": "with no mlp_layer_types either: Hugging Face assumes 3 dense layers, TensorFold's "
                             "MLX engine 0; the released config has 3",
}


class _Fields:
    """One config object's fields: required, defaulted (the released value), disputed, or held to one value."""

    def __init__(self, raw, where: str):
        if not isinstance(raw, dict):
            raise ConfigError(f"config.json: {where or 'the top level'} is not a JSON object")
        self.raw, self.where = raw, where

    def name(self, field: str) -> str:
        return f"{self.where}.{field}" if self.where else field

    def need(self, field: str):
        if field not in self.raw:
            raise ConfigError(f"config.json: missing field {self.name(field)!r}")
        return self.raw[field]

    def get(self, field: str, default):
        return self.raw.get(field, default)

    def disputed(self, field: str):
        if field not in self.raw:
            raise ConfigError(f"config.json: missing field {self.name(field)!r}: public engines assume different "
                              f"values ({DISPUTED[field]}); set it explicitly")
        return self.raw[field]

    def only(self, field: str, allowed, default=None) -> None:
        """A field the code supports at one value (or a few): absent, it is taken as `default`."""
        value = self.raw.get(field, default)
        ok = value in allowed if isinstance(allowed, tuple) else value == allowed
        if not ok:
            raise ConfigError(f"config.json: unsupported {self.name(field)}={value!r} (supported: {allowed!r})")


def from_dict(raw: dict) -> ModelConfig:
    top = _Fields(raw, "")
    if "text_config" in raw:
        top.only("model_type", (TOP_MODEL_TYPE, None))
        top.only("tie_word_embeddings", False, False)
        text = _Fields(raw["text_config"], "text_config")
        text.only("model_type", (TEXT_MODEL_TYPE, None))
        vision = raw.get("vision_config")
    else:
        text = top
        text.only("model_type", (TEXT_MODEL_TYPE, None))
        vision = None
    cfg = _text(text, top)
    if vision is not None:
        cfg = read_vision(cfg, _Fields(vision, "vision_config"), top)
    check(cfg)
    return cfg


def _text(c: _Fields, top: _Fields) -> ModelConfig:
    _fixed_text_fields(c)
    layers = int(c.need("num_hidden_layers"))
    lin = _Fields(c.need("linear_attn_config"), c.name("linear_attn_config"))
    types = _layer_types(c, lin, layers)
    first_dense = _first_dense(c, layers)
    indexer_types = c.get("indexer_types", None)                 # released: every layer "full" (its own indexer)
    if indexer_types is not None and any(t != "full" for t in indexer_types):
        raise ConfigError(f"config.json: unsupported {c.name('indexer_types')}: only 'full' (every DSA layer "
                          "with its own indexer) is supported")
    heads = int(c.need("num_attention_heads"))
    nope, rope = int(c.need("qk_nope_head_dim")), int(c.get("qk_rope_head_dim", 0))
    c.only("num_key_value_heads", (heads, None))
    c.only("qk_head_dim", (nope + rope, None))
    if "gate_lower_bound" not in lin.raw and "lower_bound" in lin.raw:
        lower = lin.raw["lower_bound"]                            # the key older Hugging Face configs use
    else:
        lower = lin.get("gate_lower_bound", -5.0)                 # released -5.0
    eos = c.get("eos_token_id", top.get("eos_token_id", []))     # text_config first, then the top level
    eos = tuple(eos) if isinstance(eos, list) else (eos,)
    pad = c.get("pad_token_id", top.get("pad_token_id", None))   # text_config first, then the top level

    return ModelConfig(
        hidden_size=int(c.need("hidden_size")),
        num_hidden_layers=layers,
        layer_types=types,
        first_k_dense_replace=first_dense,
        vocab_size=int(c.need("vocab_size")),
        num_attention_heads=heads,
        q_lora_rank=int(c.need("q_lora_rank")),
        kv_lora_rank=int(c.need("kv_lora_rank")),
        qk_nope_head_dim=nope,
        v_head_dim=int(c.need("v_head_dim")),
        index_n_heads=int(c.get("index_n_heads", 32)),            # released 32
        index_head_dim=int(c.get("index_head_dim", 128)),         # released 128
        index_topk=int(c.get("index_topk", 2048)),                # released 2048
        index_kpool=int(c.disputed("index_kpool")),
        kda_num_heads=int(lin.get("num_heads", 64)),              # released 64
        kda_head_dim=int(lin.get("head_dim", 128)),               # released 128
        kda_conv_size=int(lin.get("short_conv_kernel_size", 4)),  # released 4
        kda_gate_lower_bound=float(lower),
        n_routed_experts=int(c.need("n_routed_experts")),
        num_experts_per_tok=int(c.need("num_experts_per_tok")),
        n_shared_experts=int(c.disputed("n_shared_experts")),
        moe_intermediate_size=int(c.need("moe_intermediate_size")),
        intermediate_size=int(c.need("intermediate_size")),
        routed_scaling_factor=float(c.disputed("routed_scaling_factor")),
        norm_topk_prob=bool(c.get("norm_topk_prob", True)),       # released true
        swiglu_limit=float(c.disputed("swiglu_limit")),
        hc_mult=int(c.get("hc_mult", 4)),                         # released 4
        hc_sinkhorn_iters=int(c.get("hc_sinkhorn_iters", 20)),    # released 20
        hc_eps=float(c.get("hc_eps", 1e-6)),                      # released 1e-6
        num_nextn_predict_layers=int(c.disputed("num_nextn_predict_layers")),
        rms_norm_eps=float(c.disputed("rms_norm_eps")),
        eos_token_ids=tuple(int(e) for e in eos),
        attn_chunk=int(c.get("cupyglm_attn_chunk", 512)),
        keep_grid=int(c.get("cupyglm_keep_grid", 2048)),
        page_tokens=int(c.get("cupyglm_page_tokens", 512)),
        max_position_embeddings=int(c.get("max_position_embeddings", 1_048_576)),   # released 1,048,576
        pad_token_id=None if pad is None else int(pad),
    )


def _fixed_text_fields(c: _Fields) -> None:
    """The text fields the code supports at one value (the released one, taken when absent)."""
    c.only("qk_rope_head_dim", 0, 0)              # NoPE MLA: no rope anywhere
    c.only("mla_use_nope", True, True)
    c.only("n_group", 1, 1)
    c.only("topk_group", 1, 1)
    c.only("scoring_func", "sigmoid", "sigmoid")
    c.only("topk_method", "noaux_tc", "noaux_tc")
    c.only("moe_router_dtype", "float32", "float32")
    c.only("hidden_act", "silu", "silu")
    c.only("attention_bias", False, False)
    c.only("tie_word_embeddings", False, False)
    c.only("mhc", True, True)                     # hyper-connections on
    c.only("index_kpool_compress", True, True)
    c.only("index_kpool_always_select_tail", True, True)
    c.only("num_nextn_predict_layers", (0, 1), 1)


def _layer_types(c: _Fields, lin: _Fields, layers: int) -> tuple[str, ...]:
    """layer_types (main layers only; the MTP layer is not listed), else linear_attn_config's kda_layers."""
    types = c.get("layer_types", None)
    kda = lin.get("kda_layers", None)
    if types is None:
        if kda is None:
            raise ConfigError(f"config.json: missing field {c.name('layer_types')!r} "
                              f"(and no {lin.name('kda_layers')!r} to derive it from)")
        types = [KDA if i in set(kda) else DSA for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        n = len(types) if isinstance(types, list) else "no list of"
        raise ConfigError(f"config.json: {c.name('layer_types')} has {n} entries for num_hidden_layers={layers}")
    types = tuple(LAYER_TYPE_ALIASES.get(t, t) for t in types)
    for t in types:
        if t not in (KDA, DSA):
            raise ConfigError(f"config.json: unknown layer type {t!r} in {c.name('layer_types')}")
    for field, kind in (("kda_layers", KDA), ("full_attn_layers", DSA)):
        listed = lin.get(field, None)
        if listed is not None and sorted(listed) != [i for i, t in enumerate(types) if t == kind]:
            raise ConfigError(f"config.json: {lin.name(field)} disagrees with {c.name('layer_types')}")
    return types


def _first_dense(c: _Fields, layers: int) -> int:
    """first_k_dense_replace, checked against mlp_layer_types (dense layers first, then sparse) when both exist."""
    first = c.get("first_k_dense_replace", None)
    mlp = c.get("mlp_layer_types", None)
    if mlp is not None:
        if not isinstance(mlp, list) or len(mlp) != layers or any(t not in (MLP_DENSE, MLP_SPARSE) for t in mlp):
            raise ConfigError(f"config.json: {c.name('mlp_layer_types')} must list {layers} entries of "
                              f"{MLP_DENSE!r} / {MLP_SPARSE!r}")
        k = next((i for i, t in enumerate(mlp) if t != MLP_DENSE), layers)
        if any(t != MLP_SPARSE for t in mlp[k:]):
            raise ConfigError(f"config.json: unsupported {c.name('mlp_layer_types')}: dense layers must come first")
        if first is not None and int(first) != k:
            raise ConfigError(f"config.json: {c.name('first_k_dense_replace')}={first} disagrees with "
                              f"{c.name('mlp_layer_types')} ({k} dense layers)")
        return k
    return int(c.disputed("first_k_dense_replace"))


def check(cfg: ModelConfig) -> None:
    checks = [
        ("hc_mult", cfg.hc_mult == 4, "only 4 hyper-connection streams are supported"),
        ("n_shared_experts", cfg.n_shared_experts == 1, "exactly one shared expert is supported"),
        ("linear_attn_config.short_conv_kernel_size", cfg.kda_conv_size == 4, "only a 4-tap short conv is supported"),
        ("index_kpool", cfg.index_kpool == 4, "only pools of 4 tokens are supported"),
        ("index_topk", cfg.index_topk % cfg.index_kpool == 0, "must be a multiple of index_kpool"),
        ("num_experts_per_tok", 0 < cfg.num_experts_per_tok <= cfg.n_routed_experts, "must be in 1..n_routed_experts"),
        ("qk_nope_head_dim", cfg.qk_nope_head_dim == cfg.v_head_dim, "must equal v_head_dim"),
        ("cupyglm_page_tokens", cfg.page_tokens > 0 and cfg.page_tokens % 4 == 0, "must be a positive multiple of 4"),
        ("cupyglm_attn_chunk", cfg.attn_chunk > 0, "must be positive"),
        ("first_k_dense_replace", 0 <= cfg.first_k_dense_replace <= cfg.num_hidden_layers, "out of range"),
        ("swiglu_limit", cfg.swiglu_limit > 0, "must be positive (the clamp is part of the model)"),
        ("max_position_embeddings", cfg.max_position_embeddings > 0, "must be positive"),
    ]
    if cfg.pad_token_id is not None:
        checks.append(("text_config.pad_token_id", 0 <= cfg.pad_token_id < cfg.vocab_size,
                       f"{cfg.pad_token_id} lies outside the vocabulary (vocab_size {cfg.vocab_size})"))
    for field, ok, why in checks:
        if not ok:
            raise ConfigError(f"config.json: unsupported {field}: {why}")
    for name in ("hidden_size", "vocab_size", "num_attention_heads", "kv_lora_rank", "index_n_heads",
                 "index_head_dim", "kda_num_heads", "kda_head_dim", "n_routed_experts", "moe_intermediate_size",
                 "intermediate_size", "q_lora_rank"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"config.json: {name} must be positive")


def to_dict(cfg: ModelConfig) -> dict:
    """The config.json body of `cfg` in the published layout (from_dict reads it back to `cfg`)."""
    n = cfg.num_hidden_layers
    text = {
        "model_type": TEXT_MODEL_TYPE,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": n,
        "layer_types": list(cfg.layer_types),
        "first_k_dense_replace": cfg.first_k_dense_replace,
        "mlp_layer_types": [MLP_DENSE if i < cfg.first_k_dense_replace else MLP_SPARSE for i in range(n)],
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads,
        "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": 0,
        "qk_head_dim": cfg.qk_nope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "mla_use_nope": True,
        "attention_bias": False,
        "index_n_heads": cfg.index_n_heads,
        "index_head_dim": cfg.index_head_dim,
        "index_topk": cfg.index_topk,
        "index_kpool": cfg.index_kpool,
        "index_kpool_compress": True,
        "index_kpool_always_select_tail": True,
        "indexer_types": ["full"] * n,
        "linear_attn_config": _linear_attn_dict(cfg),
        "n_routed_experts": cfg.n_routed_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "n_shared_experts": cfg.n_shared_experts,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "moe_router_dtype": "float32",
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "intermediate_size": cfg.intermediate_size,
        "routed_scaling_factor": cfg.routed_scaling_factor,
        "norm_topk_prob": cfg.norm_topk_prob,
        "swiglu_limit": cfg.swiglu_limit,
        "mhc": True,
        "hc_mult": cfg.hc_mult,
        "hc_sinkhorn_iters": cfg.hc_sinkhorn_iters,
        "hc_eps": cfg.hc_eps,
        "num_nextn_predict_layers": cfg.num_nextn_predict_layers,
        "rms_norm_eps": cfg.rms_norm_eps,
        "eos_token_id": list(cfg.eos_token_ids),
        **({} if cfg.pad_token_id is None else {"pad_token_id": cfg.pad_token_id}),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "cupyglm_attn_chunk": cfg.attn_chunk,
        "cupyglm_keep_grid": cfg.keep_grid,
        "cupyglm_page_tokens": cfg.page_tokens,
    }
    out = {"architectures": [ARCHITECTURE], "model_type": TOP_MODEL_TYPE, "text_config": text}
    if cfg.vision is not None:
        out["vision_config"] = vision_dict(cfg.vision)
        out.update(cfg.vision.token_ids)
    out.update({"tie_word_embeddings": False, "dtype": "bfloat16"})
    return out


def _linear_attn_dict(cfg: ModelConfig) -> dict:
    return {
        "num_heads": cfg.kda_num_heads,
        "head_dim": cfg.kda_head_dim,
        "short_conv_kernel_size": cfg.kda_conv_size,
        "gate_lower_bound": cfg.kda_gate_lower_bound,
        "kda_layers": list(cfg.kda_layers),
        "full_attn_layers": list(cfg.dsa_layers),
    }
