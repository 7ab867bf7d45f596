"""The tensor core's arithmetic, exactly: `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` as a CPU model.

One instruction computes D[16x8] = A[16x16] @ B[16x8] + C (bf16 A and B, fp32 C and D). Each output element is
an inner product of 16 bf16 pairs plus its accumulator, computed (per the architecture's Model) as:

  1. split the 16 products into `group` consecutive products per block (16 on sm_90: one block; 8 on sm_80:
     two blocks, the second taking the first's rounded result as its accumulator);
  2. in a block, every product is exact (bf16 x bf16 fits 16 significand bits); zero products take no part;
  3. the block's reference exponent is X = max(max over products of ea + eb, exponent of c), where ea, eb are
     the inputs' exponents (subnormals at -126) and c's is its fp32 exponent (subnormals at -126); a product's
     significand ma * mb lies in [1, 4), so the product sits below 2^(X + 2);
  4. every term (products and c) is cut toward zero, in magnitude, to a multiple of 2^(X - 23 - extra_bits):
     `extra_bits` alignment bits beyond fp32's 23 fraction bits (2 on sm_90, 1 on sm_80); shifted-out bits
     are lost, no sticky bit;
  5. the cut terms are added exactly (signed), and the sum is truncated (round toward zero) to fp32, keeping
     fp32 subnormals; a magnitude of 2^128 or more is infinity (as the published model has it);
  6. NaN anywhere, inf * 0, or +inf with -inf gives NaN (0x7fffffff); otherwise an infinite term gives that
     infinity; an exact zero sum is +0.

Parameters (group 16, 2 extra bits, truncation, final round toward zero, subnormals kept for sm_90) are those
of the public models of Khattak and Mikaitis ("Accurate Models of NVIDIA Tensor Cores", arXiv 2512.07004;
models/H100TC.m, H200TC.m over models/tools/GEMM.m and Generic_BFMA_TC.m); steps 3-4 restate that model's
alignment: its one extra bit when the largest product's significand is >= 2 is the same cut measured from
X. One known difference: where every term lies below 2^-126 the published model first rounds each product to
fp32; here products stay exact (no hardware data cover that range).

Arrays: bf16 inputs as ml_dtypes.bfloat16 or their uint16 bit patterns; fp32 as float32. The arithmetic runs
over whole arrays in backend/tc_block.py (whose doc says why each step is exact); tests/tc_oracle.py states
the same model term by term in int64, and the two agree bit for bit.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cupyglm.backend import tc_block
from cupyglm.backend.lanes import BF16

K_STEP = 16                     # the k of one mma.m16n8k16
TILE = 4096                     # outputs per tile of mma_chain: its [group + 1, tile] term arrays stay in cache
TILE_ROWS = 16                  # rows of A per tile
CANONICAL_NAN = np.uint32(0x7FFFFFFF)


@dataclasses.dataclass(frozen=True)
class Model:
    arch: str                   # "sm_90"
    group: int                  # products aligned together in one block
    extra_bits: int             # alignment bits kept beyond fp32's 23 fraction bits
    confirmed: bool             # published hardware validation covers this architecture
    source: str                 # where the parameters come from


MODELS = {
    "sm_90": Model("sm_90", 16, 2, True, "H100TC.m / H200TC.m, validated on H100 and H200 (arXiv 2512.07004)"),
    "sm_80": Model("sm_80", 8, 1, True, "A100TC.m, validated on A100 (arXiv 2512.07004)"),
    "sm_120": Model("sm_120", 16, 2, False, "RTXPRO6000TC.m (the B200 parameters); no published hardware vectors"),
}
DEFAULT_ARCH = "sm_90"


def model_for(arch: str) -> Model | None:
    return MODELS.get(arch)


def _bits16(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == BF16:
        return x.view(np.uint16)
    if x.dtype != np.uint16:
        raise ValueError(f"tensor_core: bf16 operands must be bfloat16 or uint16 bit patterns, got {x.dtype}")
    return x


def block_fma(a, b, c, model: Model) -> np.ndarray:
    """One block of the model: a, b [..., g] bf16 (g <= model.group), c [...] float32 -> [...] float32."""
    a, b = _bits16(a), _bits16(b)
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"tensor_core: a block takes as many a as b, got {a.shape[-1]} and {b.shape[-1]}")
    c = np.asarray(c, dtype=np.float32)
    shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1], c.shape)
    acc = np.array(np.broadcast_to(c, shape))
    if acc.size == 0:
        return acc
    (av, ae, a_finite), (bv, be, b_finite) = tc_block.operand(a), tc_block.operand(b)

    def terms(x):                                   # [..., g] -> [g, ...] against the output's shape
        return np.moveaxis(x.reshape((1,) * (len(shape) + 1 - x.ndim) + x.shape), -1, 0)

    fast = a_finite and b_finite and not tc_block.has_subnormal(acc)
    return tc_block.block(terms(av), terms(bv), terms(ae), terms(be), acc, model.extra_bits, fast)


def dot16(a, b, c, model: Model) -> np.ndarray:
    """One mma element: a, b [..., 16] bf16, c [...] float32 -> [...] float32 (blocks of model.group in order)."""
    a, b = _bits16(a), _bits16(b)
    if a.shape[-1] != K_STEP or b.shape[-1] != K_STEP:
        raise ValueError(f"tensor_core: one mma takes k = {K_STEP}, got {a.shape[-1]} and {b.shape[-1]}")
    acc = np.asarray(c, dtype=np.float32)
    for k0 in range(0, K_STEP, model.group):
        acc = block_fma(a[..., k0:k0 + model.group], b[..., k0:k0 + model.group], acc, model)
    return acc


def mma_m16n8k16(a, b, c, arch: str = DEFAULT_ARCH) -> np.ndarray:
    """D[16x8] = A[16x16] @ B[16x8] + C[16x8] as one mma.m16n8k16 on `arch` (also batched: [..., 16, 16])."""
    m = _model(arch)
    a, b = _bits16(a), _bits16(b)
    c = np.asarray(c, dtype=np.float32)
    if a.shape[-2:] != (16, 16) or b.shape[-2:] != (16, 8) or c.shape[-2:] != (16, 8):
        raise ValueError(f"mma_m16n8k16: shapes A {a.shape}, B {b.shape}, C {c.shape}; need [16,16], [16,8], [16,8]")
    return dot16(a[..., :, None, :], np.swapaxes(b, -1, -2)[..., None, :, :], c, m)


def mma_chain(a, b, c=None, arch: str = DEFAULT_ARCH) -> np.ndarray:
    """D[M,N] = A[M,K] @ B[K,N] (+ C) as a chain of m16n8k16 steps over ascending k blocks of 16, each step's D
    the next step's C (K a multiple of 16; M and N any: every element is its own row and column's chain)."""
    m = _model(arch)
    a, b = _bits16(a), _bits16(b)
    rows, k = a.shape
    if b.shape[0] != k or k % K_STEP:
        raise ValueError(f"mma_chain: A {a.shape} @ B {b.shape}: K must agree and be a multiple of {K_STEP}")
    cols = b.shape[1]
    acc = np.zeros((rows, cols), np.float32) if c is None else np.array(np.broadcast_to(
        np.asarray(c, dtype=np.float32), (rows, cols)))
    if acc.size == 0 or k == 0:
        return acc
    av, ae, finite = tc_block.operand(np.ascontiguousarray(a.T))
    b = tc_block.rows_first(b)
    tm = min(rows, TILE_ROWS)
    tn = max(1, min(cols, TILE // tm))
    for n0 in range(0, cols, tn):                   # tiles only bound the working set: each element's chain is its own
        for m0 in range(0, rows, tm):
            ms, ns = slice(m0, m0 + tm), slice(n0, n0 + tn)
            acc[ms, ns] = _chain_tile(av[:, ms], ae[:, ms], b[:, ns], acc[ms, ns], m, finite)
    return acc


def _chain_tile(av, ae, b, c, m: Model, a_finite: bool) -> np.ndarray:
    """One tile's chain: av, ae [K, tm] (A's columns as values and exponents), b [K, tn] bits, c [tm, tn] ->
    [tm, tn] float32. B's operands are made a block at a time: they stay in cache and no whole copy is made."""
    g = m.group
    c = np.ascontiguousarray(c)
    bufs = tc_block.Buffers(g, c.shape, m.extra_bits)
    b_out = (np.empty((g, b.shape[1]), np.uint32), np.empty((g, b.shape[1]), np.int16))
    c_plain = not tc_block.has_subnormal(c)
    for j0 in range(0, av.shape[0], g):
        s = slice(j0, j0 + g)
        bv, be, b_finite = tc_block.operand(b[s], b_out)
        terms = (av[s, :, None], bv[:, None, :], ae[s, :, None], be[:, None, :])
        out = tc_block.fast(*terms, c, m.extra_bits, bufs) if a_finite and b_finite and c_plain else None
        if out is None:
            out = tc_block.general(*terms, c, m.extra_bits)
            c_plain = not tc_block.has_subnormal(out)
        c = out
    return c


def _model(arch: str) -> Model:
    m = MODELS.get(arch)
    if m is None:
        raise ValueError(f"tensor_core: no model of the tensor core for {arch} (known: {', '.join(MODELS)})")
    return m
