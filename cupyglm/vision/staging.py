"""Where the tower's weights live while it encodes: on the device whole (the default), or in host memory staged to
the device one unit at a time (CUPYGLM_VISION_HOST=1).

A unit is the tensors one stretch of `encode` reads, in the order it reads them (`tower_units`): the patch
embedding, each block, the post-norm with the 2x2 merge, the merger's projection with its LayerNorm, then the
merger's gate and up projections (one fused op reads both) and its down projection cut by output rows into pieces
no larger than a block (each output column of a GEMM depends only on its own weight row, so the pieces' outputs side
by side are the whole op's bits). The staged store copies unit i + 1 into one
device slot while unit i's kernels read the other (backend/staging.py: a copy stream and events on cuda, plain copies
on numpy and sim), so the device holds two slots of the largest unit's size, not the tower
(`cupyglm.memory.vision_arrays` counts them). The kernels read the same bf16 bits either way, so the rows are
bit-identical with and without staging.

A pass over the units: `p = store.begin()`, then `p.next()` once per unit in `tower_units` order (each returns
{name: device array} holding at least that unit's tensors, a split tensor's piece under its name), then `p.end()`;
`store.pieces(name)` says how many units hold pieces of a split tensor (1 when resident).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cupyglm.backend.staging import make_stager
from cupyglm.config import VisionConfig


SPLIT = ("merger.gate_proj.weight", "merger.up_proj.weight", "merger.down_proj.weight")   # staged by output rows
ROW_ALIGN = 64                          # a split piece's rows: whole kernel tiles
PIECE_ALIGN = 64                        # elements: each piece starts 128-byte aligned in its slot (vector loads)


def tower_shapes(cfg: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Each tower tensor's shape as the tower holds it (a conv's kernel flattened to [out, in * kernel])."""
    d, f, o, m = cfg.hidden_size, cfg.intermediate_size, cfg.out_hidden_size, cfg.spatial_merge_size
    pi, pix = cfg.projection_intermediate_size, cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
    out = {"patch_embed.proj.weight": (d, pix), "patch_embed.proj.bias": (d,)}
    for n in range(cfg.depth):
        b = f"blocks.{n}"
        out.update({f"{b}.norm1.weight": (d,), f"{b}.norm2.weight": (d,), f"{b}.attn.qkv.weight": (3 * d, d),
                    f"{b}.attn.proj.weight": (d, d), f"{b}.attn.q_norm.weight": (cfg.head_dim,),
                    f"{b}.attn.k_norm.weight": (cfg.head_dim,), f"{b}.mlp.gate_proj.weight": (f, d),
                    f"{b}.mlp.up_proj.weight": (f, d), f"{b}.mlp.down_proj.weight": (d, f)})
        if cfg.attention_bias:
            out.update({f"{b}.attn.qkv.bias": (3 * d,), f"{b}.attn.proj.bias": (d,), f"{b}.mlp.gate_proj.bias": (f,),
                        f"{b}.mlp.up_proj.bias": (f,), f"{b}.mlp.down_proj.bias": (d,)})
    out.update({"post_layernorm.weight": (d,), "downsample.weight": (o, d * m * m), "downsample.bias": (o,),
                "merger.proj.weight": (o, o), "merger.post_projection_norm.weight": (o,),
                "merger.post_projection_norm.bias": (o,), "merger.gate_proj.weight": (pi, o),
                "merger.up_proj.weight": (pi, o), "merger.down_proj.weight": (o, pi)})
    return out


def tower_units(cfg: VisionConfig) -> list[tuple[tuple[str, int, int], ...]]:
    """The tower's tensors grouped into units, in the order `encode` reads them: each unit a tuple of pieces
    (name under model.visual., first row, end row). The merger's gate / up (read together by one fused op) and
    its down projection are split by output rows into pieces no larger than the largest other unit, so two slots
    of that size hold any two units."""
    shapes, bias = tower_shapes(cfg), cfg.attention_bias
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
              ("merger.proj.weight", "merger.post_projection_norm.weight", "merger.post_projection_norm.bias")]
    whole = [tuple((n, 0, shapes[n][0]) for n in u) for u in units]
    limit = max(sum(_elements(shapes[n]) for n in u) for u in units)
    return whole + _split(("merger.gate_proj.weight", "merger.up_proj.weight"), shapes, limit) \
        + _split(("merger.down_proj.weight",), shapes, limit)


def _elements(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape))


def _split(names: tuple[str, ...], shapes, limit: int) -> list[tuple[tuple[str, int, int], ...]]:
    """Units of the tensors `names` (same rows) cut together by rows, each within `limit` elements."""
    rows, per_row = shapes[names[0]][0], sum(_elements(shapes[n][1:]) for n in names)
    step = max(ROW_ALIGN, limit // per_row // ROW_ALIGN * ROW_ALIGN)
    return [tuple((n, lo, min(lo + step, rows)) for n in names) for lo in range(0, rows, step)]


def padded(elements: int) -> int:
    """A piece's elements in a slot, rounded up so the next piece starts aligned."""
    return -(-elements // PIECE_ALIGN) * PIECE_ALIGN


def pieces_of(units, name: str) -> int:
    """How many units hold a piece of tensor `name` (its chunks, one per unit)."""
    return sum(1 for u in units for n, _, _ in u if n == name)


class ResidentWeights:
    """Every tensor on the device for the tower's life: each unit of a pass sees all of them."""

    def __init__(self, ops, weights: Mapping[str, np.ndarray]):
        self.w = {n: ops.weight(a) for n, a in weights.items()}

    def begin(self) -> "_ResidentPass":
        return _ResidentPass(self.w)

    def pieces(self, name: str) -> int:
        return 1


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

    def __init__(self, ops, weights: Mapping[str, np.ndarray], units):
        sizes = [[(hi - lo) * _elements(np.shape(weights[n])[1:]) for n, lo, hi in u] for u in units]
        spans = [sum(padded(k) for k in s) for s in sizes]
        self.units, self.slot_elements = units, max(spans)
        self.stager = make_stager(ops, sum(spans), self.slot_elements)
        self.spans, self.views, at = [], [], 0
        for i, (unit, unit_sizes) in enumerate(zip(units, sizes)):
            slot, view, off = self.stager.slots[i % 2], {}, 0
            for (name, lo, hi), k in zip(unit, unit_sizes):
                self.stager.host[at + off:at + off + k] = self.stager.stored(np.asarray(weights[name])[lo:hi])
                view[name] = slot[off:off + k].reshape((hi - lo,) + tuple(np.shape(weights[name])[1:]))
                off += padded(k)
            self.spans.append((at, off))
            self.views.append(view)
            at += off

    def pieces(self, name: str) -> int:
        return pieces_of(self.units, name)

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
