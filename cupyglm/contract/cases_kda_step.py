"""Contract cases of cuda_src/kda_step.cu (ops kda_step, kda_step_slots): the KDA decode step with its low-rank
second factors (a = gemm(fa, f_b), gate = gemm(ga, g_b), bf16), against the reference's gemm, kda_conv, l2norm x2,
kda_gate and kda_recurrence (kda_step per entry for the slots).

Controls: kda_step with the decay's dt_bias of the next head (-DCONTROL_GATE_HEAD), the saved window read newest
first, q's and k's heads swapped, a's column k summed from f_b's row k ^ 1 (-DCONTROL_FACTOR_ROW), f_b and g_b
swapped, or the factors as IEEE fp32 multiply-adds in place of the tensor core's model (-DCONTROL_TC_IEEE, on
factor rows of cancelling pairs at 2^12 between terms at 2^-12); kda_step_slots with every block writing q/k's next
window at once (-DCONTROL_WINDOW_EAGER: a block of the
same head reads it), each sequence on the next slot, a wrong factor row, f_b and g_b swapped, an entry started
from the previous entry's state (-DCONTROL_ENTRY_CARRY: one block steps every entry) or two entries' rows swapped;
kda_step with out= views one row early.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.cases_kda import GATE_ULPS, GATE_WHY, L2_EPS, LOWER, _bf
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_kda

REF = NumpyOps()


def _params(rng, rows: int, h: int, kd: int, r: int, taps: int) -> dict:
    """The row inputs (x, fa, ga, beta of `rows` rows) and weights of a decode step; r: the low rank."""
    c = 3 * h * kd
    return {"x": _bf(rng, (rows, c)), "w": _bf(rng, (c, taps), 0.5),
            "fa": _bf(rng, (rows, r)), "ga": _bf(rng, (rows, r)),
            "f_b": _bf(rng, (h * kd, r), r ** -0.5), "g_b": _bf(rng, (h * kd, r), 2.0 * r ** -0.5),
            "a_log": bf16(np.log(rng.uniform(1.0, 16.0, h)).astype(np.float32)).astype(np.float32),
            "dt_bias": _bf(rng, (h, kd), 0.5).astype(np.float32),
            "beta": REF.sigmoid(rng.standard_normal((rows, h)).astype(np.float32), out="bf16")}


def _spread(rng, d: dict) -> dict:
    """fa and ga as pairs of terms at 2^12 that cancel against f_b's and g_b's rows between pairs at 2^-12 that
    do not: the tensor core's aligned, truncated groups and an IEEE sum round the small terms apart."""
    out = dict(d)
    for a, b in (("fa", "f_b"), ("ga", "g_b")):
        big = (np.arange(d[a].shape[1]) // 2) % 2 == 0
        x = d[a].astype(np.float32) * np.where(big, np.float32(2.0 ** 12), np.float32(2.0 ** -12))
        w = d[b].copy()
        pair = np.flatnonzero(big)[0::2]
        x[:, pair + 1], w[:, pair + 1] = x[:, pair], -w[:, pair]
        out[a], out[b] = bf16(x), w
    return out


def _factors(d: dict, control: str) -> tuple:
    """(fa, ga, f_b, g_b) as the call passes them: f_b and g_b exchanged for the "fbgb" control."""
    if control == "fbgb":
        return d["fa"], d["ga"], d["g_b"], d["f_b"]
    return d["fa"], d["ga"], d["f_b"], d["g_b"]


def _step(label: str, n: int, h: int, kd: int, r: int, control: str, taps: int = 4) -> None:
    c = 3 * h * kd

    def make(rng):
        d = {"S": (rng.standard_normal((h, kd, kd)) * 0.3).astype(np.float32),
             "window": _bf(rng, (taps - 1, c)), **_params(rng, n, h, kd, r, taps)}
        return _spread(rng, d) if control == "ieee" else d

    def args(d, x=None, window=None, control="none"):
        return (d["S"], d["x"] if x is None else x, d["window"] if window is None else window, d["w"],
                *_factors(d, control), d["a_log"], d["dt_bias"], d["beta"], LOWER, L2_EPS, kd ** -0.5)

    def pack(out):
        return dict(zip(("y", "gate", "S", "window"), out))

    def run(k, d):
        return pack(ops_kda.kda_step(k, *args(d)))

    def replay(d):
        return pack(REF.kda_step(*args(d)))

    if control in ("head", "factor", "ieee"):
        define = {"head": "CONTROL_GATE_HEAD", "factor": "CONTROL_FACTOR_ROW", "ieee": "CONTROL_TC_IEEE"}[control]

        def ctl(k, d):                                 # next head's dt_bias; a wrong factor row; IEEE factor sums
            return pack(ops_kda.kda_step(k.variant(define), *args(d)))
    elif control == "window":
        def ctl(k, d):                                 # the saved window read newest first
            return pack(ops_kda.kda_step(k, *args(d, window=k.xp.ascontiguousarray(d["window"][::-1]))))
    elif control == "fbgb":
        def ctl(k, d):                                 # f_b and g_b swapped
            return pack(ops_kda.kda_step(k, *args(d, control="fbgb")))
    else:
        def ctl(k, d):                                 # k's head read as q's (the q/k thirds of x swapped)
            x = d["x"].copy()
            hk = h * kd
            x[:, :hk], x[:, hk:2 * hk] = d["x"][:, hk:2 * hk], d["x"][:, :hk]
            return pack(ops_kda.kda_step(k, *args(d, x=x)))

    case(Case(f"kda_step[{label}]", ("kda_step",), make, run, replay, ctl, GATE_ULPS, GATE_WHY))


def _slots(label: str, seg, slots: int, h: int, kd: int, r: int, control: str, taps: int = 4) -> None:
    """kda_step_slots against kda_step per entry (row0, n, slot) of seg, states written back into their slots."""
    c = 3 * h * kd
    seg = np.asarray(seg, dtype=np.int32)                  # [E, 3] (row0, n, slot)
    rows = int((seg[:, 0] + seg[:, 1]).max())

    def make(rng):
        return {"S": (rng.standard_normal((slots, h, kd, kd)) * 0.3).astype(np.float32),
                "window": _bf(rng, (slots, taps - 1, c)), **_params(rng, rows, h, kd, r, taps),
                "seg": seg.copy(), "done": np.zeros((seg.shape[0], h), np.int32)}

    def call(fn, d, seg_in=None, control="none"):
        y, gate = fn(d["S"], d["x"], d["window"], d["w"], *_factors(d, control), d["a_log"], d["dt_bias"],
                     d["beta"], d["seg"] if seg_in is None else seg_in, d["done"], LOWER, L2_EPS, kd ** -0.5)
        return {"y": y, "gate": gate, "S": d["S"], "window": d["window"], "done": d["done"]}

    def run(k, d):
        return call(lambda *a: ops_kda.kda_step_slots(k, *a), d)

    def replay(d):
        return call(REF.kda_step_slots, d)

    if control in ("eager", "factor", "carry"):
        define = {"eager": "CONTROL_WINDOW_EAGER", "factor": "CONTROL_FACTOR_ROW", "carry": "CONTROL_ENTRY_CARRY"}
        define = define[control]

        def ctl(k, d):                                 # q/k's window written early; a wrong factor row; a state
            return call(lambda *a: ops_kda.kda_step_slots(k.variant(define), *a), d)   # carried between entries
    elif control == "rows":
        def ctl(k, d):                                 # the first two entries' rows swapped
            bad = seg.copy()
            bad[0, :2], bad[1, :2] = seg[1, :2], seg[0, :2]
            return call(lambda *a: ops_kda.kda_step_slots(k, *a), d, k.xp.asarray(bad))
    elif control == "fbgb":
        def ctl(k, d):                                 # f_b and g_b swapped
            return call(lambda *a: ops_kda.kda_step_slots(k, *a), d, control="fbgb")
    else:
        def ctl(k, d):                                 # each sequence stepped on the next slot's state
            bad = seg.copy()
            bad[:, 2] = np.where(bad[:, 2] >= 0, (bad[:, 2] + 1) % slots, bad[:, 2])
            return call(lambda *a: ops_kda.kda_step_slots(k, *a), d, k.xp.asarray(bad))

    case(Case(f"kda_step_slots[{label}]", ("kda_step_slots",), make, run, replay, ctl, GATE_ULPS, GATE_WHY))


def _step_out(label: str, n: int, h: int, kd: int, r: int, taps: int = 4) -> None:
    """kda_step with out=: y and gate written into rows 1 .. n of [n + 2, H, K] buffers, the other rows kept."""
    c = 3 * h * kd

    def make(rng):
        return {"S": (rng.standard_normal((h, kd, kd)) * 0.3).astype(np.float32),
                "window": _bf(rng, (taps - 1, c)), **_params(rng, n, h, kd, r, taps),
                "y": _bf(rng, (n + 2, h, kd)), "gate": _bf(rng, (n + 2, h, kd))}

    def call(fn, d, at=1):
        out = (d["y"][at:at + n], d["gate"][at:at + n])
        _, _, S, window = fn(d["S"], d["x"], d["window"], d["w"], d["fa"], d["ga"], d["f_b"], d["g_b"], d["a_log"],
                             d["dt_bias"], d["beta"], LOWER, L2_EPS, kd ** -0.5, out=out)
        return {"y": d["y"], "gate": d["gate"], "S": S, "window": window}

    def run(k, d):
        return call(lambda *a, **o: ops_kda.kda_step(k, *a, **o), d)

    def replay(d):
        return call(REF.kda_step, d)

    def ctl(k, d):                                     # the views one row early
        return call(lambda *a, **o: ops_kda.kda_step(k, *a, **o), d, at=0)

    case(Case(f"kda_step[{label}]", ("kda_step",), make, run, replay, ctl, GATE_ULPS, GATE_WHY))


#      label          n   H    K    r  control
_step("decode",       1,  4,  32,  32, "head")
_step("two",          2,  4,  32,  32, "window")  # fewer new rows than saved rows: the window keeps an old row
_step("verify",      16,  4,  32,  32, "swap")
_step("chunks",      18,  4,  32,  32, "factor")  # two chunks of tokens for the low-rank factors
_step("lowrank",      1,  4,  32,  32, "fbgb")
_step("odd",          3,  3,  40,  40, "head")    # K % 16 = 8: lanes past K idle
_step("rank20",       2,  3,  40,  20, "factor")  # r % 8 = 4: the factors' scalar loads
_step("full",         2,  2, 128, 128, "swap")    # two full-size heads
_step("taps1",        3,  2,  16,  16, "swap", 1) # no window
_step("ieee",         2,  2,  32,  64, "ieee")    # the factors' sums in the tensor core's order
#       label      seg [(row0, n, slot)]                                  slots  H    K    r  control
_slots("bucket8",  [(0, 3, 2), (3, 1, 0), (4, 1, 3), (5, 1, -1), (6, 2, 1),
                    (8, 0, -1), (0, 0, -1), (0, 0, -1)],                    4,   4,  32,  32, "eager")
_slots("verify4",  [(0, 4, 1), (4, 1, 0), (5, 1, -1)],                     2,   4,  32,  32, "slots")
_slots("factor",   [(0, 2, 1), (2, 1, 0), (3, 1, -1)],                     2,   4,  32,  32, "factor")
_slots("lowrank",  [(0, 1, 0), (1, 2, 1)],                                 2,   4,  32,  32, "fbgb")
_slots("one",      [(0, 1, 0)],                                            1,   3,  40,  40, "eager")  # K % 16 = 8
_slots("full",     [(0, 2, 1), (2, 1, 0)],                                 2,   2, 128, 128, "slots")
# span: an entry across the 16-row chunks, row 20 in no entry; gap: entries out of row order, row 3 in none
_slots("span",     [(0, 14, 1), (14, 6, 0), (21, 2, 2)],                   3,   2,  32,  32, "carry")
_slots("gap",      [(2, 1, 0), (0, 2, 1), (4, 1, -1)],                     2,   2,  32,  32, "rows")
_slots("bucket16", [(i, 1, 7 * i % 17 - 1) for i in range(16)],           16,   2,  16,  16, "carry")
_step_out("out",      2,  2,  32,  32)               # y and gate into the caller's rows (model/kda.py's views)
