"""Random operands for bench/gpu_micro.py, made on the backend: bf16 weights (on cuda drawn on the device as
bf16 bit patterns, never through the host), FP8 / NVFP4 QWeights of random codes and scales, DSA attention
inputs. Values are random but finite: weights ~ N(0, std^2), e4m3 scales in [0.5, 2)."""
from __future__ import annotations

import math

import numpy as np

from cupyglm.backend.lanes import BF16
from cupyglm.backend.qweight import QWeight

FP8_BLOCK = (128, 128)                       # the published FP8 release's weight_block_size
NVFP4_GROUP = 16


def bf16_weight(ops, shape: tuple[int, ...], rng, std: float | None = None):
    """A bf16 array of `shape` on the backend (cuda: uint16 bit patterns), N(0, std^2), std = 1/sqrt(K)."""
    std = shape[-1] ** -0.5 if std is None else std
    if ops.name == "cuda":
        cp = ops.cupy
        x = cp.random.standard_normal(shape, dtype=cp.float32) * cp.float32(std)
        return (x.view(cp.uint32) >> 16).astype(cp.uint16)          # truncated to bf16: every value finite
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(BF16)


def _bytes(ops, shape, lo: int, hi: int, rng):
    """uint8 codes uniform in [lo, hi) of `shape` on the backend."""
    if ops.name == "cuda":
        return ops.cupy.random.randint(lo, hi, size=shape, dtype=np.int32).astype(np.uint8)
    return rng.integers(lo, hi, size=shape, dtype=np.uint8)


def qweight(ops, fmt: str, n: int, k: int, e: int | None, rng) -> QWeight:
    """A [N, K] (or [E, N, K]) FP8 / NVFP4 weight of random codes and scales on the backend."""
    lead = () if e is None else (e,)
    xp = ops.xp
    if fmt == "nvfp4":
        values = _bytes(ops, lead + (n, k // 2), 0, 256, rng)                 # every e2m1 nibble is a value
        scale = _bytes(ops, lead + (n, k // NVFP4_GROUP), 0x30, 0x40, rng)   # e4m3 0.5 .. 1.875
        scale2 = xp.full(lead or (1,), 1.0 / (3.0 * math.sqrt(k)), dtype=np.float32)
        return QWeight("nvfp4", lead + (n, k), values, scale, scale2)
    sign = _bytes(ops, lead + (n, k), 0, 2, rng) << 7
    values = _bytes(ops, lead + (n, k), 0, 0x7E, rng) | sign                # e4m3 without the NaN codes
    bn, bk = FP8_BLOCK
    scale = xp.full(lead + (-(-n // bn), -(-k // bk)), 1.0 / (64.0 * math.sqrt(k)), dtype=np.float32)
    return QWeight("fp8", lead + (n, k), values, scale, None, FP8_BLOCK)


def weight_bytes(w) -> int:
    """Bytes of a weight as stored (a QWeight: codes + scales)."""
    if isinstance(w, QWeight):
        return sum(int(a.nbytes) for a in (w.values, w.scale, w.scale2) if a is not None)
    return int(w.nbytes)


def attention_inputs(ops, cfg, rows: int, rng):
    """((qa, store, row_ids, counts, scale, chunk), bytes of the latent rows read): each of `rows` decode rows
    attends over index_topk distinct latent rows of a 64K-row store, as a DSA layer's decode call does."""
    h, r, w = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.index_topk
    total = max(65536, w * rows) if ops.name == "cuda" else 4 * w
    qa = bf16_weight(ops, (rows, h, r), rng, std=1.0)
    store = bf16_weight(ops, (total, r), rng, std=1.0)
    ids = np.stack([rng.choice(total, size=w, replace=False) for _ in range(rows)]).astype(np.int32)
    counts = np.full(rows, w, dtype=np.int32)
    return (qa, store, ops.xp.asarray(ids), ops.xp.asarray(counts), r ** -0.5, cfg.attn_chunk), rows * w * r * 2
