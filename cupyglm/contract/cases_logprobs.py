"""Contract cases of cuda_src/logprobs.cu (op logprobs: the sampled token's logprob and the top K; reference
NumpyOps.logprobs, i.e. cupyglm.backend.numpy_logprobs.logprobs_rows). Integer output (ids and float bits): 0 ULPs.

Inputs plant ties at the top (three ids share the maximum: the lowest must come first), -inf entries (what the
min_tokens bans leave), -0.0 next to +0.0, and a maximum of -0.0 in one row; vocabularies of 512 (the tiny
model) and 1000 (not a multiple of the 256 partial sums); decode (1, 4 rows) and verify (16 rows) batches.

Controls: the partial sums added right to left (the kernel compiled with -DLOGPROBS_CTL_REVERSED_PARTIALS);
ties broken to the higher id (the kernel on the reversed vocabulary, ids mapped back); the tokens of the
batch taken in reverse order (a row reading another row's token).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_logprobs

REF = NumpyOps()


def _make(r: int, v: int, top: int, scale: float):
    def make(rng):
        x = (rng.standard_normal((r, v)) * scale).astype(np.float32)
        for i in range(r):
            ids = rng.permutation(v)
            x[i, ids[:3]] = x[i].max() + np.float32(0.5)      # a three-way tie at the top
            x[i, ids[3:6]] = -np.inf
            x[i, ids[6:8]] = np.float32(0.0)
            x[i, ids[8:10]] = np.float32(-0.0)
        if r > 1:
            x[1] = -np.abs(x[1]) - np.float32(1.0)
            x[1, :2] = np.float32(-0.0)                       # the maximum is -0.0
        tokens = rng.integers(0, v, r).astype(np.int32)
        tokens[-1] = -1 if r > 2 else tokens[-1]              # sample's answer for a NaN row
        return {"logits": x, "tokens": tokens, "top": top}
    return make


def _run(k, d):
    return {"packed": ops_logprobs.logprobs(k, d["logits"], d["tokens"], d["top"])}


def _replay(d):
    return {"packed": REF.logprobs(d["logits"], d["tokens"], d["top"])}


def _ctl_reversed_partials(k, d):
    return {"packed": ops_logprobs.logprobs(k.variant("LOGPROBS_CTL_REVERSED_PARTIALS"), d["logits"], d["tokens"],
                                            d["top"])}


def _ctl_ties_high(k, d):
    """Ties to the higher id: the kernel on the reversed vocabulary, ids mapped back."""
    v = d["logits"].shape[1]
    top = d["top"]
    xp = k.xp
    tokens = xp.where(d["tokens"] >= 0, v - 1 - d["tokens"], d["tokens"]).astype(np.int32)
    p = ops_logprobs.logprobs(k, xp.ascontiguousarray(d["logits"][:, ::-1]), tokens, top).copy()
    p[:, 0] = d["tokens"]
    p[:, 2:2 + top] = v - 1 - p[:, 2:2 + top]
    return {"packed": p}


def _ctl_rows_swapped(k, d):
    return {"packed": ops_logprobs.logprobs(k, d["logits"], k.xp.ascontiguousarray(d["tokens"][::-1]), d["top"])}


CONTROLS = {"reversed_partials": _ctl_reversed_partials, "ties_high": _ctl_ties_high,
            "rows_swapped": _ctl_rows_swapped}


def _case(label: str, r: int, v: int, top: int, scale: float, control: str) -> None:
    case(Case(f"logprobs[{label}]", ("logprobs_rows",), _make(r, v, top, scale), _run, _replay, CONTROLS[control]))


#      label                  R   V     top  scale  control
_case("decode1,v512,k2",      1,  512,  2,   8.0,   "ties_high")
_case("decode4,v1000,k5",     4,  1000, 5,   2.0,   "ties_high")
_case("verify16,v512,k20",    16, 512,  20,  1.0,   "rows_swapped")
_case("verify16,v1000,k0",    16, 1000, 0,   0.3,   "reversed_partials")
