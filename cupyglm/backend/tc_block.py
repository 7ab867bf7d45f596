"""One block of the tensor-core model (backend/tensor_core.py, steps 1-6 of its doc) over whole arrays at once.

A block's terms lie along axis 0 of [g + 1, ...] arrays: g products a_j * b_j, then the accumulator c. The
reference exponent X (biased by 2 * BIAS) is the max of int16 exponent sums; each term is scaled by
2^(23 + extra - X), which puts the cut unit at 1, and cast to an integer, which truncates toward zero: the cut.
Why that is exact, term by term:
  - a bf16 x bf16 product has at most 16 significant bits: exact in float64 always, in float32 for X in FAST;
  - a product at ea + eb <= X has a significand product below 65025 / 2^14, so its scaled term is below
    65025 * 2^(9 + extra) and g of them fit int32 (`_sum_dtype`); c below 2^(X + 1) scales below 2^(24 + extra);
  - the integer total is below 2^33, so total * 2^(X - 23 - extra) is exact in float64;
  - round toward zero to fp32: clearing float64's 29 low significand bits is exact truncation at or above
    2^-126, and a value at or above 2^128 stays so and casts to infinity; below 2^-126 the cut is at 2^-149.
Fast path (float32 products and scales, no subnormal output possible): a and b finite, c without subnormals
and every element's X in FAST or no live term; any other block runs the general path in float64, which also
takes the inf/NaN results from an IEEE sum of the same terms (NaN and infinities follow step 6 exactly).
"""
from __future__ import annotations

import numpy as np

BIAS = 127                      # per operand: live bf16 exponents (-126..128) become their fields 1..255
NONE = -16384                   # a zero operand's exponent: any sum with it is negative (no live term)
INF_EXP = 128 + BIAS            # exponent of a bf16 inf/NaN
FAST = (-101 + 2 * BIAS, 125 + 2 * BIAS)    # X range where float32 products, scales and outputs are exact
TABLE = 2 * INF_EXP + 4         # biased X below this; negative X (no live term) clips to entry 0
_MASK_29 = np.uint64(~((1 << 29) - 1) & 0xFFFFFFFFFFFFFFFF)
_TINY = 2.0 ** -126


def _f32_exponents() -> np.ndarray:
    """By the top 9 bits (sign, exponent field); a field of 0 (zero, subnormal) is no term: the fast path only."""
    field = np.arange(512) & 0xFF
    return np.where(field == 0, NONE, field - 127 + 2 * BIAS).astype(np.int16)


_F32_EXP = _f32_exponents()
_X = np.arange(TABLE) - 2 * BIAS
_SCALE64 = {e: np.ldexp(1.0, 23 + e - _X) for e in (1, 2, 3)}
_UNIT64 = {e: np.ldexp(1.0, _X - 23 - e) for e in (1, 2, 3)}
_SCALE32 = {e: np.ldexp(np.float32(1.0), np.clip(23 + e - _X, -126, 127)).astype(np.float32) for e in (1, 2, 3)}


def operand(bits: np.ndarray, out: tuple | None = None):
    """bf16 bit patterns -> (float32 values, int16 biased exponents: subnormals at -126, zeros NONE, whether all
    are finite), written into out = (uint32, int16) arrays of bits' shape when given."""
    values, exps = out or (np.empty(bits.shape, np.uint32), np.empty(bits.shape, np.int16))
    np.left_shift(bits, 16, out=values, dtype=np.uint32)
    field = exps.view(np.uint16)
    np.bitwise_and(bits, 0x7FFF, out=field)
    if field.size == 0:
        return values.view(np.float32), exps, True
    finite = int(field.max()) < 0x7F80
    small = int(field.min()) < 0x80                 # a zero or a subnormal
    zero = field == 0 if small else None
    np.right_shift(field, 7, out=field)             # the exponent field is the biased exponent (BIAS = 127)
    if small:
        np.maximum(field, 1, out=field)             # a subnormal's exponent is the field's 1
        np.putmask(exps, zero, NONE)
    return values.view(np.float32), exps, finite


def rows_first(x: np.ndarray) -> np.ndarray:
    """A C-ordered copy of a 2-D array (x itself when it is one), made by column blocks: a transposed view's
    copy reads whole cache lines that way."""
    if x.flags.c_contiguous:
        return x
    out = np.empty(x.shape, x.dtype)
    for n0 in range(0, x.shape[1], 256):
        out[:, n0:n0 + 256] = x[:, n0:n0 + 256]
    return out


def has_subnormal(c: np.ndarray) -> bool:
    return bool(((np.abs(c) < np.float32(_TINY)) & (c != 0)).any())


def _sum_dtype(group: int, extra: int):
    return np.int32 if group * 65025 * 2 ** (9 + extra) < 2 ** 31 else np.int64


def _tables(extra: int):
    if extra not in _SCALE64:
        raise ValueError(f"tensor_core: {extra} extra alignment bits are not tabled (1 to 3 are)")
    return _SCALE32[extra], _SCALE64[extra], _UNIT64[extra]


class Buffers:
    """The [g + 1, *shape] term arrays of the fast path, reused across the blocks of one tile."""

    def __init__(self, g: int, shape: tuple, extra: int):
        self.exps = np.empty((g + 1,) + shape, np.int16)
        self.terms = np.empty((g + 1,) + shape, np.float32)
        self.ints = np.empty((g + 1,) + shape, _sum_dtype(g, extra))


def block(av, bv, ae, be, c: np.ndarray, extra: int, fast_ok: bool, bufs: Buffers | None = None) -> np.ndarray:
    """One block: av, bv [g, ...] float32 values and ae, be their exponents (broadcasting to [g, *c.shape]),
    c float32 -> float32 of c's shape. `fast_ok` says a and b are finite and c has no subnormals."""
    g = av.shape[0]
    if fast_ok:
        bufs = bufs or Buffers(g, c.shape, extra)
        out = fast(av, bv, ae, be, c, extra, bufs)
        if out is not None:
            return out
    return general(av, bv, ae, be, c, extra)


def _reference(exps: np.ndarray) -> np.ndarray:
    return np.maximum.reduce(exps, axis=0)


def fast(av, bv, ae, be, c, extra, bufs: Buffers):
    """float32 products and scales; None where some element's X leaves FAST (the general path takes the block)."""
    g = av.shape[0]
    np.add(ae, be, out=bufs.exps[:g])
    np.take(_F32_EXP, c.view(np.uint32) >> 23, out=bufs.exps[g, ...], mode="clip")
    x = _reference(bufs.exps)
    lo, hi = FAST
    if int(x.max()) > hi or (int(x.min()) < lo and ((x < lo) & (x >= 0)).any()):
        return None
    scale32, _, unit64 = _tables(extra)
    terms, ints = bufs.terms, bufs.ints
    np.multiply(av, bv, out=terms[:g])
    terms[g] = c
    np.multiply(terms, np.take(scale32, x, mode="clip"), out=ints, casting="unsafe")
    total = np.add(np.add.reduce(ints[:g], axis=0, dtype=ints.dtype), ints[g], dtype=np.float64)
    total *= np.take(unit64, x, mode="clip")
    return _truncate_normal(total)


def general(av, bv, ae, be, c, extra):
    """float64 terms: any exponents, subnormal inputs and outputs, inf and NaN."""
    g = av.shape[0]
    shape = (g + 1,) + c.shape
    exps = np.empty(shape, np.int16)
    np.add(ae, be, out=exps[:g])
    exps[g] = _f32_exponent_exact(c)
    x = _reference(exps)
    _, scale64, unit64 = _tables(extra)
    terms = np.empty(shape, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        np.multiply(av, bv, out=terms[:g], dtype=np.float64)
        terms[g] = c
        ints = np.multiply(terms, np.take(scale64, x, mode="clip"), out=np.empty(shape, np.int64), casting="unsafe")
        total = (ints[:g].sum(axis=0) + ints[g]).astype(np.float64)
        out = _truncate_any(total * np.take(unit64, x, mode="clip"))
        ieee = np.add.reduce(terms, axis=0)         # finite terms stay below 2^261: non-finite only per step 6
        special = ~np.isfinite(ieee)
        if special.any():
            out = np.where(special, ieee.astype(np.float32), out)
            out.view(np.uint32)[np.isnan(ieee)] = 0x7FFFFFFF
    return out


def _f32_exponent_exact(c: np.ndarray) -> np.ndarray:
    u = c.view(np.uint32)
    field = ((u >> 23) & 0xFF).astype(np.int16)
    exp = np.where(field == 0, -126, field - 127) + 2 * BIAS
    return np.where(u & 0x7FFFFFFF == 0, NONE, exp).astype(np.int16)


def _truncate_normal(v: np.ndarray) -> np.ndarray:
    """float64 -> float32 toward zero where every nonzero |v| >= 2^-126 (v is consumed)."""
    v = np.asarray(v)
    np.bitwise_and(v.view(np.uint64), _MASK_29, out=v.view(np.uint64))
    with np.errstate(over="ignore"):
        return v.astype(np.float32)


def _truncate_any(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v)
    small = np.abs(v) < _TINY
    tiny = np.trunc(v[small] * 2.0 ** 149) * 2.0 ** -149
    out = _truncate_normal(v)
    out[small] = tiny.astype(np.float32)
    return out
