"""ModelConfig: the model's shape (its text model, and the vision tower's beside it), frozen.

Read from and written to config.json as the published checkpoint lays it out in `cupyglm.config_hf`
(text_config and vision_config under the top level); unsupported values are refused with the field named
(ConfigError).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path


class ConfigError(ValueError):
    pass


KDA = "linear_attention"                  # layer_types value of a KDA layer
DSA = "deepseek_sparse_attention"         # layer_types value of a DSA layer


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """The vision tower's shape (vision_config) and the image token ids (the top level's): read by
    `cupyglm.config_vision`, run by `cupyglm.vision`."""
    depth: int                            # pre-norm blocks
    hidden_size: int
    intermediate_size: int                # block SwiGLU width
    num_heads: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int               # m x m neighbouring patches projected into one text-width row
    out_hidden_size: int                  # the merger's width: equals the text hidden_size
    projection_intermediate_size: int     # the merger's SwiGLU width
    image_size: int = 448
    in_channels: int = 3
    attention_bias: bool = True           # qkv, proj and the block MLP carry biases
    rms_norm_eps: float = 1e-5            # norm1, norm2, q/k norms, post_layernorm
    swiglu_limit: float = 10.0            # the block MLP's and the merger's clamp
    rope_theta: float = 10000.0           # the 2-D (axial) rotary base
    image_token_id: int = 154854          # the placeholder each merged image row replaces
    video_token_id: int = 154855
    image_start_token_id: int = 154830    # <|begin_of_image|>
    image_end_token_id: int = 154831      # <|end_of_image|>
    video_start_token_id: int = 154832
    video_end_token_id: int = 154833

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def token_ids(self) -> dict[str, int]:
        """The image and video token ids by their config.json field names."""
        return {f: getattr(self, f) for f in TOKEN_ID_FIELDS}


TOKEN_ID_FIELDS = ("image_token_id", "video_token_id", "image_start_token_id", "image_end_token_id",
                   "video_start_token_id", "video_end_token_id")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]          # per main layer: KDA ("linear_attention") or DSA ("deepseek_sparse_attention")
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
    pad_token_id: int | None = None       # text_config.pad_token_id (inside the vocabulary; None: not declared)
    vision: VisionConfig | None = None    # the vision tower beside the text model (None: a text-only checkpoint)

    # ---- derived facts the model code uses -------------------------------------------------------
    @property
    def dsa_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t != KDA)

    @property
    def kda_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == KDA)

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

    # ---- reading and writing config.json (cupyglm.config_hf) ---------------------------------------
    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        from cupyglm import config_hf

        return config_hf.from_dict(raw)

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
        """A config.json body, laid out as the published checkpoint's, that from_dict reads back to this config."""
        from cupyglm import config_hf

        return config_hf.to_dict(self)


def _layer_types(n: int) -> tuple[str, ...]:
    return tuple(DSA if i % 4 == 3 else KDA for i in range(n))


PRESETS: dict[str, ModelConfig] = {
    "glm-5.3-flash": ModelConfig(
        hidden_size=4096, num_hidden_layers=45, layer_types=_layer_types(45), first_k_dense_replace=3,
        vocab_size=154880, num_attention_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=256,
        v_head_dim=256, index_n_heads=32, index_head_dim=128, index_topk=2048, index_kpool=4,
        kda_num_heads=64, kda_head_dim=128, kda_conv_size=4, kda_gate_lower_bound=-5.0,
        n_routed_experts=288, num_experts_per_tok=8, n_shared_experts=1, moe_intermediate_size=2048,
        intermediate_size=12288, routed_scaling_factor=2.5, norm_topk_prob=True, swiglu_limit=10.0,
        hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, num_nextn_predict_layers=1, rms_norm_eps=1e-5,
        eos_token_ids=(154820, 154827, 154829), pad_token_id=154820,
        vision=VisionConfig(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, patch_size=14,
                            temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=4096,
                            projection_intermediate_size=10240)),
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
        max_position_embeddings=131072, pad_token_id=496,
        # The image and video ids are the tiny tokenizer's (checkpoint/tiny_tokenizer.py VISION_TOKEN_IDS).
        vision=VisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=14,
                            temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=256,
                            projection_intermediate_size=320, image_size=112,
                            image_token_id=492, video_token_id=494, image_start_token_id=506,
                            image_end_token_id=507, video_start_token_id=452, video_end_token_id=487)),
}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown config preset {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[name]
