"""Quantised linear weights as the checkpoint stores them, and their NumPy twin (the reference dequantisation).

A QWeight keeps the packed bytes and scales exactly as stored (never expanded in memory on the device); the
kernels (cuda_src/dequant.cuh) dequantise in registers. The twin here computes each weight value by the same
fixed sequence of IEEE fp32 operations, so the reference's gemm(x, dequant(w)) has the kernels' bits:
  fp8    w = e4m3(v) * weight_scale_inv[n // bn, k // bk]                  (one rounding)
  nvfp4  w = (e2m1(q) * e4m3(weight_scale[n, k // 16])) * weight_scale_2   (the first product is exact)
Nibble order (ModelOpt): byte i of a row holds element 2i in its low 4 bits, element 2i + 1 in its high 4 bits.
Both scales multiply (FP8's `weight_scale_inv` is the inverse of the quantiser's scale).

Layouts (a plain projection has E = 1 in the kernels' view; `shape` is the logical [N, K] or [E, N, K]):
  fp8    values [.., N, K] uint8 e4m3 codes, scale [.., ceil(N / bn), ceil(K / bk)] float32
  nvfp4  values [.., N, K / 2] uint8 (two e2m1 codes), scale [.., N, K / 16] uint8 e4m3 codes, scale2 [E or 1] f32
"""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

FORMATS = ("fp8", "nvfp4")
NVFP4_GROUP = 16

# e4m3fn codes -> float32 (NaN at S.1111.111), and e2m1 codes -> float32: exact tables.
E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
_E2M1_MAG = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E2M1 = np.concatenate([_E2M1_MAG, -_E2M1_MAG]).astype(np.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class QWeight:
    fmt: str                        # fp8 | nvfp4
    shape: tuple[int, ...]          # logical [N, K] or [E, N, K]
    values: object                  # uint8 array (numpy or cupy), layout above
    scale: object                   # float32 (fp8) or uint8 e4m3 codes (nvfp4)
    scale2: object = None           # nvfp4: float32 [E] (a plain projection: [1])
    block: tuple[int, int] = (1, NVFP4_GROUP)    # fp8: (bn, bk) of weight_block_size

    def __post_init__(self):
        if self.fmt not in FORMATS:
            raise ValueError(f"QWeight: unknown format {self.fmt!r} (known: {', '.join(FORMATS)})")
        n, k = self.shape[-2:]
        lead = tuple(self.shape[:-2])
        if self.fmt == "fp8":
            bn, bk = self.block
            want = {"values": (lead + (n, k), np.uint8), "scale": (lead + (-(-n // bn), -(-k // bk)), np.float32)}
        else:
            if k % NVFP4_GROUP:
                raise ValueError(f"QWeight nvfp4: K={k} is not a multiple of {NVFP4_GROUP}")
            want = {"values": (lead + (n, k // 2), np.uint8), "scale": (lead + (n, k // NVFP4_GROUP), np.uint8),
                    "scale2": ((lead[0] if lead else 1,), np.float32)}
        for field, (shape, dtype) in want.items():
            a = getattr(self, field)
            if tuple(a.shape) != shape or a.dtype != np.dtype(dtype):
                raise ValueError(f"QWeight {self.fmt} {self.shape}: {field} must be {np.dtype(dtype)} {shape}, "
                                 f"got {a.dtype} {tuple(a.shape)}")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.values, self.scale, self.scale2) if a is not None)

    def to(self, xp) -> "QWeight":
        """The same weight with its arrays as `xp` arrays (numpy, or cupy on the device), bytes unchanged."""
        conv = (lambda a: a if a is None else xp.asarray(np.ascontiguousarray(a)) if isinstance(a, np.ndarray)
                else xp.ascontiguousarray(a))
        return dataclasses.replace(self, values=conv(self.values), scale=conv(self.scale), scale2=conv(self.scale2))

    def __getitem__(self, e: int) -> "QWeight":
        """Expert e of a stack (the reference's gemm_grouped reads w[e])."""
        if self.ndim != 3:
            raise TypeError("QWeight: only an expert stack [E, N, K] is indexed")
        e = int(e)
        s2 = None if self.scale2 is None else self.scale2[e:e + 1]
        return dataclasses.replace(self, shape=self.shape[1:], values=self.values[e], scale=self.scale[e],
                                   scale2=s2)

    def __array__(self, dtype=None, copy=None):
        """The NumPy twin: the float32 weight values the kernels compute in registers (reference only)."""
        w = dequant(self)
        return w if dtype is None else w.astype(dtype, copy=False)


def stack(parts: list[QWeight], xp=np) -> QWeight:
    """Equal-shaped quantised projections (the experts) as one [E, N, K] stack."""
    first = parts[0]
    if any(p.fmt != first.fmt or p.shape != first.shape or p.block != first.block for p in parts):
        raise ValueError("QWeight stack: the experts differ in format, shape or block")
    s2 = None if first.scale2 is None else xp.concatenate([p.scale2 for p in parts])
    return QWeight(first.fmt, (len(parts),) + first.shape, xp.stack([p.values for p in parts]),
                   xp.stack([p.scale for p in parts]), s2, first.block)


def dequant(q: QWeight) -> np.ndarray:
    """float32 [.., N, K] of a numpy-held QWeight, by the kernels' operation sequence."""
    n, k = q.shape[-2:]
    values, scale = np.asarray(q.values), np.asarray(q.scale)
    if q.fmt == "fp8":
        bn, bk = q.block
        s = np.repeat(np.repeat(scale, bn, axis=-2)[..., :n, :], bk, axis=-1)[..., :k]
        return E4M3[values] * s
    codes = np.empty(values.shape[:-1] + (k,), dtype=np.uint8)
    codes[..., 0::2] = values & 15                    # element 2i: the low nibble
    codes[..., 1::2] = values >> 4
    s = np.repeat(E4M3[scale], NVFP4_GROUP, axis=-1)
    s2 = np.asarray(q.scale2, dtype=np.float32)
    s2 = s2.reshape((-1, 1, 1) if q.ndim == 3 else (1, 1))
    return (E2M1[codes] * s) * s2


# ---- quantisers (make-tiny, bench): float32 weights -> the stored format --------------------------------------
def quantize_fp8(w: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """[N, K] float32 -> (e4m3 codes [N, K] uint8, weight_scale_inv [ceil(N/bn), ceil(K/bk)] f32): per block
    scale = amax / 448, values rounded to nearest e4m3."""
    n, k = w.shape
    bn, bk = block
    sn, sk = -(-n // bn), -(-k // bk)
    pad = np.zeros((sn * bn, sk * bk), np.float32)
    pad[:n, :k] = w
    amax = np.abs(pad.reshape(sn, bn, sk, bk)).max(axis=(1, 3))
    scale = np.where(amax > 0, amax / np.float32(448.0), np.float32(1.0)).astype(np.float32)
    full = np.repeat(np.repeat(scale, bn, 0), bk, 1)[:n, :k]
    codes = (w / full).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return np.ascontiguousarray(codes), scale


def quantize_nvfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[N, K] float32 -> (packed e2m1 [N, K/2] uint8, weight_scale [N, K/16] e4m3 codes, weight_scale_2 [] f32):
    tensor scale = amax / (6 * 448), group scale = e4m3(group amax / 6 / tensor scale), values to nearest e2m1."""
    n, k = w.shape
    amax = float(np.abs(w).max())
    s2 = np.float32(amax / (6.0 * 448.0) if amax > 0 else 1.0)
    g = w.reshape(n, k // NVFP4_GROUP, NVFP4_GROUP)
    gs = (np.abs(g).max(axis=-1) / np.float32(6.0) / s2).astype(ml_dtypes.float8_e4m3fn)
    gsf = gs.astype(np.float32) * s2
    x = g / np.where(gsf > 0, gsf, np.float32(1.0))[..., None]
    codes = np.abs(np.abs(x)[..., None] - _E2M1_MAG).argmin(axis=-1).astype(np.uint8)    # nearest magnitude
    codes = (codes | np.where(x < 0, 8, 0).astype(np.uint8)).reshape(n, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(packed), np.ascontiguousarray(gs.view(np.uint8)), np.array(s2, dtype=np.float32)
