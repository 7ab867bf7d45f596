"""The tower's numpy reference against a float64 oracle written in the published modules' own shapes (a Conv3d
over [n, 3, t, p, p], qkv viewed [n, 3, heads, head_dim], the rotary table from a meshgrid of the grid, a Conv2d
over [blocks, D, m, m]): equal to bf16 rounding, so a layout slip (a transposed weight, a swapped rotary half,
another merge order) shows as an error far above it."""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from cupyglm.checkpoint.vision_weights import vision_weights
from cupyglm.vision.processor import ProcessorConfig, process_bytes
from cupyglm.vision.tower import VisionTower


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _swiglu(x, w, name, lim, bias):
    def lin(n):
        y = x @ w[f"{name}.{n}.weight"].T
        return y + w[f"{name}.{n}.bias"] if bias else y
    g, u = np.minimum(lin("gate_proj"), lim), np.clip(lin("up_proj"), -lim, lim)
    h = g / (1 + np.exp(-g)) * u
    y = h @ w[f"{name}.down_proj.weight"].T
    return y + w[f"{name}.down_proj.bias"] if bias else y


def _rotary(grid_h, grid_w, m, head_dim, theta):
    hpos, wpos = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    order = lambda a: a.reshape(grid_h // m, m, grid_w // m, m).swapaxes(1, 2).reshape(-1)   # noqa: E731
    pos = np.stack([order(hpos), order(wpos)], -1).astype(np.float64)          # [n, 2]
    inv = 1.0 / theta ** (np.arange(0, head_dim // 2, 2) / (head_dim // 2))
    ang = np.concatenate([pos[:, 0:1] * inv, pos[:, 1:2] * inv], -1)
    ang = np.concatenate([ang, ang], -1)
    return np.cos(ang)[:, None], np.sin(ang)[:, None]


def oracle(cfg, w, pixel_values, grid):
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    _, gh, gw = grid
    d, heads, m, lim, eps = cfg.hidden_size, cfg.num_heads, cfg.spatial_merge_size, cfg.swiglu_limit, cfg.rms_norm_eps
    hd = d // heads
    px = pixel_values.astype(np.dtype("bfloat16")).astype(np.float64)
    px = px.reshape(-1, 3, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
    x = np.einsum("nctyx,dctyx->nd", px, w["patch_embed.proj.weight"]) + w["patch_embed.proj.bias"]
    cos, sin = _rotary(gh, gw, m, hd, cfg.rope_theta)
    rot = lambda z: z * cos + np.concatenate([-z[..., hd // 2:], z[..., :hd // 2]], -1) * sin   # noqa: E731
    for i in range(cfg.depth):
        b = f"blocks.{i}"
        h = _rms(x, w[f"{b}.norm1.weight"], eps)
        qkv = (h @ w[f"{b}.attn.qkv.weight"].T + w[f"{b}.attn.qkv.bias"]).reshape(len(x), 3, heads, hd)
        q = rot(_rms(qkv[:, 0], w[f"{b}.attn.q_norm.weight"], eps))
        k = rot(_rms(qkv[:, 1], w[f"{b}.attn.k_norm.weight"], eps))
        s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", p, qkv[:, 2]).reshape(len(x), d)
        x = x + o @ w[f"{b}.attn.proj.weight"].T + w[f"{b}.attn.proj.bias"]
        x = x + _swiglu(_rms(x, w[f"{b}.norm2.weight"], eps), w, f"{b}.mlp", lim, True)
    x = _rms(x, w["post_layernorm.weight"], eps).reshape(-1, m, m, d).transpose(0, 3, 1, 2)
    y = np.einsum("bdij,odij->bo", x, w["downsample.weight"]) + w["downsample.bias"]
    y = y @ w["merger.proj.weight"].T
    y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5)
    y = y * w["merger.post_projection_norm.weight"] + w["merger.post_projection_norm.bias"]
    y = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    return _swiglu(y, w, "merger", lim, False)


@pytest.mark.parametrize("h, w", [(112, 112), (60, 200)])
def test_the_reference_equals_a_float64_oracle_to_bf16_rounding(tiny_ckpt, tiny_dir, h, w):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(h).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    img = process_bytes(buf.getvalue(), ProcessorConfig.from_dir(tiny_dir))
    weights = vision_weights(tiny_ckpt)
    ours = VisionTower(tiny_ckpt.config.vision, weights).encode(img.pixel_values, img.grid).astype(np.float64)
    want = oracle(tiny_ckpt.config.vision, weights, img.pixel_values, img.grid)
    err = np.abs(ours - want).max() / np.abs(want).max()
    assert ours.shape == want.shape and err < 0.03, err
