"""Contract cases of cuda_src/vision.cu (ops bias_add, gelu, vision_attention: the vision tower's own ops).

Controls: bias_add reading each column's bias from the next column (-DCONTROL_BIAS_SHIFT); gelu with the erf's
argument scaled by 0.7 instead of 1/sqrt(2) (-DCONTROL_TANH_GELU); vision_attention without the rotary's
rotate_half term (-DCONTROL_NO_TURN) and with a causal mask (-DCONTROL_CAUSAL: the tower's attention sees every
patch, the text model's does not).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_vision

REF = NumpyOps()
EPS = 1e-5


def _bf(rng, shape, std=1.0, mean=0.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std) + np.float32(mean))


def _bias(label: str, rows: int, cols: int, out: str) -> Case:
    def make(rng):
        return {"y": (rng.standard_normal((rows, cols)) * 4).astype(np.float32), "b": _bf(rng, (cols,), 2.0)}

    def run(k, d):
        return {"y": ops_vision.bias_add(k, d["y"], d["b"], out)}

    def replay(d):
        return {"y": REF.bias_add(d["y"], d["b"], out)}

    def ctl(k, d):
        return {"y": ops_vision.bias_add(k.variant("CONTROL_BIAS_SHIFT"), d["y"], d["b"], out)}

    kernel = "bias_add_bf16" if out == "bf16" else "bias_add_f32"
    return case(Case(f"bias_add[{label}]", (kernel,), make, run, replay, ctl))


def _gelu(label: str, shape: tuple[int, ...], std: float) -> Case:
    def make(rng):
        x = _bf(rng, shape, std)
        x.reshape(-1)[:6] = bf16(np.array([0.0, -0.0, 1.5, -1.5, 4.0, -4.0], np.float32))  # the erf's seams
        return {"x": x}

    def run(k, d):
        return {"y": ops_vision.gelu(k, d["x"])}

    def replay(d):
        return {"y": REF.gelu(d["x"])}

    def ctl(k, d):
        return {"y": ops_vision.gelu(k.variant("CONTROL_TANH_GELU"), d["x"])}

    return case(Case(f"gelu[{label}]", ("gelu_rows",), make, run, replay, ctl))


def _attention(label: str, grid: tuple[int, int], heads: int, head_dim: int, define: str) -> Case:
    n = grid[0] * grid[1]

    def make(rng):
        half = rng.uniform(-np.pi, np.pi, (n, head_dim // 2)).astype(np.float32)   # vision/rotary's layout:
        angles = np.concatenate([half, half], axis=-1)                              # one table written twice
        return {"qkv": _bf(rng, (n, 3, heads, head_dim), 2.0), "q_w": _bf(rng, (head_dim,), 0.2, 1.0),
                "k_w": _bf(rng, (head_dim,), 0.2, 1.0), "cos": np.cos(angles).astype(np.float32),
                "sin": np.sin(angles).astype(np.float32)}

    def args(d):
        return d["qkv"], d["q_w"], d["k_w"], EPS, d["cos"], d["sin"], head_dim ** -0.5

    def run(k, d):
        return {"y": ops_vision.vision_attention(k, *args(d))}

    def replay(d):
        return {"y": REF.vision_attention(*args(d))}

    def ctl(k, d):
        return {"y": ops_vision.vision_attention(k.variant(define), *args(d))}

    return case(Case(f"vision_attention[{label}]", ("vision_qk_rows", "vision_attention_rows"), make, run, replay,
                     ctl))


_bias("f32", 9, 64, "f32")                 # a residual's sublayer output (attn proj, mlp down)
_bias("bf16", 33, 130, "bf16")             # qkv, gate/up, downsample; N % 16 = 2
_gelu("merger", (12, 64), 2.0)             # the merger's rows
_gelu("wide", (3, 700), 6.0)               # past |x| = 4 (erf = 1) on both sides
_attention("tiny4x4", (4, 4), 4, 16, "CONTROL_NO_TURN")       # one 56x56 image of the tiny tower
_attention("8x6", (8, 6), 2, 64, "CONTROL_CAUSAL")            # n = 48: three lane rounds; the full model's head
_attention("2x2", (2, 2), 3, 16, "CONTROL_CAUSAL")            # fewer patches than lanes
