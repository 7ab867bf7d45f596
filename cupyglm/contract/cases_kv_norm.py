"""Contract cases of cuda_src/kv.cu's kv_write_rows_rmsnorm_keys (op write_rows_rmsnorm_keys): a DSA call's latent
rows RMS-normed on their way into a shuffled page table of 16-token pages (cases_kv.py's layout), and the same
rows' index keys [n, I] layer-normed in the same launch (NumpyOps.write_rows_rmsnorm_keys: rmsnorm, write_rows,
layernorm). Store rows the call must not touch are NaN and must stay NaN.

Controls: two slots swapped; the RMSNorm's eps 1.0 (every row's scale moves); the variant KV_PLANT_KEYS_BIAS
(the keys' LayerNorm adds its weight in place of its bias); the variant KV_PLANT_KEYS_ROW (row i's keys land in
row n-1-i, so it needs n > 1); *.flags: ids outside [0, N) counted by the kernel (variant KV_PLANT_FLAG: the id N
is not counted), the keys normed for every row, refused or not.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.cases_kv import PAGE, SLOT, SLOTS, _bad_ids, _flags_out, _write_inputs
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_kv

REF = NumpyOps()
EPS = 1e-6                         # the latent RMSNorm's (rms_norm_eps at the tiny configs)
LN_EPS = 1e-6                      # the index keys' LayerNorm (model/indexer.py)
KERNEL = ("kv_write_rows_rmsnorm_keys",)


def _bf(rng, shape, std=1.0, mean=0.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std) + np.float32(mean))


def _norm_inputs(rng, d: dict, n: int, cols: int, keys: int) -> dict:
    d["values"] = _bf(rng, (n, cols), 3.0)                          # [n, C] bf16 raw latent rows
    d["w"] = _bf(rng, (cols,), 0.5, 1.0)                            # [C] bf16
    d["keys"] = _bf(rng, (n, keys), 2.0, 0.5)                       # [n, I] bf16 raw index keys (mean off 0)
    d["kw"] = _bf(rng, (keys,), 0.2, 1.0)                           # [I] bf16
    d["kb"] = _bf(rng, (keys,), 0.5)                                # [I] bf16
    return d


def _launch(k, d, rows, eps=EPS, guard=None):
    args = (d["store"], rows, d["values"], d["w"], eps, d["keys"], d["kw"], d["kb"], LN_EPS)
    if guard is None:
        ik = ops_kv.write_rows_rmsnorm_keys(k, *args)
    else:
        ik = ops_kv.launch_write_rmsnorm_keys(k, *args, guard)
    return {"store": d["store"], "keys": ik}


def _replay(d, rows):
    ik = REF.write_rows_rmsnorm_keys(d["store"], rows, d["values"], d["w"], EPS, d["keys"], d["kw"], d["kb"], LN_EPS)
    return {"store": d["store"], "keys": ik}


def _write_norm(label: str, num_pages: int, cols: int, keys: int, start: int, n: int) -> None:
    def make(rng):
        return _norm_inputs(rng, _write_inputs(rng, num_pages, cols, start, n), n, cols, keys)

    def ctl_slots(k, d):
        rows = d["rows"].copy()
        if rows.shape[0] > 1:
            rows[[0, -1]] = rows[[-1, 0]]                            # two slots swapped
        else:
            rows[0] = rows[0] + 1 if int(rows[0]) % PAGE < PAGE - 1 else rows[0] - 1
        return _launch(k, d, rows)

    def run(k, d):
        return _launch(k, d, d["rows"])

    def replay(d):
        return _replay(d, d["rows"])

    name = f"write_rows_rmsnorm_keys[{label}]"
    case(Case(name, KERNEL, make, run, replay, ctl_slots))
    case(Case(name.replace("[", ".eps["), KERNEL, make, run, replay, lambda k, d: _launch(k, d, d["rows"], 1.0)))
    case(Case(name.replace("[", ".bias["), KERNEL, make, run, replay,
              lambda k, d: _launch(k.variant("KV_PLANT_KEYS_BIAS"), d, d["rows"])))
    if n > 1:
        case(Case(name.replace("[", ".keyrow["), KERNEL, make, run, replay,
                  lambda k, d: _launch(k.variant("KV_PLANT_KEYS_ROW"), d, d["rows"])))


#            label            pages cols keys start  n
_write_norm("latent-decode",    8,  64,  32,   37,   1)
_write_norm("latent-verify",    8,  64,  32,   40,  16)
_write_norm("latent-r512",      4, 512, 128,    5,   3)     # the full model's latent and index key widths
_write_norm("odd",              8,  72,  40,   13,   7)     # C % 16 = 8, I % 16 = 8


def _flags_case(n_store: int, cols: int, keys: int, n: int) -> Case:
    def make(rng):
        d = {"store": _bf(rng, (n_store, cols)), "rows": _bad_ids(rng, n_store, n)}     # store: [N, C] bf16
        return _norm_inputs(rng, d, n, cols, keys)

    def launch(kn, dd, variant):
        flags = kn.xp.zeros((SLOTS, 2), dtype=np.uint32)
        out = _launch(kn.variant("KV_PLANT_FLAG") if variant else kn, dd, dd["rows"], guard=(flags, SLOT))
        return {**out, "flags": flags}

    def replay(dd):
        ids = np.asarray(dd["rows"])
        good = (ids >= 0) & (ids < n_store)
        REF.write_rows(dd["store"], ids[good], REF.rmsnorm(dd["values"][good], dd["w"], EPS))
        return {"store": dd["store"], "keys": REF.layernorm(dd["keys"], dd["kw"], dd["kb"], LN_EPS),
                "flags": _flags_out(ids, n_store)}

    return case(Case(f"write_rows_rmsnorm_keys.flags[{n}]", KERNEL, make,
                     lambda kn, dd: launch(kn, dd, False), replay, lambda kn, dd: launch(kn, dd, True)))


_flags_case(64, 40, 24, 9)
