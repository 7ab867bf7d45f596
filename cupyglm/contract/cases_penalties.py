"""Contract cases of cuda_src/penalties.cu (op penalize: presence / frequency / repetition penalties and
logit_bias edited into the logits in place; reference NumpyOps.penalize, cupyglm.backend.numpy_penalties). 0 ULPs.

Inputs: rows whose requests mix every penalty, a repetition penalty below and above 1 (both signs of x), ids
generated several times, biases of +-100, NaN and -inf entries (a NaN stays NaN), rows with no edit; decode
(4 rows) and verify (16 rows) batches over vocabularies of 512 and 1000.

Controls: the bias added before the penalties (-DPENALTIES_CTL_BIAS_FIRST); every count taken as 1 (the
frequency penalty applied once per id).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cupyglm.backend import numpy_penalties as penalties
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_penalties

REF = NumpyOps()
KEYS = ("row", "id", "count", "seen", "bias", "repetition", "frequency", "presence")


@dataclasses.dataclass(frozen=True)
class _Params:
    """The fields of a request's sampling parameters that `penalties.edits` reads."""
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: dict


def _make(r: int, v: int):
    def make(rng):
        x = (rng.standard_normal((r, v)) * 3).astype(np.float32)
        rows = []
        for i in range(0, r, 1 if r < 8 else 2):           # verify: every other row has no edit
            prompt = tuple(int(t) for t in rng.integers(0, v, 12))
            output = [int(t) for t in rng.integers(0, v // 8, 8)]
            output += [output[2]] * 3                                   # an id generated four times
            biased = [output[1], prompt[1], *rng.integers(0, v, 2)]        # biased ids that are also seen
            bias = {int(t): float(b) for t, b in zip(biased, (2.5, -0.75, 100.0, -100.0))}
            p = _Params(presence_penalty=float(rng.uniform(-2, 2)), frequency_penalty=float(rng.uniform(-2, 2)),
                        repetition_penalty=(0.8, 1.3, 1.0, 2.0)[i % 4], logit_bias=bias)
            rows.append((i, p, prompt, output))
            x[i, output[0]] = np.nan
            x[i, prompt[0]] = -np.inf
        d = penalties.edits(rows, v)
        return {"logits": x, **d}
    return make


def _run(k, d):
    x = k.xp.array(d["logits"])
    ops_penalties.penalize(k, x, *(d[n] for n in KEYS))
    return {"logits": x}


def _replay(d):
    x = np.array(d["logits"])
    REF.penalize(x, *(d[n] for n in KEYS))
    return {"logits": x}


def _ctl_bias_first(k, d):
    x = k.xp.array(d["logits"])
    ops_penalties.penalize(k.variant("PENALTIES_CTL_BIAS_FIRST"), x, *(d[n] for n in KEYS))
    return {"logits": x}


def _ctl_counts_one(k, d):
    x = k.xp.array(d["logits"])
    args = {**d, "count": k.xp.minimum(d["count"], 1).astype(np.int32)}
    ops_penalties.penalize(k, x, *(args[n] for n in KEYS))
    return {"logits": x}


case(Case("penalize[decode4,v512]", ("penalize_rows",), _make(4, 512), _run, _replay, _ctl_bias_first))
case(Case("penalize[verify16,v1000]", ("penalize_rows",), _make(16, 1000), _run, _replay, _ctl_counts_one))
