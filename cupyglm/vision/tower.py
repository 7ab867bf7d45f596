"""The vision tower in NumPy (the reference): one image's pixel rows -> rows of the text model's width.

As the published checkpoint defines it (Hugging Face's Glm5NextVisionModel; tensors under model.visual.):
- patch_embed: a Conv3d whose kernel equals its stride (temporal_patch_size x patch x patch), i.e. one linear
  map of each pixel row [3 * t * p * p] (flattened channel, time, y, x) to the tower width D, with a bias.
- depth pre-norm blocks: x += proj(attn(norm1(x))); x += mlp(norm2(x)). RMSNorms (Llama form, eps
  rms_norm_eps). attn: qkv linear (bias) -> q, k, v as [heads, D / heads]; per-head RMSNorm of q and k
  (q_norm, k_norm); the 2-D rotary (rotary.py); full non-causal softmax attention over the image's own
  patches, scale head_dim^-0.5; proj linear (bias). mlp: SwiGLU with biases, gate clamped above at
  swiglu_limit, up clipped to [-limit, limit]: down(silu(min(gate, L)) * clip(up, -L, L)).
- post_layernorm (RMSNorm), then the 2x2 merge: each run of m*m consecutive rows (one merge block, the
  processor's order) is a Conv2d with kernel = stride = m (downsample: [out, D, m, m], bias) -> one row of
  out_hidden_size, the text model's width.
- merger: proj (no bias) -> LayerNorm (post_projection_norm, weight and bias, eps 1e-5) -> exact (erf) GELU ->
  clipped SwiGLU without biases (gate, up [projection_intermediate_size, out], down back to out).
Numerics: bf16 weights and activations; every sum over a model dimension in the lane-16 order
(backend/lanes.py), fp32 products, a bf16 rounding after each linear, norm, activation and residual add; exp
is exp_f32; the rotary angles' cos/sin are NumPy's float32 and GELU's erf is float64 rounded to float32, both
host-side until a kernel defines them. Each image is encoded alone, so a row depends only on its own image.
Use (Hugging Face's Glm5NextModel): pixel_values enter in bf16; the merger's rows replace the <|image|>
placeholders one for one (the processor's n_tokens), between <|begin_of_image|> and <|end_of_image|>, which
stay text tokens; positions stay the ordinary sequential ones (the text model has no rotary).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from cupyglm.backend.lanes import bf16, exp_f32, f32, gemm, gemm_batched, lane_sum, rsqrt_f32, sigmoid_f32
from cupyglm.config import VisionConfig
from cupyglm.vision import rotary

MERGER_LN_EPS = 1e-5                    # the merger's LayerNorm: torch's default eps (the config sets none)
_erf = np.vectorize(math.erf, otypes=[np.float64])


class VisionTower:
    """The tower of `cfg` over `weights`: name (relative to model.visual.) -> stored bf16 array."""

    def __init__(self, cfg: VisionConfig, weights: Mapping[str, np.ndarray]):
        self.cfg = cfg
        self.w = weights
        missing = [n for n in self.tensor_names() if n not in weights]
        if missing:
            raise ValueError(f"vision tower: missing tensor model.visual.{missing[0]} ({len(missing)} missing)")

    def tensor_names(self) -> list[str]:
        names = ["patch_embed.proj.weight", "patch_embed.proj.bias", "post_layernorm.weight",
                 "downsample.weight", "downsample.bias", "merger.proj.weight", "merger.post_projection_norm.weight",
                 "merger.post_projection_norm.bias", "merger.gate_proj.weight", "merger.up_proj.weight",
                 "merger.down_proj.weight"]
        for n in range(self.cfg.depth):
            b = f"blocks.{n}"
            names += [f"{b}.norm1.weight", f"{b}.norm2.weight", f"{b}.attn.qkv.weight", f"{b}.attn.proj.weight",
                      f"{b}.attn.q_norm.weight", f"{b}.attn.k_norm.weight"]
            names += [f"{b}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
            if self.cfg.attention_bias:
                names += [f"{b}.attn.qkv.bias", f"{b}.attn.proj.bias"]
                names += [f"{b}.mlp.{p}_proj.bias" for p in ("gate", "up", "down")]
        return names

    def encode(self, pixel_values: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
        """pixel_values float32 [t * h * w, 3 * t * p * p] and grid (t, h, w) of ONE image -> bf16
        [t * h * w / m^2, out_hidden_size]: the rows that replace the image's placeholder tokens."""
        c, (t, gh, gw) = self.cfg, grid
        n, width = pixel_values.shape
        if t != 1 or n != gh * gw or width != c.in_channels * c.temporal_patch_size * c.patch_size ** 2:
            raise ValueError(f"vision tower: pixel_values {pixel_values.shape} do not match grid {grid} "
                             f"(one frame, rows of {c.in_channels * c.temporal_patch_size * c.patch_size ** 2})")
        x = self._linear(bf16(pixel_values), "patch_embed.proj")
        cos, sin = rotary.cos_sin(rotary.patch_positions(gh, gw, c.spatial_merge_size), c.head_dim, c.rope_theta)
        for i in range(c.depth):
            x = self._block(x, f"blocks.{i}", cos, sin)
        x = rmsnorm(x, self.w["post_layernorm.weight"], c.rms_norm_eps)
        return self._merge(x)

    # ---- parts -------------------------------------------------------------------------------------------
    def _linear(self, x: np.ndarray, name: str, bias: bool = True) -> np.ndarray:
        w = self.w[f"{name}.weight"]
        y = gemm(x, w.reshape(w.shape[0], -1))
        if bias:
            y = y + f32(self.w[f"{name}.bias"])
        return bf16(y)

    def _block(self, x: np.ndarray, b: str, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        c = self.cfg
        h = self._attention(rmsnorm(x, self.w[f"{b}.norm1.weight"], c.rms_norm_eps), b, cos, sin)
        x = bf16(f32(x) + f32(h))
        h = self._swiglu(rmsnorm(x, self.w[f"{b}.norm2.weight"], c.rms_norm_eps), f"{b}.mlp", c.attention_bias)
        return bf16(f32(x) + f32(h))

    def _attention(self, x: np.ndarray, b: str, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        c, n = self.cfg, x.shape[0]
        qkv = self._linear(x, f"{b}.attn.qkv", c.attention_bias).reshape(n, 3, c.num_heads, c.head_dim)
        q = rmsnorm(qkv[:, 0], self.w[f"{b}.attn.q_norm.weight"], c.rms_norm_eps)
        k = rmsnorm(qkv[:, 1], self.w[f"{b}.attn.k_norm.weight"], c.rms_norm_eps)
        q, k = bf16(rotary.rotate(q, cos, sin)), bf16(rotary.rotate(k, cos, sin))
        v = qkv[:, 2]
        scores = gemm_batched(q.transpose(1, 0, 2), k.transpose(1, 0, 2)) * np.float32(c.head_dim ** -0.5)
        e = exp_f32(scores - scores.max(axis=-1, keepdims=True))
        p = e / lane_sum(e)[..., None]                                           # [heads, n, n] fp32
        o = gemm_batched(bf16(p), v.transpose(1, 2, 0))                          # P rounded to bf16 before P.V
        return self._linear(bf16(o).transpose(1, 0, 2).reshape(n, -1), f"{b}.attn.proj", c.attention_bias)

    def _swiglu(self, x: np.ndarray, name: str, bias: bool) -> np.ndarray:
        lim = np.float32(self.cfg.swiglu_limit)
        gate = np.minimum(f32(self._linear(x, f"{name}.gate_proj", bias)), lim)
        up = np.clip(f32(self._linear(x, f"{name}.up_proj", bias)), -lim, lim)
        act = bf16(gate * sigmoid_f32(gate))
        return self._linear(bf16(f32(act) * up), f"{name}.down_proj", bias)

    def _merge(self, x: np.ndarray) -> np.ndarray:
        c, m = self.cfg, self.cfg.spatial_merge_size
        blocks = x.reshape(-1, m, m, c.hidden_size).transpose(0, 3, 1, 2).reshape(-1, c.hidden_size * m * m)
        y = self._linear(blocks, "downsample")                                  # [tokens, out] (D, m, m) flattened
        y = self._linear(y, "merger.proj", bias=False)
        y = layernorm(y, self.w["merger.post_projection_norm.weight"], self.w["merger.post_projection_norm.bias"],
                      MERGER_LN_EPS)
        y = bf16(gelu(f32(y)))
        return self._swiglu(y, "merger", bias=False)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """bf16(w * bf16(x * rsqrt(mean(x^2) + eps))) over the last axis (the text model's RMSNorm form)."""
    x = f32(x)
    r = rsqrt_f32(lane_sum(x * x) / np.float32(x.shape[-1]) + np.float32(eps))
    return bf16(f32(w) * f32(bf16(x * r[..., None])))


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """bf16((x - mean) * rsqrt(var + eps) * w + b), population variance, over the last axis."""
    x = f32(x)
    d = x - (lane_sum(x) / np.float32(x.shape[-1]))[..., None]
    r = rsqrt_f32(lane_sum(d * d) / np.float32(x.shape[-1]) + np.float32(eps))
    return bf16(d * r[..., None] * f32(w) + f32(b))


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU x * (1 + erf(x / sqrt 2)) / 2, float32."""
    x = f32(x)
    return (x * np.float32(0.5) * (np.float32(1.0) + _erf(x / np.float32(math.sqrt(2.0))).astype(np.float32))
            ).astype(np.float32)
