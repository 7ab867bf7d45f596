"""The tensor-core model's first statement, kept as the oracle of cupyglm/backend/tensor_core.py: the same
arithmetic (its module doc, steps 1-6) in int64 per term, slow and plainly exact. Tests compare the vectorised
model against it bit for bit; it is not used by the package.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.tensor_core import CANONICAL_NAN, DEFAULT_ARCH, K_STEP, Model, _bits16, _model


def _split_bf16(u: np.ndarray):
    """(sign, exponent with subnormals at -126, 8-bit significand, special) of bf16 bit patterns."""
    u = u.astype(np.int64)
    e = (u >> 7) & 0xFF
    m = u & 0x7F
    sig = np.where(e == 0, m, m | 0x80)
    exp = np.where(e == 0, -126, e - 127)
    return (u >> 15) & 1, exp, sig, e == 0xFF


def _split_f32(c: np.ndarray):
    u = np.asarray(c, dtype=np.float32).view(np.uint32).astype(np.int64)
    e = (u >> 23) & 0xFF
    m = u & 0x7FFFFF
    sig = np.where(e == 0, m, m | 0x800000)
    exp = np.where(e == 0, -126, e - 127)
    return (u >> 31) & 1, exp, sig, e == 0xFF


def _shift(v: np.ndarray, s: np.ndarray) -> np.ndarray:
    """v * 2^s for non-negative int64 v, cut toward zero when s < 0."""
    left = np.left_shift(v, np.clip(s, 0, 62))
    right = np.right_shift(v, np.clip(-s, 0, 63))
    return np.where(s >= 0, left, right)


def _round_rz_f32(total: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """float32 of total * 2^unit (int64 total), truncated toward zero; >= 2^128 in magnitude is infinity."""
    mag = np.abs(total)
    _, bitlen = np.frexp(mag.astype(np.float64))          # exact: mag < 2^53
    bitlen = bitlen.astype(np.int64)
    drop = np.maximum(np.maximum(bitlen - 24, -149 - unit), 0)
    kept = np.right_shift(mag, np.minimum(drop, 63))
    val = np.ldexp(kept.astype(np.float64), (unit + drop).astype(np.int64))
    val = np.where(val >= 2.0 ** 128, np.inf, val)
    out = np.where(total < 0, -val, val).astype(np.float32)
    return np.where(total == 0, np.float32(0.0), out)


def block_fma(a, b, c, model: Model) -> np.ndarray:
    """One block of the model: a, b [..., g] bf16 (g <= model.group), c [...] float32 -> [...] float32."""
    sa, ea, ma, xa = _split_bf16(_bits16(a))
    sb, eb, mb, xb = _split_bf16(_bits16(b))
    sc, ec, mc, xc = _split_f32(c)
    prod = ma * mb                                        # < 2^16, exact
    pexp = ea + eb - 14                                   # product = prod * 2^pexp
    live = prod != 0
    ab = np.where(live, ea + eb, -100000)
    top = np.maximum(ab.max(axis=-1), np.where(mc != 0, ec, -100000))
    unit = top - 23 - model.extra_bits                    # the cut: multiples of 2^unit survive
    pterm = _shift(prod, pexp - unit[..., None])
    psign = sa ^ sb
    total = np.where(psign == 1, -pterm, pterm).sum(axis=-1)
    cterm = _shift(mc, ec - 23 - unit)
    total = total + np.where(sc == 1, -cterm, cterm)
    out = _round_rz_f32(total, unit)
    return _specials(out, a, b, c, (sa, ea, ma, xa), (sb, eb, mb, xb), (sc, mc, xc))


def _specials(out, a, b, c, pa, pb, pc) -> np.ndarray:
    """NaN / infinity per step 6 of the module doc, over the finite result `out`."""
    sa, _, ma, xa = pa
    sb, _, mb, xb = pb
    sc, mc, xc = pc
    nan_a, nan_b = xa & (ma & 0x7F != 0), xb & (mb & 0x7F != 0)
    inf_a, inf_b = xa & ~nan_a, xb & ~nan_b
    zero_a, zero_b = (ma == 0) & ~xa, (mb == 0) & ~xb
    nan = (nan_a | nan_b | (inf_a & zero_b) | (inf_b & zero_a)).any(axis=-1) | (xc & ((mc & 0x7FFFFF) != 0))
    pinf = (inf_a | inf_b) & ~(nan_a | nan_b | zero_a | zero_b)
    sgn = sa ^ sb
    cinf = xc & ((mc & 0x7FFFFF) == 0)
    pos = (pinf & (sgn == 0)).any(axis=-1) | (cinf & (sc == 0))
    neg = (pinf & (sgn == 1)).any(axis=-1) | (cinf & (sc == 1))
    nan = nan | (pos & neg)
    res = np.where(pos, np.float32(np.inf), np.where(neg, np.float32(-np.inf), out)).astype(np.float32)
    bits = np.where(nan, CANONICAL_NAN, res.view(np.uint32))
    return bits.astype(np.uint32).view(np.float32)


def dot16(a, b, c, model: Model) -> np.ndarray:
    """One mma element per broadcast pair of a, b [..., 16] rows and c: the groups of model.group in k order."""
    a, b = _bits16(a), _bits16(b)
    if a.shape[-1] != K_STEP or b.shape[-1] != K_STEP:
        raise ValueError(f"tensor_core: one mma takes k = {K_STEP}, got {a.shape[-1]} and {b.shape[-1]}")
    acc = np.asarray(c, dtype=np.float32)
    groups = [(a[..., g:g + model.group], b[..., g:g + model.group]) for g in range(0, K_STEP, model.group)]
    for ga, gb in groups:
        acc = block_fma(ga, gb, acc, model)
    return acc


def mma_m16n8k16(a, b, c, arch: str = DEFAULT_ARCH) -> np.ndarray:
    """D = A @ B + C, one output element at a time: D[i, j] from row i of A and column j of B alone."""
    model = _model(arch)
    a, b, c = _bits16(a), _bits16(b), np.asarray(c, dtype=np.float32)
    out = np.empty(c.shape, np.float32)
    for i in range(16):
        for j in range(8):
            out[..., i, j] = dot16(a[..., i, :], b[..., :, j], c[..., i, j], model)
    return out


def mma_chain(a, b, c=None, arch: str = DEFAULT_ARCH) -> np.ndarray:
    """D[M,N] = A[M,K] @ B[K,N] (+ C): each element's chain of 16-wide steps in ascending k, element by element."""
    model = _model(arch)
    a, b = _bits16(a), _bits16(b)
    (rows, k), cols = a.shape, b.shape[1]
    if b.shape[0] != k or k % K_STEP:
        raise ValueError(f"mma_chain: A {a.shape} @ B {b.shape}: K must agree and be a multiple of {K_STEP}")
    out = np.zeros((rows, cols), np.float32) if c is None else np.array(c, dtype=np.float32)
    for i in range(rows):
        for j in range(cols):
            for k0 in range(0, k, K_STEP):
                out[i, j] = dot16(a[i, k0:k0 + K_STEP], b[k0:k0 + K_STEP, j], out[i, j], model)
    return out
