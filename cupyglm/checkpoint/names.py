"""Every tensor of a GLM-5.3-Flash checkpoint: name, full shape, and how tensor parallelism splits it.

This is the one split table: the loader shards by it, make-tiny writes by it, the model reads these names.
Split kinds:
  rep  replicated on every rank
  row  split along dim 0 (output rows; heads, channels, vocab) into `tp` equal contiguous blocks
  col  split along dim 1 (input columns) into `tp` equal contiguous blocks; partials summed in rank order
"""
from __future__ import annotations

from dataclasses import dataclass

from cupyglm.config import ModelConfig


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    split: str                      # rep | row | col

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
        TensorSpec(f"{p}.q_conv1d.weight", (h * k, c.kda_conv_size), "row"),   # depthwise taps, oldest first
        TensorSpec(f"{p}.k_conv1d.weight", (h * k, c.kda_conv_size), "row"),
        TensorSpec(f"{p}.v_conv1d.weight", (h * k, c.kda_conv_size), "row"),
        TensorSpec(f"{p}.f_a_proj.weight", (k, d), "rep"),
        TensorSpec(f"{p}.f_b_proj.weight", (h * k, k), "row"),
        TensorSpec(f"{p}.g_a_proj.weight", (k, d), "rep"),
        TensorSpec(f"{p}.g_b_proj.weight", (h * k, k), "row"),
        TensorSpec(f"{p}.b_proj.weight", (h, d), "row"),
        TensorSpec(f"{p}.A_log", (h,), "row"),
        TensorSpec(f"{p}.dt_bias", (h * k,), "row"),
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
        TensorSpec(f"{p}.indexer.compress_gate.weight", (idim, d), "rep"),
        TensorSpec(f"{p}.indexer.ape", (c.index_kpool, idim), "rep"),
    ]


def _moe(p: str, c: ModelConfig) -> list[TensorSpec]:
    d, e = c.hidden_size, c.n_routed_experts
    specs = [
        TensorSpec(f"{p}.gate.weight", (e, d), "rep"),
        TensorSpec(f"{p}.gate.e_score_correction_bias", (e,), "rep"),
    ]
    for i in range(e):
        specs += _mlp(f"{p}.experts.{i}", d, c.moe_intermediate_size)
    specs += _mlp(f"{p}.shared_experts", d, c.moe_intermediate_size * c.n_shared_experts)
    return specs


def _hc(p: str, c: ModelConfig, sub: str) -> list[TensorSpec]:
    mix = c.hc_mult * 2 + c.hc_mult * c.hc_mult       # pre (4) + post (4) + comb (16) = 24
    return [
        TensorSpec(f"{p}.hc_{sub}_fn", (mix, c.hc_mult * c.hidden_size), "rep"),
        TensorSpec(f"{p}.hc_{sub}_base", (mix,), "rep"),
        TensorSpec(f"{p}.hc_{sub}_scale", (3,), "rep"),
    ]


def layer_specs(c: ModelConfig, i: int) -> list[TensorSpec]:
    p = f"model.layers.{i}"
    specs = [
        TensorSpec(f"{p}.input_layernorm.weight", (c.hidden_size,), "rep"),
        TensorSpec(f"{p}.post_attention_layernorm.weight", (c.hidden_size,), "rep"),
    ]
    if i == c.mtp_layer:
        specs += [
            TensorSpec(f"{p}.enorm.weight", (c.hidden_size,), "rep"),
            TensorSpec(f"{p}.hnorm.weight", (c.hidden_size,), "rep"),
            TensorSpec(f"{p}.eh_proj.weight", (c.hidden_size, 2 * c.hidden_size), "rep"),
            TensorSpec(f"{p}.shared_head.norm.weight", (c.hidden_size,), "rep"),
        ]
        return specs + _dsa(f"{p}.self_attn", c) + _moe(f"{p}.mlp", c)
    specs += _hc(p, c, "attn") + _hc(p, c, "ffn")
    specs += _kda(f"{p}.self_attn", c) if c.layer_types[i] == "linear_attention" else _dsa(f"{p}.self_attn", c)
    specs += _moe(f"{p}.mlp", c) if c.is_moe(i) else _mlp(f"{p}.mlp", c.hidden_size, c.intermediate_size)
    return specs


def all_specs(c: ModelConfig) -> list[TensorSpec]:
    specs = [TensorSpec("model.embed_tokens.weight", (c.vocab_size, c.hidden_size), "rep")]
    for i in range(c.num_hidden_layers + c.num_nextn_predict_layers):
        specs += layer_specs(c, i)
    specs += [
        TensorSpec("model.norm.weight", (c.hidden_size,), "rep"),
        TensorSpec("lm_head.weight", (c.vocab_size, c.hidden_size), "row"),
    ]
    return specs
