"""Every tensor of a GLM-5.3-Flash checkpoint as the published files store it: name, shape, dtype, and how
tensor parallelism splits it.

This is the one split table: the loader checks and shards by it, make-tiny writes by it, the model reads these
names. The text model lives under TEXT_PREFIX (layers 0..N-1, the MTP layer as layer N, embeddings, final norm),
`lm_head.weight` sits at the top level, the vision tower under VISION_PREFIX (stored, checked, not yet loaded).
Split kinds:
  rep  replicated on every rank
  row  split along dim 0 (output rows; heads, channels, vocab) into `tp` equal contiguous blocks
  col  split along dim 1 (input columns) into `tp` equal contiguous blocks; partials summed in rank order
"""
from __future__ import annotations

from dataclasses import dataclass

from cupyglm.config import ModelConfig, VisionConfig

TEXT_PREFIX = "model.language_model."
VISION_PREFIX = "model.visual."
F32 = "F32"
BF16 = "BF16"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    split: str                      # rep | row | col
    dtype: str = BF16               # the safetensors dtype the checkpoint stores it in
    part: str = "text"              # text (the model loads it) | vision (stored and checked; loaded by nobody yet)

    def shard_shape(self, tp: int) -> tuple[int, ...]:
        if self.split == "rep":
            return self.shape
        dim = 0 if self.split == "row" else 1
        if self.shape[dim] % tp:
            raise ValueError(f"{self.name}: dim {dim} of {self.shape} does not split {tp} ways")
        shape = list(self.shape)
        shape[dim] //= tp
        return tuple(shape)


def _mlp(prefix: str, d: int, inter: int) -> list[TensorSpec]:
    return [
        TensorSpec(f"{prefix}.gate_proj.weight", (inter, d), "row"),
        TensorSpec(f"{prefix}.up_proj.weight", (inter, d), "row"),
        TensorSpec(f"{prefix}.down_proj.weight", (d, inter), "col"),
    ]


def _kda(p: str, c: ModelConfig) -> list[TensorSpec]:
    d, h, k = c.hidden_size, c.kda_num_heads, c.kda_head_dim
    return [
        TensorSpec(f"{p}.q_proj.weight", (h * k, d), "row"),
        TensorSpec(f"{p}.k_proj.weight", (h * k, d), "row"),
        TensorSpec(f"{p}.v_proj.weight", (h * k, d), "row"),
        TensorSpec(f"{p}.q_conv1d.weight", (h * k, 1, c.kda_conv_size), "row"),   # depthwise Conv1d, oldest tap first
        TensorSpec(f"{p}.k_conv1d.weight", (h * k, 1, c.kda_conv_size), "row"),
        TensorSpec(f"{p}.v_conv1d.weight", (h * k, 1, c.kda_conv_size), "row"),
        TensorSpec(f"{p}.f_a_proj.weight", (k, d), "rep"),
        TensorSpec(f"{p}.f_b_proj.weight", (h * k, k), "row"),
        TensorSpec(f"{p}.g_a_proj.weight", (k, d), "rep"),
        TensorSpec(f"{p}.g_b_proj.weight", (h * k, k), "row"),
        TensorSpec(f"{p}.b_proj.weight", (h, d), "row"),
        TensorSpec(f"{p}.A_log", (h,), "row", F32),                 # one per head
        TensorSpec(f"{p}.dt_bias", (h * k,), "row", F32),           # one per channel
        TensorSpec(f"{p}.o_norm.weight", (k,), "rep"),
        TensorSpec(f"{p}.o_proj.weight", (d, h * k), "col"),
    ]


def _dsa(p: str, c: ModelConfig) -> list[TensorSpec]:
    d, h = c.hidden_size, c.num_attention_heads
    q, kv, nope, v = c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.v_head_dim
    ih, idim = c.index_n_heads, c.index_head_dim
    return [
        TensorSpec(f"{p}.q_a_proj.weight", (q, d), "rep"),
        TensorSpec(f"{p}.q_a_layernorm.weight", (q,), "rep"),
        TensorSpec(f"{p}.q_b_proj.weight", (h * nope, q), "row"),
        TensorSpec(f"{p}.kv_a_proj_with_mqa.weight", (kv, d), "rep"),
        TensorSpec(f"{p}.kv_a_layernorm.weight", (kv,), "rep"),
        TensorSpec(f"{p}.kv_b_proj.weight", (h * (nope + v), kv), "row"),  # per head: nope key rows, then v rows
        TensorSpec(f"{p}.o_proj.weight", (d, h * v), "col"),
        TensorSpec(f"{p}.indexer.wq_b.weight", (ih * idim, q), "rep"),
        TensorSpec(f"{p}.indexer.wk.weight", (idim, d), "rep"),
        TensorSpec(f"{p}.indexer.k_norm.weight", (idim,), "rep"),
        TensorSpec(f"{p}.indexer.k_norm.bias", (idim,), "rep"),
        TensorSpec(f"{p}.indexer.weights_proj.weight", (ih, d), "rep"),
        TensorSpec(f"{p}.indexer.index_kpool_compress_gate", (idim, d), "rep"),        # [out, in], a raw tensor
        TensorSpec(f"{p}.indexer.index_kpool_compress_ape", (c.index_kpool, idim), "rep"),
    ]


def _moe(p: str, c: ModelConfig) -> list[TensorSpec]:
    d, e = c.hidden_size, c.n_routed_experts
    specs = [
        TensorSpec(f"{p}.gate.weight", (e, d), "rep"),
        TensorSpec(f"{p}.gate.e_score_correction_bias", (e,), "rep", F32),
    ]
    for i in range(e):
        specs += _mlp(f"{p}.experts.{i}", d, c.moe_intermediate_size)
    specs += _mlp(f"{p}.shared_experts", d, c.moe_intermediate_size * c.n_shared_experts)
    return specs


def _hc(p: str, c: ModelConfig, sub: str) -> list[TensorSpec]:
    mix = c.hc_mult * 2 + c.hc_mult * c.hc_mult       # pre (4) + post (4) + comb (16) = 24
    return [
        TensorSpec(f"{p}.hc_{sub}_fn", (mix, c.hc_mult * c.hidden_size), "rep"),
        TensorSpec(f"{p}.hc_{sub}_base", (mix,), "rep", F32),
        TensorSpec(f"{p}.hc_{sub}_scale", (3,), "rep", F32),                 # pre, post, comb
    ]


def layer_specs(c: ModelConfig, i: int) -> list[TensorSpec]:
    """Layer i's tensors; i == num_hidden_layers is the MTP layer (DSA + MoE, plain residuals, no hc_*)."""
    p = f"{TEXT_PREFIX}layers.{i}"
    specs = [
        TensorSpec(f"{p}.input_layernorm.weight", (c.hidden_size,), "rep"),
        TensorSpec(f"{p}.post_attention_layernorm.weight", (c.hidden_size,), "rep"),
    ]
    if i == c.mtp_layer:
        specs += [
            TensorSpec(f"{p}.enorm.weight", (c.hidden_size,), "rep"),
            TensorSpec(f"{p}.hnorm.weight", (c.hidden_size,), "rep"),
            TensorSpec(f"{p}.eh_proj.weight", (c.hidden_size, 2 * c.hidden_size), "rep"),   # in: [embed | hidden]
            TensorSpec(f"{p}.shared_head.norm.weight", (c.hidden_size,), "rep"),
        ]
        return specs + _dsa(f"{p}.self_attn", c) + _moe(f"{p}.mlp", c)
    specs += _hc(p, c, "attn") + _hc(p, c, "ffn")
    specs += _kda(f"{p}.self_attn", c) if c.layer_types[i] == "linear_attention" else _dsa(f"{p}.self_attn", c)
    specs += _moe(f"{p}.mlp", c) if c.is_moe(i) else _mlp(f"{p}.mlp", c.hidden_size, c.intermediate_size)
    return specs


def all_specs(c: ModelConfig) -> list[TensorSpec]:
    """Every tensor the text model loads (what a rank's shard holds), in table order."""
    specs = [TensorSpec(f"{TEXT_PREFIX}embed_tokens.weight", (c.vocab_size, c.hidden_size), "rep")]
    for i in range(c.num_hidden_layers + c.num_nextn_predict_layers):
        specs += layer_specs(c, i)
    specs += [
        TensorSpec(f"{TEXT_PREFIX}norm.weight", (c.hidden_size,), "rep"),
        TensorSpec("lm_head.weight", (c.vocab_size, c.hidden_size), "row"),
    ]
    return specs


def vision_specs(c: ModelConfig) -> list[TensorSpec]:
    """The vision tower's tensors (none for a text-only config): replicated, stored, not loaded by the text model."""
    v = c.vision
    if v is None:
        return []
    return [TensorSpec(name, shape, "rep", BF16, "vision") for name, shape in _vision_shapes(v)]


def _vision_shapes(v: VisionConfig) -> list[tuple[str, tuple[int, ...]]]:
    p, d, f, o, m = VISION_PREFIX, v.hidden_size, v.intermediate_size, v.out_hidden_size, v.spatial_merge_size
    bias = v.attention_bias
    out = [(f"{p}patch_embed.proj.weight", (d, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)),
           (f"{p}patch_embed.proj.bias", (d,))]                                 # Conv3d over (t, p, p) patches
    for n in range(v.depth):
        b = f"{p}blocks.{n}"
        out += [(f"{b}.norm1.weight", (d,)), (f"{b}.norm2.weight", (d,)),
                (f"{b}.attn.qkv.weight", (3 * d, d))] + ([(f"{b}.attn.qkv.bias", (3 * d,))] if bias else [])
        out += [(f"{b}.attn.proj.weight", (d, d))] + ([(f"{b}.attn.proj.bias", (d,))] if bias else [])
        out += [(f"{b}.attn.q_norm.weight", (d // v.num_heads,)), (f"{b}.attn.k_norm.weight", (d // v.num_heads,))]
        for proj, shape in (("gate_proj", (f, d)), ("up_proj", (f, d)), ("down_proj", (d, f))):
            out += [(f"{b}.mlp.{proj}.weight", shape), (f"{b}.mlp.{proj}.bias", (shape[0],))]
    out += [(f"{p}post_layernorm.weight", (d,)),
            (f"{p}downsample.weight", (o, d, m, m)), (f"{p}downsample.bias", (o,)),      # Conv2d, stride m
            (f"{p}merger.proj.weight", (o, o)),
            (f"{p}merger.post_projection_norm.weight", (o,)), (f"{p}merger.post_projection_norm.bias", (o,)),
            (f"{p}merger.gate_proj.weight", (v.projection_intermediate_size, o)),
            (f"{p}merger.up_proj.weight", (v.projection_intermediate_size, o)),
            (f"{p}merger.down_proj.weight", (o, v.projection_intermediate_size))]
    return out


def checkpoint_specs(c: ModelConfig) -> list[TensorSpec]:
    """Every tensor the checkpoint stores: the text model's, then the vision tower's."""
    return all_specs(c) + vision_specs(c)
