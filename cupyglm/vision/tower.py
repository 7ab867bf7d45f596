"""The vision tower on any backend (numpy, sim, cuda): one image's pixel rows -> rows of the text model's width.

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
Numerics (every op through the backend's ops object, the text model's interface, so numpy, sim and cuda give
the same bits): bf16 weights and activations; every linear a prompt-role gemm (the tensor core's order over
K) whose fp32 sums take the bias in fp32 (bias_add) and round once to bf16; a residual is residual_add
(bf16(x + bf16(sublayer))); norms are the rmsnorm / layernorm ops; attention is vision_attention (q/k RMSNorm,
the rotary, exp_f32 softmax, P rounded to bf16 before P.V); the merger's GELU is the gelu op (erf_f32); SwiGLU
is the swiglu op (gate clamped above at L, up clipped to [-L, L]). The rotary's cos/sin are NumPy's float32,
computed on the host once per grid. Each image is encoded alone, so a row depends only on its own image.
Use (Hugging Face's Glm5NextModel): pixel_values enter in bf16; the merger's rows replace the <|image|>
placeholders one for one (the processor's n_tokens), between <|begin_of_image|> and <|end_of_image|>, which
stay text tokens; positions stay the ordinary sequential ones (the text model has no rotary).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cupyglm.backend.lanes import BF16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.config import VisionConfig
from cupyglm.vision import rotary
from cupyglm.vision.staging import ResidentWeights, StagedWeights, tower_units

MERGER_LN_EPS = 1e-5                    # the merger's LayerNorm: torch's default eps (the config sets none)


class VisionTower:
    """The tower of `cfg` over `weights`: name (relative to model.visual.) -> stored bf16 array, run by `ops`
    (a backend's ops object; the numpy reference when None). Conv weights are kept as [out, in * kernel] GEMM
    weights."""

    def __init__(self, cfg: VisionConfig, weights: Mapping[str, np.ndarray], ops=None, host: bool = False):
        self.cfg, self.ops = cfg, ops if ops is not None else NumpyOps()
        missing = [n for n in self.tensor_names() if n not in weights]
        if missing:
            raise ValueError(f"vision tower: missing tensor model.visual.{missing[0]} ({len(missing)} missing)")
        gemm = {n: _as_gemm(n, np.asarray(weights[n])) for n in self.tensor_names()}
        # host: in host memory, staged one unit at a time (CUPYGLM_VISION_HOST); else on the device whole
        self.weights = (StagedWeights(self.ops, gemm, tower_units(cfg)) if host
                        else ResidentWeights(self.ops, gemm))

    def tensor_names(self) -> list[str]:
        return list(dict.fromkeys(n for unit in tower_units(self.cfg) for n, _, _ in unit))

    def encode(self, pixel_values: np.ndarray, grid: tuple[int, int, int]):
        """pixel_values float32 [t * h * w, 3 * t * p * p] and grid (t, h, w) of ONE image -> bf16
        [t * h * w / m^2, out_hidden_size] on the backend (ops.asnumpy brings it to the host): the rows that
        replace the image's placeholder tokens."""
        c, ops, (t, gh, gw) = self.cfg, self.ops, grid
        n, width = pixel_values.shape
        if t != 1 or n != gh * gw or width != c.in_channels * c.temporal_patch_size * c.patch_size ** 2:
            raise ValueError(f"vision tower: pixel_values {pixel_values.shape} do not match grid {grid} "
                             f"(one frame, rows of {c.in_channels * c.temporal_patch_size * c.patch_size ** 2})")
        pixels = ops.weight(np.asarray(pixel_values, np.float32).astype(BF16))   # pixel rows enter in bf16
        units = self.weights.begin()
        x = self._linear(units.next(), pixels, "patch_embed.proj")
        cos, sin = rotary.cos_sin(rotary.patch_positions(gh, gw, c.spatial_merge_size), c.head_dim, c.rope_theta)
        for i in range(c.depth):
            x = self._block(units.next(), x, f"blocks.{i}", cos, sin)
        rows = self._merge(units, x)
        units.end()
        return rows

    def encode_images(self, images) -> list:
        """encode of each (pixel_values, grid) in `images`, one image at a time: an image's rows never depend on
        the images beside it in the call."""
        return [self.encode(pixel_values, grid) for pixel_values, grid in images]

    # ---- parts (w: the tensors of the unit being run, {name: device array}) ---------------------------------
    def _linear(self, w, x, name: str, bias: bool = True, out: str = "bf16"):
        """x @ W^T (+ b) as a prompt-role gemm; out "bf16" rounds once, "f32" keeps the sums (a residual's)."""
        if not bias:
            return self.ops.gemm(x, w[f"{name}.weight"], out=out)
        return self.ops.bias_add(self.ops.gemm(x, w[f"{name}.weight"]), w[f"{name}.bias"], out)

    def _block(self, w, x, b: str, cos: np.ndarray, sin: np.ndarray):
        c, ops = self.cfg, self.ops
        h = self._attention(w, ops.rmsnorm(x, w[f"{b}.norm1.weight"], c.rms_norm_eps), b, cos, sin)
        x = ops.residual_add(x, h)
        h = self._mlp(w, ops.rmsnorm(x, w[f"{b}.norm2.weight"], c.rms_norm_eps), f"{b}.mlp")
        return ops.residual_add(x, h)

    def _attention(self, w, x, b: str, cos: np.ndarray, sin: np.ndarray):
        """The attention sublayer's fp32 output (proj's sums and bias, unrounded: residual_add rounds it)."""
        c, n = self.cfg, x.shape[0]
        qkv = self._linear(w, x, f"{b}.attn.qkv", c.attention_bias).reshape(n, 3, c.num_heads, c.head_dim)
        o = self.ops.vision_attention(qkv, w[f"{b}.attn.q_norm.weight"], w[f"{b}.attn.k_norm.weight"],
                                      c.rms_norm_eps, cos, sin, c.head_dim ** -0.5)
        return self._linear(w, o, f"{b}.attn.proj", c.attention_bias, out="f32")

    def _mlp(self, w, x, name: str):
        """A block's down(swiglu(gate(x), up(x), L)): its fp32 sublayer output."""
        lim, bias = self.cfg.swiglu_limit, self.cfg.attention_bias
        if bias:
            act = self.ops.swiglu(self._linear(w, x, f"{name}.gate_proj"), self._linear(w, x, f"{name}.up_proj"), lim)
        else:
            act = self.ops.gemm_swiglu(x, w[f"{name}.gate_proj.weight"], w[f"{name}.up_proj.weight"], lim)
        return self._linear(w, act, f"{name}.down_proj", bias, out="f32")

    def _merge(self, units, x):
        """post_layernorm, the 2x2 merge and the merger, each unit taken from the pass `units` as it is reached."""
        c, m, ops = self.cfg, self.cfg.spatial_merge_size, self.ops
        w = units.next()
        x = ops.rmsnorm(x, w["post_layernorm.weight"], c.rms_norm_eps)
        blocks = x.reshape(-1, m, m, c.hidden_size).transpose(0, 3, 1, 2).reshape(-1, c.hidden_size * m * m)
        y = self._linear(w, blocks, "downsample")                               # [tokens, out] (D, m, m) flattened
        w = units.next()
        y = self._linear(w, y, "merger.proj", bias=False)
        y = ops.layernorm(y, w["merger.post_projection_norm.weight"], w["merger.post_projection_norm.bias"],
                          MERGER_LN_EPS)
        y = ops.gelu(y)
        act = self._pieces(units, "merger.gate_proj.weight",
                           lambda w: ops.gemm_swiglu(y, w["merger.gate_proj.weight"], w["merger.up_proj.weight"],
                                                     c.swiglu_limit))
        return self._pieces(units, "merger.down_proj.weight",
                            lambda w: self._linear(w, act, "merger.down_proj", bias=False))

    def _pieces(self, units, name: str, op):
        """op over each unit holding a piece (output rows) of tensor `name`: its output columns side by side."""
        out = [op(units.next()) for _ in range(self.weights.pieces(name))]
        return out[0] if len(out) == 1 else self.ops.xp.concatenate(out, axis=1)


def _as_gemm(name: str, w: np.ndarray) -> np.ndarray:
    """A conv's kernel (equal to its stride) as the GEMM weight [out, in * kernel]: its flattened C order is the
    pixel row's (channel, time, y, x) and the merge block's (D, m, m). Other tensors as stored."""
    return w.reshape(w.shape[0], -1) if name.endswith(".weight") and w.ndim > 2 else w
