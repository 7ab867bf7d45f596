"""The tower's 2-D rotary embedding over one image's patches (Hugging Face's "axial" rope for glm5_next_vision).

Positions: patch (row, column) in the processor's merge-block order, so rows m*m apart in the sequence are one
merged token's neighbours. Frequencies: with head width D, D/4 of them, inv_freq[i] = theta^(-4i/D) (i < D/4),
the same table for the row and the column. Angles of a patch: [row * inv_freq | col * inv_freq], written twice
to cover the whole head (no partial rotation). A head vector x rotates as x * cos + rotate_half(x) * sin with
rotate_half(x) = [-x[D/2:], x[:D/2]], in fp32. Computed on the host once per image grid. (The same table
the Qwen2-VL family's towers build, GLM-4.1V's and GLM-OCR's among them.)
"""
from __future__ import annotations

import numpy as np


def patch_positions(grid_h: int, grid_w: int, merge: int) -> np.ndarray:
    """int32 [grid_h * grid_w, 2]: (row, column) of each patch in merge-block order."""
    if grid_h % merge or grid_w % merge:
        raise ValueError(f"patch grid {grid_h}x{grid_w} is not a whole number of {merge}x{merge} blocks")
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    shape = (grid_h // merge, merge, grid_w // merge, merge)
    rows = rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    cols = cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    return np.stack([rows, cols], axis=-1).astype(np.int32)


def inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """float32 [head_dim / 4]: theta^(-2j / (head_dim / 2)) for j = 0, 2, 4, ... < head_dim / 2."""
    half = head_dim // 2
    expo = np.arange(0, half, 2, dtype=np.float32) / np.float32(half)
    return (np.float32(1.0) / (np.float32(theta) ** expo)).astype(np.float32)


def cos_sin(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """float32 [n, head_dim] cos and sin tables for `positions` [n, 2] (row, column)."""
    freqs = positions.astype(np.float32)[:, :, None] * inv_freq(head_dim, theta)[None, None, :]   # [n, 2, D/4]
    angles = freqs.reshape(len(positions), -1)                                                   # [row | col]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [n, heads, D] (float32 values) rotated by the [n, D] tables, fp32."""
    x = np.asarray(x, np.float32)
    half = x.shape[-1] // 2
    turned = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + turned * sin[:, None, :]
