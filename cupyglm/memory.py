"""Every array a rank holds, as names, shapes and logical dtypes: the one place that knows each array's bytes.

The memory plan (`cupyglm.engine.plan`) sums these descriptions; the KV store and the per-sequence state
allocate from them, so what the plan counts and what gets allocated cannot drift. A logical dtype (`BF16`,
`FP32`) is stored as the backend stores it: `storage_of(ops)` reads the widths from the backend itself, so the
plan of every backend counts the bytes that backend allocates.

    weights      every tensor of the split table at its shard shape (the MTP layer's only when it is built)
    KV pages     per KV layer: latent rows [pages * page_tokens, kv_lora_rank] bf16 and pooled keys
                 [pages * page_tokens / index_kpool, index_head_dim] bf16, each with its own page stride
    state        per sequence: per KDA layer the recurrent state [H/tp, K, K] fp32 and the conv window
                 [taps - 1, 3 H/tp K] bf16; per KV layer the incomplete pool's index keys and gates
                 ([kpool, I] pairs, written in place: views of the KV store's tail slots, `index_tail_array`)
                 bf16; with MTP the pending row [D] bf16
    kv host     with CUPYGLM_KV_HOST: latent rows in host memory; on the device the gather's slots [S, R] bf16,
                 their rows [S] i32 and a mark per host row [N] i32
    prompt cache the kept-state arena: [kept pages, page bytes] u8 (device, or host with CUPYGLM_HOST_CACHE)
    vision       rank 0 with the tower on: every tower tensor [GEMM shape] bf16 on the device; with CUPYGLM_VISION_HOST
                 the tensors in host memory and two device staging slots [largest unit's elements] bf16
    cuda graphs  with CUPYGLM_CUDA_GRAPHS: the KDA seats (per KDA layer 16 states and windows, per bucket the call's
                 tables) and per bucket the graphs' inputs and outputs per layer (engine/plan_graphs.py sums them)
"""
from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np

from cupyglm.checkpoint.names import VISION_PREFIX, all_specs, layer_specs, vision_specs
from cupyglm.config import ModelConfig
from cupyglm.vision.staging import padded, tower_units

BF16 = "bf16"
FP32 = "fp32"
U8 = "u8"
I32 = "i32"
_BF16_NAN_BITS = 0x7FC0                 # the quiet NaN of bf16, for storage that keeps bf16 as uint16 bits


@dataclasses.dataclass(frozen=True)
class Storage:
    """The dtype each logical dtype is stored in on one backend."""
    bf16: np.dtype
    fp32: np.dtype = np.dtype(np.float32)

    def dtype(self, kind: str) -> np.dtype:
        if kind == BF16:
            return self.bf16
        if kind == FP32:
            return self.fp32
        if kind == U8:
            return np.dtype(np.uint8)
        if kind == I32:
            return np.dtype(np.int32)
        raise ValueError(f"unknown logical dtype {kind!r} (bf16, fp32, u8 or i32)")

    def itemsize(self, kind: str) -> int:
        return self.dtype(kind).itemsize

    def describe(self) -> str:
        return f"bf16 stored in {self.bf16.itemsize} bytes"


BF16_STORAGE = Storage(np.dtype(ml_dtypes.bfloat16))      # 16-bit storage: 2 bytes a bf16 value
FP32_STORAGE = Storage(np.dtype(np.float32))             # bf16 values held in float32 arrays: 4 bytes

_STORAGE: dict[type, Storage] = {}


def storage_of(ops) -> Storage:
    """A backend's storage, read from the backend: a bf16 value takes the bytes of the array `ops.weight`
    makes of a bf16 tensor (every bf16 array of a backend is stored alike). Cached per ops class."""
    cls = type(ops)
    if cls not in _STORAGE:
        probe = ops.weight(np.zeros((1,), dtype=ml_dtypes.bfloat16))
        _STORAGE[cls] = Storage(np.dtype(probe.dtype))
    return _STORAGE[cls]


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    name: str
    shape: tuple[int, ...]
    kind: str                           # BF16 | FP32 | U8 | I32

    def nbytes(self, storage: Storage) -> int:
        return math.prod(self.shape) * storage.itemsize(self.kind)


def total_bytes(specs, storage: Storage) -> int:
    return sum(s.nbytes(storage) for s in specs)


def alloc(xp, spec: ArraySpec, storage: Storage, poison: bool = False):
    """A new array of `spec` in the backend's storage: zeros, or NaN everywhere with poison."""
    dtype = storage.dtype(spec.kind)
    if not poison:
        return xp.zeros(spec.shape, dtype=dtype)
    fill = _BF16_NAN_BITS if dtype.kind in "iu" else np.nan
    return xp.full(spec.shape, fill, dtype=dtype)


# ---- weights ----------------------------------------------------------------------------------------------------

def weight_arrays(cfg: ModelConfig, tp: int, mtp: bool = False, quant=None) -> list[ArraySpec]:
    """One rank's weights as the model holds them: every tensor of the split table at its shard shape, in its
    stored dtype (bf16, or fp32 where the checkpoint stores F32); the MTP layer's tensors only when the MTP head
    is built. quant (checkpoint.quant.QuantLayout): its projections as stored, packed values (u8) + scales."""
    from cupyglm.checkpoint.quant import held_arrays

    skip = set()
    if cfg.mtp_layer is not None and not mtp:
        skip = {s.name for s in layer_specs(cfg, cfg.mtp_layer)}
    out = []
    for s in all_specs(cfg):
        if s.name in skip:
            continue
        if quant is not None and s.name in quant.names:
            held = held_arrays(s, quant.scheme, tp)                 # packed values (u8) and scales as stored
            out += [ArraySpec(n, shape, FP32 if dt == "F32" else U8) for n, shape, dt in held]
        else:
            out.append(ArraySpec(s.name, s.shard_shape(tp), FP32 if s.dtype == "F32" else BF16))
    return out


# ---- the vision tower (rank 0) ---------------------------------------------------------------------------------

def vision_arrays(cfg: ModelConfig, host: bool = False) -> list[ArraySpec]:
    """The tower's device arrays (none without one): every tensor, or with `host` (CUPYGLM_VISION_HOST) the two
    staging slots of the largest unit (`vision.staging.tower_units`) while the tensors live in host memory."""
    tensors = [ArraySpec(s.name, s.shape, BF16) for s in vision_specs(cfg)]
    if not host or not tensors:
        return tensors
    per_row = {s.name[len(VISION_PREFIX):]: math.prod(s.shape[1:]) for s in tensors}
    slot = max(sum(padded((hi - lo) * per_row[n]) for n, lo, hi in unit) for unit in tower_units(cfg.vision))
    return [ArraySpec(f"vision.stage.{i}", (slot,), BF16) for i in range(2)]                # [largest unit] bf16


def vision_host_arrays(cfg: ModelConfig) -> list[ArraySpec]:
    """With CUPYGLM_VISION_HOST: the tower's tensors in host memory (pinned on cuda)."""
    return [ArraySpec(s.name, s.shape, BF16) for s in vision_specs(cfg)]


# ---- KV pages ---------------------------------------------------------------------------------------------------

def kv_arrays(cfg: ModelConfig, num_pages: int, page_tokens: int, kv_host: bool = False) -> list[ArraySpec]:
    """The KV store's arrays, per KV layer; with kv_host the pooled keys only (latent rows in host memory)."""
    if page_tokens <= 0 or page_tokens % cfg.index_kpool:
        raise ValueError(f"page_tokens must be a positive multiple of {cfg.index_kpool}, got {page_tokens}")
    rows, pools = num_pages * page_tokens, num_pages * page_tokens // cfg.index_kpool
    out = []
    for layer in cfg.kv_layers:
        if not kv_host:
            out.append(latent_array(cfg, layer, rows))
        out.append(pooled_array(cfg, layer, pools))
    return out


def latent_array(cfg: ModelConfig, layer: int, rows: int) -> ArraySpec:
    return ArraySpec(f"kv.latent.{layer}", (rows, cfg.kv_lora_rank), BF16)        # [pages * page_tokens, R]


def pooled_array(cfg: ModelConfig, layer: int, pools: int) -> ArraySpec:
    return ArraySpec(f"kv.pooled.{layer}", (pools, cfg.index_head_dim), BF16)     # [pages * page_tokens / 4, I]


def host_latent_arrays(cfg: ModelConfig, num_pages: int, page_tokens: int) -> list[ArraySpec]:
    """With kv_host: the latent rows kept in host memory."""
    return [latent_array(cfg, layer, num_pages * page_tokens) for layer in cfg.kv_layers]


def row_cache_rows(cfg: ModelConfig) -> int:
    """Rows each KV layer's row cache holds (decode and verify segments): 4 x index_topk (8,192 full, 128 tiny)."""
    return 4 * cfg.index_topk


def gather_arrays(cfg: ModelConfig, rows: int, slots: int) -> list[ArraySpec]:
    """With kv_host: the gather's device buffers (kv/host_rows.py): slots shared by every KV layer, a row cache
    per KV layer."""
    c = row_cache_rows(cfg)
    out = [ArraySpec("kv_host.slots", (slots, cfg.kv_lora_rank), BF16),      # [slots, R] gathered rows
           ArraySpec("kv_host.slot_row", (slots,), I32),                     # [slots] the row in each slot
           ArraySpec("kv_host.marks", (rows,), I32),                         # [host rows] a row's slot, else -1
           ArraySpec("kv_host.slot_miss", (slots,), I32)]                    # [slots] 1 where the row missed
    for layer in cfg.kv_layers:
        out += [ArraySpec(f"kv_host.cache.{layer}", (c, cfg.kv_lora_rank), BF16),   # [C, R] cached rows
                ArraySpec(f"kv_host.cache_rows.{layer}", (c,), I32),                # [C] row of each entry, or -1
                ArraySpec(f"kv_host.cmark.{layer}", (rows,), I32)]                  # [host rows] entry, or -1
    return out


# ---- per-sequence state -----------------------------------------------------------------------------------------

def kda_state_arrays(cfg: ModelConfig, tp: int, layer: int) -> tuple[ArraySpec, ArraySpec]:
    """A KDA layer's fixed state of one sequence: the recurrent state and the conv window."""
    h, k = cfg.kda_num_heads // tp, cfg.kda_head_dim
    return (ArraySpec(f"state.kda.{layer}", (h, k, k), FP32),                         # [H_rank, V, K] fp32
            ArraySpec(f"state.conv.{layer}", (cfg.kda_conv_size - 1, 3 * h * k), BF16))  # [taps - 1, 3 H_rank K]


def state_arrays(cfg: ModelConfig, tp: int, mtp: bool = False) -> list[ArraySpec]:
    """One sequence's state at its largest: KDA states and windows, each KV layer's incomplete-pool tail
    (index keys and gates: a fixed kpool-row pair, written in place), the MTP pending row when the MTP head is
    built."""
    out = [a for layer in cfg.kda_layers for a in kda_state_arrays(cfg, tp, layer)]
    tail = (cfg.index_kpool, cfg.index_head_dim)
    layers = cfg.kv_layers if mtp else cfg.dsa_layers
    for layer in layers:
        out += [ArraySpec(f"state.tail_ik.{layer}", tail, BF16), ArraySpec(f"state.tail_ig.{layer}", tail, BF16)]
    if mtp:
        out.append(ArraySpec("state.mtp_pending", (cfg.hidden_size,), BF16))
    return out


def index_tail_array(cfg: ModelConfig, slots: int, layers: tuple[int, ...]) -> ArraySpec:
    """The KV store's index tails (kv/index_tails.py): per layer of `layers` the index keys and the gates of
    `slots` sequences' incomplete pools, one array; a slot is one sequence's state.tail_ik/tail_ig pair of
    `state_arrays` (the plan counts `parallel` slots inside the states' share of the scratch)."""
    # [2 (ik, ig), layers, slots, kpool, I] bf16
    return ArraySpec("kv.index_tails", (2, len(layers), slots, cfg.index_kpool, cfg.index_head_dim), BF16)


# ---- prompt cache -----------------------------------------------------------------------------------------------

def prompt_cache_arena(cache_bytes: int, page_bytes: int) -> ArraySpec:
    """The kept-state arena: whole kept pages of `page_bytes` within `cache_bytes` (kept states are leased pages)."""
    if page_bytes <= 0:
        raise ValueError(f"kept page bytes must be positive, got {page_bytes}")
    return ArraySpec("prompt_cache.arena", (max(0, cache_bytes) // page_bytes, page_bytes), U8)  # [pages, B] u8


# ---- CUDA graphs ------------------------------------------------------------------------------------------------

def graph_slot_arrays(cfg: ModelConfig, tp: int, slots: int, buckets: tuple[int, ...]) -> list[ArraySpec]:
    """The KDA seats of captured decode calls (engine/kda_slots.py), exactly: per KDA layer `slots` recurrent states
    and conv windows; per bucket B the call's table, its all-padding twin and kda_step_slots' counters."""
    h, k = cfg.kda_num_heads // tp, cfg.kda_head_dim
    out = []
    for layer in cfg.kda_layers:
        taps = cfg.kda_conv_size - 1
        out += [ArraySpec(f"graphs.slot_state.{layer}", (slots, h, k, k), FP32),          # [n, H, K, K]
                ArraySpec(f"graphs.slot_conv.{layer}", (slots, taps, 3 * h * k), BF16)]   # [n, taps - 1, 3HK]
    for b in buckets:
        out += [ArraySpec(f"graphs.seg.{b}", (b, 3), I32),         # [B, 3] (row0, n, slot) per sequence
                ArraySpec(f"graphs.warm.{b}", (b, 3), I32),        # [B, 3] every row padding
                ArraySpec(f"graphs.done.{b}", (b, h), I32)]        # [B, H] the step's counters
    return out


def graph_stream_arrays(cfg: ModelConfig, b: int, tag: str) -> list[ArraySpec]:
    """One set of a captured layer's inputs or outputs for bucket b: the streams and the next sublayer's input."""
    d, s = cfg.hidden_size, cfg.hc_mult
    return [ArraySpec(f"graphs.{tag}.X", (b, s, d), BF16),         # [B, 4, D] streams
            ArraySpec(f"graphs.{tag}.h", (b, d), BF16),            # [B, D] normed input of the next sublayer
            ArraySpec(f"graphs.{tag}.post", (b, s), FP32),         # [B, 4] hc_post gates
            ArraySpec(f"graphs.{tag}.comb", (b, s, s), FP32)]      # [B, 4, 4] Sinkhorn mix
