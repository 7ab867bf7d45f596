"""Contract cases of cuda_src/token_mask.cu (op mask_tokens: a grammar's allowed-token bitmask applied to logits
rows in place; reference NumpyOps.mask_tokens, cupyglm.backend.numpy_token_mask). 0 ULPs.

Inputs: masks that allow a few ids, nearly every id, only the last id of a partial word, bit 31 of a word (the
sign bit of int32), NaN and -inf entries (a NaN stays NaN); masked rows out of order with unmasked rows between
them; decode (4 rows, 2 masked) and verify (16 rows, 9 masked) batches over vocabularies of 512 and 1000 (a
partial last word).

Controls: the bits of a word read from the top (-DTOKEN_MASK_CTL_MSB_FIRST); each mask applied to row m instead
of row[m].
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.numpy_token_mask import words
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_token_mask

REF = NumpyOps()


def _make(r: int, v: int, rows: tuple[int, ...]):
    def make(rng):
        x = (rng.standard_normal((r, v)) * 3).astype(np.float32)
        w = words(v)
        allow = np.zeros((len(rows), w * 32), dtype=bool)
        for m in range(len(rows)):
            kind = m % 3
            if kind == 0:
                allow[m, rng.integers(0, v, 5)] = True
            elif kind == 1:
                allow[m, :v] = rng.random(v) < 0.97
            else:
                allow[m, v - 1] = True
            allow[m, 31] = True                         # the sign bit of word 0
            x[rows[m], rng.integers(0, v, 3)] = np.nan
            x[rows[m], rng.integers(0, v, 3)] = -np.inf
        bits = np.packbits(allow.reshape(len(rows), w, 32), axis=2, bitorder="little").reshape(len(rows), w * 4)
        return {"logits": x, "row": np.asarray(rows, np.int32), "bits": bits.view(np.int32).copy()}
    return make


def _run(k, d):
    x = k.xp.array(d["logits"])
    ops_token_mask.mask_tokens(k, x, d["row"], d["bits"])
    return {"logits": x}


def _replay(d):
    x = np.array(d["logits"])
    REF.mask_tokens(x, d["row"], d["bits"])
    return {"logits": x}


def _ctl_msb_first(k, d):
    x = k.xp.array(d["logits"])
    ops_token_mask.mask_tokens(k.variant("TOKEN_MASK_CTL_MSB_FIRST"), x, d["row"], d["bits"])
    return {"logits": x}


def _ctl_row_m(k, d):
    x = k.xp.array(d["logits"])
    ops_token_mask.mask_tokens(k, x, k.xp.asarray(np.arange(d["row"].shape[0], dtype=np.int32)), d["bits"])
    return {"logits": x}


case(Case("mask_tokens[decode4,v512]", ("mask_rows",), _make(4, 512, (3, 1)), _run, _replay, _ctl_msb_first))
case(Case("mask_tokens[verify16,v1000]", ("mask_rows",), _make(16, 1000, (15, 0, 2, 5, 4, 9, 11, 12, 7)), _run,
          _replay, _ctl_row_m))
