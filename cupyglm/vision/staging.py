"""Where the tower's weights live while it encodes: on the device whole (the default), or in host memory staged to
the device one unit at a time (CUPYGLM_VISION_HOST=1).

A unit is the tensors one stretch of `encode` reads, in the order it reads them (`tower_units`): the patch
embedding, each block, the post-norm with the 2x2 merge, the merger's projection with its LayerNorm, the merger's
gate and up projections (one fused op reads both), its down projection. The staged store copies unit i + 1 into one
device slot while unit i's kernels read the other (backend/staging.py: a copy stream and events on cuda, plain copies
on numpy and sim), so the device holds two slots of the largest unit's size, not the tower
(`cupyglm.memory.vision_arrays` counts them). The kernels read the same bf16 bits either way, so the rows are
bit-identical with and without staging.

A pass over the units: `p = store.begin()`, then `p.next()` once per unit in `tower_units` order (each returns
{name: device array} holding at least that unit's tensors), then `p.end()`.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cupyglm.backend.staging import make_stager
from cupyglm.config import VisionConfig


def tower_units(cfg: VisionConfig) -> list[tuple[str, ...]]:
    """The tower's tensors (names under model.visual.) grouped into units, in the order `encode` reads them."""
    bias = cfg.attention_bias
    units = [("patch_embed.proj.weight", "patch_embed.proj.bias")]
    for n in range(cfg.depth):
        b = f"blocks.{n}"
        names = [f"{b}.norm1.weight", f"{b}.attn.qkv.weight"] + ([f"{b}.attn.qkv.bias"] if bias else [])
        names += [f"{b}.attn.q_norm.weight", f"{b}.attn.k_norm.weight", f"{b}.attn.proj.weight"]
        names += ([f"{b}.attn.proj.bias"] if bias else []) + [f"{b}.norm2.weight"]
        for p in ("gate", "up", "down"):
            names += [f"{b}.mlp.{p}_proj.weight"] + ([f"{b}.mlp.{p}_proj.bias"] if bias else [])
        units.append(tuple(names))
    units += [("post_layernorm.weight", "downsample.weight", "downsample.bias"),
              ("merger.proj.weight", "merger.post_projection_norm.weight", "merger.post_projection_norm.bias"),
              ("merger.gate_proj.weight", "merger.up_proj.weight"),
              ("merger.down_proj.weight",)]
    return units


class ResidentWeights:
    """Every tensor on the device for the tower's life: each unit of a pass sees all of them."""

    def __init__(self, ops, weights: Mapping[str, np.ndarray]):
        self.w = {n: ops.weight(a) for n, a in weights.items()}

    def begin(self) -> "_ResidentPass":
        return _ResidentPass(self.w)


class _ResidentPass:
    def __init__(self, w):
        self.w = w

    def next(self):
        return self.w

    def end(self) -> None:
        pass


class StagedWeights:
    """The tensors of `units` in host memory, each unit staged into device slot (index % 2) when a pass reaches
    it; `slot_elements` is the largest unit's bf16 elements (each slot's size)."""

    def __init__(self, ops, weights: Mapping[str, np.ndarray], units: list[tuple[str, ...]]):
        sizes = [[int(np.prod(np.shape(weights[n]))) for n in u] for u in units]
        self.slot_elements = max(sum(s) for s in sizes)
        self.stager = make_stager(ops, sum(sum(s) for s in sizes), self.slot_elements)
        self.spans, self.views, lo = [], [], 0
        for i, (unit, unit_sizes) in enumerate(zip(units, sizes)):
            slot, view, off = self.stager.slots[i % 2], {}, 0
            for name, k in zip(unit, unit_sizes):
                self.stager.host[lo + off:lo + off + k] = self.stager.stored(weights[name])
                view[name] = slot[off:off + k].reshape(np.shape(weights[name]))
                off += k
            self.spans.append((lo, off))
            self.views.append(view)
            lo += off

    def begin(self) -> "_StagedPass":
        return _StagedPass(self)

    def copy(self, i: int) -> None:
        lo, n = self.spans[i]
        self.stager.copy(i % 2, lo, n)


class _StagedPass:
    def __init__(self, store: StagedWeights):
        self.store, self.i = store, 0
        store.copy(0)

    def next(self):
        s, i = self.store, self.i
        if i >= len(s.views):
            raise ValueError(f"vision staging: a pass reads {len(s.views)} units, asked for unit {i}")
        s.stager.wait(i % 2)
        if i:
            s.stager.release((i - 1) % 2)       # unit i - 1's kernels are queued: its slot takes unit i + 1 after them
        if i + 1 < len(s.views):
            s.copy(i + 1)
        self.i += 1
        return s.views[i]

    def end(self) -> None:
        if self.i:
            self.store.stager.release((self.i - 1) % 2)
