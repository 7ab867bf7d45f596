"""Contract cases of cuda_src/norm.cu (ops rmsnorm, layernorm).

Controls: rmsnorm with a dropped row (the launch covers one row too few, the last row stays stale);
layernorm reading the wrong row (row i gets the statistics and values of row i + 1, the last of row 0;
one row: a stale copy with its last column lost).
A wrong fold order of the 16 lanes does not show through the bf16 outputs at these widths (measured:
a -DCONTROL_WRONG_ORDER variant came out identical), so it is no control here.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_norm

REF = NumpyOps()
EPS = 1e-5
LN_EPS = 1e-6


def _bf(rng, shape, std=1.0, mean=0.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std) + np.float32(mean))


def _rms(label: str, shape: tuple[int, ...]) -> Case:
    def make(rng):
        return {"x": _bf(rng, shape, 3.0), "w": _bf(rng, shape[-1:], 0.2, 1.0)}

    def run(k, d):
        return {"y": ops_norm.rmsnorm(k, d["x"], d["w"], EPS)}

    def replay(d):
        return {"y": REF.rmsnorm(d["x"], d["w"], EPS)}

    def ctl(k, d):
        flat = d["x"].reshape(-1, shape[-1])
        head = ops_norm.rmsnorm(k, k.xp.ascontiguousarray(flat[:-1]), d["w"], EPS)
        y = k.xp.concatenate([head, k.xp.zeros_like(flat[-1:])]).reshape(shape)
        return {"y": y}

    return case(Case(f"rmsnorm[{label}]", ("rmsnorm_rows",), make, run, replay, ctl))


def _ln(label: str, shape: tuple[int, ...]) -> Case:
    def make(rng):
        return {"x": _bf(rng, shape, 2.0, 0.5), "w": _bf(rng, shape[-1:], 0.2, 1.0),
                "b": _bf(rng, shape[-1:], 0.1)}

    def run(k, d):
        return {"y": ops_norm.layernorm(k, d["x"], d["w"], d["b"], LN_EPS)}

    def replay(d):
        return {"y": REF.layernorm(d["x"], d["w"], d["b"], LN_EPS)}

    def ctl(k, d):
        flat = d["x"].reshape(-1, shape[-1])
        if flat.shape[0] > 1:
            shifted = k.xp.ascontiguousarray(k.xp.roll(flat, -1, axis=0))
        else:                                   # one row: a stale row (its last column lost)
            shifted = flat.copy()
            shifted[:, -1] = 0
        return {"y": ops_norm.layernorm(k, shifted.reshape(shape), d["w"], d["b"], LN_EPS)}

    return case(Case(f"layernorm[{label}]", ("layernorm_rows",), make, run, replay, ctl))


_rms("decode", (1, 256))             # final norm / in_norm of one token
_rms("verify", (16, 64))             # q_a norm of 16 verify rows
_rms("prompt100", (100, 256))        # a prompt chunk
_rms("odd", (7, 100))                # D % 16 = 4
_rms("3d", (3, 5, 48))               # leading axes flatten to rows
_ln("decode", (1, 32))               # indexer key norm, one token (control: a stale row)
_ln("prompt64", (64, 32))
_ln("odd", (9, 50))
