"""Contract cases of cuda_src/embed.cu (op embed). Rows of the table no id names are NaN (never read).

Control: an off-by-one gather (every id + 1)."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_embed

REF = NumpyOps()


def _embed(label: str, vocab: int, dim: int, t: int) -> Case:
    def make(rng):
        table = bf16(rng.standard_normal((vocab, dim)).astype(np.float32))
        ids = rng.integers(0, vocab - 1, t).astype(np.int32)
        unused = np.setdiff1d(np.arange(vocab), ids)
        table[unused[: len(unused) // 2]] = np.nan                  # poison: never read
        return {"table": table, "ids": ids}

    def run(k, d):
        return {"y": ops_embed.embed(k, d["table"], d["ids"])}

    def replay(d):
        return {"y": REF.embed(d["table"], d["ids"])}

    def ctl(k, d):
        return {"y": ops_embed.embed(k, d["table"], d["ids"] + 1)}

    return case(Case(f"embed[{label}]", ("embed_rows",), make, run, replay, ctl))


_embed("decode", 512, 256, 1)
_embed("prompt64", 512, 256, 64)
_embed("odd", 300, 100, 7)
