"""ModelConfig: the model's shape, read from a Hugging Face config.json (or its text_config), frozen.

Unsupported values are refused with the field named (ConfigError).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path


class ConfigError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]          # per main layer: "linear_attention" (KDA) or "full_attention" (DSA)
    first_k_dense_replace: int            # layers below this use the dense MLP, the rest MoE
    vocab_size: int
    num_attention_heads: int              # DSA heads
    q_lora_rank: int
    kv_lora_rank: int                     # latent row width; keys equal values
    qk_nope_head_dim: int
    v_head_dim: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int                       # tokens picked (index_topk // index_kpool pools)
    index_kpool: int
    kda_num_heads: int
    kda_head_dim: int
    kda_conv_size: int
    kda_gate_lower_bound: float
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    moe_intermediate_size: int
    intermediate_size: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    swiglu_limit: float
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    num_nextn_predict_layers: int
    rms_norm_eps: float
    eos_token_ids: tuple[int, ...]
    attn_chunk: int = 512                 # keys per online-softmax chunk (cupyglm_attn_chunk; tiny uses less)
    keep_grid: int = 2048                 # prompt-cache keep points (cupyglm_keep_grid)
    page_tokens: int = 512                # default KV page size (cupyglm_page_tokens)
    max_position_embeddings: int = 1048576  # the model's own maximum context (tokens); no window exceeds it

    # ---- derived facts the model code uses -------------------------------------------------------
    @property
    def dsa_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t != "linear_attention")

    @property
    def kda_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def mtp_layer(self) -> int | None:
        return self.num_hidden_layers if self.num_nextn_predict_layers else None

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """Layers that own KV pages: every DSA layer, then the MTP layer."""
        mtp = () if self.mtp_layer is None else (self.mtp_layer,)
        return self.dsa_layers + mtp

    @property
    def index_pools(self) -> int:
        return self.index_topk // self.index_kpool

    @property
    def dense_limit(self) -> int:
        """First position whose attention is sparse: visible pools exceed index_pools."""
        return (self.index_pools + 1) * self.index_kpool - 1

    @property
    def max_pick(self) -> int:
        """Length of a token list: picked pools' tokens plus up to kpool - 1 tail tokens."""
        return self.index_topk + self.index_kpool - 1

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace

    def identity(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    # ---- reading ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        text = raw.get("text_config") or raw
        return _parse(text)

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: missing config.json") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(raw)

    def to_hf_dict(self) -> dict:
        """A config.json body that from_dict reads back to this config."""
        return {
            "architectures": ["Glm5ForCausalLM"],
            "model_type": "glm5",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": list(self.layer_types),
            "first_k_dense_replace": self.first_k_dense_replace,
            "vocab_size": self.vocab_size,
            "num_attention_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": 0,
            "v_head_dim": self.v_head_dim,
            "index_n_heads": self.index_n_heads,
            "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk,
            "index_kpool": self.index_kpool,
            "linear_attn_config": {
                "num_heads": self.kda_num_heads,
                "head_dim": self.kda_head_dim,
                "short_conv_kernel_size": self.kda_conv_size,
                "gate_lower_bound": self.kda_gate_lower_bound,
            },
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "n_shared_experts": self.n_shared_experts,
            "n_group": 1,
            "topk_group": 1,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "moe_intermediate_size": self.moe_intermediate_size,
            "intermediate_size": self.intermediate_size,
            "routed_scaling_factor": self.routed_scaling_factor,
            "norm_topk_prob": self.norm_topk_prob,
            "swiglu_limit": self.swiglu_limit,
            "hc_mult": self.hc_mult,
            "hc_sinkhorn_iters": self.hc_sinkhorn_iters,
            "hc_eps": self.hc_eps,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "rms_norm_eps": self.rms_norm_eps,
            "eos_token_id": list(self.eos_token_ids),
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "cupyglm_attn_chunk": self.attn_chunk,
            "cupyglm_keep_grid": self.keep_grid,
            "cupyglm_page_tokens": self.page_tokens,
            "max_position_embeddings": self.max_position_embeddings,
        }


def _parse(c: dict) -> ModelConfig:
    def need(name):
        if name not in c:
            raise ConfigError(f"config.json: missing field {name!r}")
        return c[name]

    def refuse_unless(name, ok, default=None):
        value = c.get(name, default)
        if value is not None and not ok(value):
            raise ConfigError(f"config.json: unsupported {name}={value!r}")

    refuse_unless("qk_rope_head_dim", lambda v: v == 0, 0)
    refuse_unless("n_group", lambda v: v == 1, 1)
    refuse_unless("topk_group", lambda v: v == 1, 1)
    refuse_unless("scoring_func", lambda v: v == "sigmoid", "sigmoid")
    refuse_unless("hidden_act", lambda v: v == "silu", "silu")
    refuse_unless("tie_word_embeddings", lambda v: v is False, False)
    refuse_unless("num_nextn_predict_layers", lambda v: v in (0, 1), 1)

    layers = int(need("num_hidden_layers"))
    types = c.get("layer_types")
    if types is None:
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
    types = tuple(types)
    if len(types) != layers:
        raise ConfigError(f"config.json: layer_types has {len(types)} entries for num_hidden_layers={layers}")
    for t in types:
        if t not in ("linear_attention", "full_attention", "sparse_attention"):
            raise ConfigError(f"config.json: unknown layer type {t!r} in layer_types")

    first_dense = c.get("first_k_dense_replace")
    mlp_types = c.get("mlp_layer_types")
    if first_dense is None and mlp_types is not None:
        first_dense = next((i for i, t in enumerate(mlp_types) if t != "dense"), layers)
    if first_dense is None:
        raise ConfigError("config.json: missing field 'first_k_dense_replace' (or 'mlp_layer_types')")

    lin = need("linear_attn_config")
    eos = c.get("eos_token_id", [])
    eos = tuple(eos) if isinstance(eos, list) else (eos,)

    cfg = ModelConfig(
        hidden_size=int(need("hidden_size")),
        num_hidden_layers=layers,
        layer_types=types,
        first_k_dense_replace=int(first_dense),
        vocab_size=int(need("vocab_size")),
        num_attention_heads=int(need("num_attention_heads")),
        q_lora_rank=int(need("q_lora_rank")),
        kv_lora_rank=int(need("kv_lora_rank")),
        qk_nope_head_dim=int(need("qk_nope_head_dim")),
        v_head_dim=int(need("v_head_dim")),
        index_n_heads=int(need("index_n_heads")),
        index_head_dim=int(need("index_head_dim")),
        index_topk=int(need("index_topk")),
        index_kpool=int(c.get("index_kpool", 4)),
        kda_num_heads=int(lin.get("num_heads")),
        kda_head_dim=int(lin.get("head_dim")),
        kda_conv_size=int(lin.get("short_conv_kernel_size", 4)),
        kda_gate_lower_bound=float(lin.get("gate_lower_bound", -5.0)),
        n_routed_experts=int(need("n_routed_experts")),
        num_experts_per_tok=int(need("num_experts_per_tok")),
        n_shared_experts=int(c.get("n_shared_experts", 1)),
        moe_intermediate_size=int(need("moe_intermediate_size")),
        intermediate_size=int(need("intermediate_size")),
        routed_scaling_factor=float(c.get("routed_scaling_factor", 1.0)),
        norm_topk_prob=bool(c.get("norm_topk_prob", True)),
        swiglu_limit=float(c.get("swiglu_limit", 10.0)),
        hc_mult=int(c.get("hc_mult", 4)),
        hc_sinkhorn_iters=int(c.get("hc_sinkhorn_iters", 20)),
        hc_eps=float(c.get("hc_eps", 1e-6)),
        num_nextn_predict_layers=int(c.get("num_nextn_predict_layers", 1)),
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-5)),
        eos_token_ids=tuple(int(e) for e in eos),
        attn_chunk=int(c.get("cupyglm_attn_chunk", 512)),
        keep_grid=int(c.get("cupyglm_keep_grid", 2048)),
        page_tokens=int(c.get("cupyglm_page_tokens", 512)),
        max_position_embeddings=int(c.get("max_position_embeddings", 1048576)),
    )
    _check(cfg)
    return cfg


def _check(cfg: ModelConfig) -> None:
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
        ("max_position_embeddings", cfg.max_position_embeddings > 0, "must be positive"),
    ]
    for field, ok, why in checks:
        if not ok:
            raise ConfigError(f"config.json: unsupported {field}: {why}")
    for name in ("hidden_size", "vocab_size", "num_attention_heads", "kv_lora_rank", "index_n_heads",
                 "index_head_dim", "kda_num_heads", "kda_head_dim", "n_routed_experts", "moe_intermediate_size",
                 "intermediate_size", "q_lora_rank"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"config.json: {name} must be positive")


def _layer_types(n: int) -> tuple[str, ...]:
    return tuple("full_attention" if i % 4 == 3 else "linear_attention" for i in range(n))


PRESETS: dict[str, ModelConfig] = {
    "glm-5.3-flash": ModelConfig(
        hidden_size=4096, num_hidden_layers=45, layer_types=_layer_types(45), first_k_dense_replace=3,
        vocab_size=154880, num_attention_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=256,
        v_head_dim=256, index_n_heads=32, index_head_dim=128, index_topk=2048, index_kpool=4,
        kda_num_heads=64, kda_head_dim=128, kda_conv_size=4, kda_gate_lower_bound=-5.0,
        n_routed_experts=288, num_experts_per_tok=8, n_shared_experts=1, moe_intermediate_size=2048,
        intermediate_size=12288, routed_scaling_factor=2.5, norm_topk_prob=True, swiglu_limit=10.0,
        hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, num_nextn_predict_layers=1, rms_norm_eps=1e-5,
        eos_token_ids=(154820, 154827, 154829)),
    # Same structure at sizes that reach every path at short contexts: sparse from position 35,
    # 16-token pages, a 64-token keep grid, attention chunks of 32 keys.
    "tiny": ModelConfig(
        hidden_size=256, num_hidden_layers=8, layer_types=_layer_types(8), first_k_dense_replace=3,
        vocab_size=512, num_attention_heads=4, q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32,
        v_head_dim=32, index_n_heads=4, index_head_dim=32, index_topk=32, index_kpool=4,
        kda_num_heads=4, kda_head_dim=32, kda_conv_size=4, kda_gate_lower_bound=-5.0,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=64,
        intermediate_size=256, routed_scaling_factor=2.5, norm_topk_prob=True, swiglu_limit=10.0,
        hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, num_nextn_predict_layers=1, rms_norm_eps=1e-5,
        eos_token_ids=(496, 503, 505), attn_chunk=32, keep_grid=64, page_tokens=16,
        max_position_embeddings=131072),
}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown config preset {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[name]
