"""Counts of a kernel's compiled hot loop -> the time of one call on the H200 (bench/sass/hw.py).

A call's time is the largest of four bounds, plus its launch (and a collective where the forward has one):
  issue   units x (warp instructions a unit) / the rate the call's warps issue at
  memory  the bytes the call moves (cupyglm.memory's arrays at the model's shapes) / HBM bandwidth
  l2      the operand bytes the call's blocks load / L2 bandwidth (hw.L2_BYTES_S), for a tiled kernel (else 0)
  tensor  the call's FLOPs / the tensor peak, for a kernel whose hot loop holds tensor-core instructions (else 0)
The L2 bound counts what HBM bytes hide: a tiled GEMM reads each weight from HBM about once, but every block loads
its own operands over K, so the blocks together load (tile_l2_bytes)
  blocks x K x (TILE_M x x-bytes + TILE_N x w-bytes)     blocks = (row tiles, a head or an expert pass each)
                                                                  x ceil(N / TILE_N)
(the warps of one block that share a row or column tile are taken to hit L1, so a block loads its tile once);
prefill attention on the tensor core loads, per block of 16 heads, every picked latent row (and its position).
A call with no kernel (analysis None: an elementwise pass or a dequantisation priced at HBM alone) has only
its memory bound.
A unit is a weight for the decode GEMVs and a FLOP for the rest. The units of one hot-loop iteration of a warp:
  weight  32 x FADD / bucket      (each weight is added into the bucket's row accumulators of its lane's
                                   thread: a block runs its rows in the smallest of 1, 2, 4, 8, 16 row slots
                                   holding them, every slot of that bucket issued); on the tensor core
          256 x HMMA / tiles      (16 weights x 16 k a step, once per 8-row tile: 1 up to 8 rows, else 2)
  mac     64 x FADD               (a scalar GEMM loop: each FADD accumulates one product, 2 FLOPs a thread)
  flop    the loop's FLOPs        (FP instructions by their width; tensor instructions by their shape)
  state   32 x per_thread         (KDA: the recurrent-state elements a thread updates an iteration)
Instructions outside the hot loop (staging, folds, stores) are not counted: the hot loop is most of the work.
A decode GEMV's loop is counted in a compile that keeps only its bucket's instantiation (-DGEMV_BUCKET_ONLY, every
block dispatched to it), so the loop counted is the one a block of that many rows runs; its hot loop is the
innermost loop with tensor instructions, or with shared loads and FADDs (the lane sums), not a prologue's. Registers and shared memory are the
shipped kernel's (every bucket compiled in).

Issue rate (occupancy rule): the grid's blocks spread over min(SMs, blocks) SMs; an SM holds
min(blocks its registers / shared memory / threads allow, ceil(blocks / SMs)) of them at once; each of its
ISSUE_SLOTS schedulers issues every clock while it has WARPS_TO_ISSUE resident warps, proportionally less with
fewer (the latency of a dependent FP or shared load is then not hidden).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from bench.sass import hw, parse
from bench.sass.compile import compiled

GEMV_ROWS = 16       # cuda_src/gemv_tile.cuh: the rows of a block
BUCKETS = (1, 2, 4, 8, 16)   # the GEMV_BUCKET_ONLY values a decode GEMV is compiled at (gemv_tc.cuh's gtc_tiles)


def bucket(rows: int) -> int:
    """The row bucket of a block of `rows` rows (at most GEMV_ROWS)."""
    return next(b for b in BUCKETS if b >= min(max(rows, 1), GEMV_ROWS))


@dataclass(frozen=True)
class Kernel:
    name: str            # the extern "C" function
    file: str            # under cuda_src/
    role: str            # decode | prompt
    unit: str            # weight | mac | flop
    threads: int         # a block's threads (the launcher's)
    dtype: str = "bf16"  # the weights' stored format, for GEMVs and GEMMs
    dyn_shared: int = 0  # dynamic shared memory a block (the launcher's), bytes
    per_thread: float = 1.0   # unit "state": the elements a thread updates an iteration
    bucket: int = GEMV_ROWS   # unit "weight": the row bucket whose loop is counted (bucket())
    hot: str = "work"         # "dot": the hot loop is the one with two global loads a product (a dot's loop)


@dataclass(frozen=True)
class Analysis:
    kernel: Kernel
    counts: parse.Counts
    registers: int
    shared: int
    units_per_iter: float

    @property
    def instr_per_unit(self) -> float:
        return self.counts.instr / self.units_per_iter

    def per_unit(self, n: int) -> float:
        return n / self.units_per_iter

    @property
    def blocks_per_sm(self) -> int:
        warps = -(-self.kernel.threads // 32)
        regs = warps * -(-(-(-self.registers // 8) * 8 * 32) // 256) * 256       # allocated 256 a warp
        limits = [hw.MAX_BLOCKS, hw.MAX_THREADS // (warps * 32), hw.REGISTERS // max(regs, 1),
                  hw.SHARED_BYTES // (self.shared + self.kernel.dyn_shared + hw.SHARED_RESERVED)]
        return max(0, min(limits))


def units_per_iter(k: Kernel, c: parse.Counts) -> float:
    unit = k.unit
    if unit == "state":
        return 32 * k.per_thread
    if unit == "weight" and c.tensor:      # an mma.m16n8k16 takes 16 x 16 weights for each 8-row tile
        return 256 * c.tensor / (1 if k.bucket <= 8 else 2)
    if unit == "weight":
        if c.fadd % k.bucket:
            raise ValueError(f"{k.name}: {c.fadd} FADDs a loop, not whole weights of bucket {k.bucket}")
        return 32 * c.fadd / k.bucket
    if unit == "mac":
        return 64 * c.fadd
    if unit == "flop":
        return float(c.flops)
    raise ValueError(f"unknown unit {unit!r}")


@functools.lru_cache(maxsize=None)
def analyse(k: Kernel, arch: str = "sm_90", defines: tuple[str, ...] = ()) -> Analysis:
    """The kernel compiled for arch, its hot loop counted (raises if it has no loop or no work in it)."""
    comp = compiled(k.file, arch, tuple(defines))
    if k.name not in comp.functions:
        raise KeyError(f"{k.name} is not in {k.file} for {arch}")
    if k.unit == "weight":
        only = compiled(k.file, arch, tuple(defines) + (f"GEMV_BUCKET_ONLY={k.bucket}",))
        hot = parse.hot_loop(only.functions[k.name], lambda c: c.tensor > 0 or (c.shared_loads > 0 and c.fadd > 0))
    elif k.hot == "dot":
        hot = parse.hot_loop(comp.functions[k.name], lambda c: c.fmul > 0 and c.global_loads == 2 * c.fmul)
    else:
        hot = parse.hot_loop(comp.functions[k.name])
    if hot is None:
        raise ValueError(f"{k.name}: no loop in its SASS")
    res = comp.resources[k.name]
    units = units_per_iter(k, hot[1])
    if units <= 0:
        raise ValueError(f"{k.name}: its hot loop does no {k.unit} work")
    return Analysis(k, hot[1], res.registers, res.shared, units)


def issue_rate(a: Analysis, blocks: int) -> float:
    """Warp instructions a second the call's blocks issue (the occupancy rule in the module docstring)."""
    blocks = max(1, int(blocks))
    active = min(hw.SMS, blocks)
    resident = max(1, min(a.blocks_per_sm, -(-blocks // hw.SMS)))
    warps = resident * -(-a.kernel.threads // 32)
    busy = min(1.0, warps / (hw.ISSUE_SLOTS * hw.WARPS_TO_ISSUE))
    return active * hw.ISSUE_SLOTS * hw.CLOCK_HZ * busy


@dataclass(frozen=True)
class Call:
    """One launch: `units` of its kernel's work, `bytes` moved from HBM, `flops`, over `blocks` blocks; `l2_bytes`
    the operand bytes its blocks load (tiled kernels; 0 where the HBM bytes are the traffic). analysis None: a
    pass priced by its bytes alone. launched False: a part of the launch before it (a fused op's next part)."""
    analysis: Analysis | None
    units: float
    bytes: float
    flops: float
    blocks: int
    collective: bool = False
    l2_bytes: float = 0.0
    launched: bool = True


def tile_l2_bytes(n: int, k: int, tile_m: int, tile_n: int, row_tiles: int, x_bytes: float = 2.0,
                  w_bytes: float = 2.0) -> float:
    """The operand bytes a tiled GEMM's blocks load over K: `row_tiles` row tiles (over every head / expert
    pass) by ceil(N / tile_n) column tiles, each loading tile_m rows of x and tile_n columns of w (bytes an
    element as stored)."""
    return row_tiles * -(-n // tile_n) * k * (tile_m * x_bytes + tile_n * w_bytes)


def bounds(c: Call) -> dict:
    """issue / memory / l2 / tensor bounds, the predicted time (us) and which bound wins."""
    a = c.analysis
    issue = c.units * a.instr_per_unit / issue_rate(a, c.blocks) * 1e6 if a else 0.0
    memory = c.bytes / hw.HBM_BYTES_S * 1e6
    l2 = c.l2_bytes / hw.L2_BYTES_S * 1e6
    tensor = c.flops / hw.TENSOR_BF16_FLOPS * 1e6 if a and a.counts.tensor else 0.0
    b = {"issue": issue, "memory": memory, "l2": l2, "tensor": tensor}
    bound = max(b, key=b.get)
    extra = (hw.LAUNCH_US if c.launched else 0.0) + (hw.COLLECTIVE_US if c.collective else 0.0)
    return {"issue_bound_us": issue, "memory_bound_us": memory, "l2_bound_us": l2, "tensor_bound_us": tensor,
            "predicted_us": b[bound] + extra, "bound": bound}
