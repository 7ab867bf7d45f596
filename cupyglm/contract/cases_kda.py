"""Contract cases of cuda_src/kda.cu (ops kda_conv, kda_gate, l2norm, kda_recurrence, kda_out; the decode steps
of kda_step.cu are in cases_kda_step.py).

Controls: kda_conv with the saved window read newest first; kda_gate with dt_bias of the wrong head; l2norm
reading the next row; kda_recurrence with a dropped token (its decay and update skipped: g = 1, beta = 0), its
staged kernels at a given number of rows a group with a planted mistake (the cases' table says which);
kda_out with the gates of two heads swapped.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend import lanes
from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_kda

REF = NumpyOps()
LOWER, L2_EPS, EPS = -5.0, 1e-6, 1e-5
BF16_ULP = 1 << 16
# The kernels compute exp with exp_f32 (cuda_src/exp_f32.cuh: +, *, rint and 2**k only, the same bits on GPU,
# emulator and NumPy). While the NumPy reference still uses np.exp (SIMD, <= 2 ULP, rounds differently) the
# tolerances below hold; once lanes.exp_f32 (the NumPy twin) is the reference's exp they are all 0.
EXACT_EXP = hasattr(lanes, "exp_f32")

# SiLU's exp (exp_f32 in the kernel, NumPy's SIMD exp in the reference) differs by <= 2 fp32 ULPs before the
# bf16 rounding: y may flip by 1 bf16 ULP (measured: rare).
CONV_ULPS, CONV_WHY = 0 if EXACT_EXP else BF16_ULP, "SiLU's exp_f32 vs NumPy exp (<= 2 fp32 ULPs) may flip a bf16 rounding: 1 bf16 ULP"
# Three chained exps; the outer exp(-5 sigmoid(.)) amplifies its argument's error by up to 5x.
GATE_ULPS, GATE_WHY = 0 if EXACT_EXP else 64, "exp(lower * sigmoid(exp(A_log) * ..)): 3 chained exp_f32 vs NumPy exp (measured <= 17 ULPs)"
OUT_ULPS, OUT_WHY = 0 if EXACT_EXP else BF16_ULP, "sigmoid(gate)'s exp_f32 vs NumPy exp (<= 2 fp32 ULPs) may flip a bf16 rounding: 1 bf16 ULP"


def _bf(rng, shape, std=1.0, mean=0.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std) + np.float32(mean))


def _conv(label: str, n: int, c: int, taps: int = 4) -> None:
    def make(rng):
        return {"x": _bf(rng, (n, c)), "window": _bf(rng, (taps - 1, c)), "w": _bf(rng, (c, taps), 0.5)}

    def run(k, d):
        y, win = ops_kda.kda_conv(k, d["x"], d["window"], d["w"])
        return {"y": y, "window": win}

    def replay(d):
        y, win = REF.kda_conv(d["x"], d["window"], d["w"])
        return {"y": y, "window": win}

    def ctl(k, d):                                     # saved rows read newest first
        y, win = ops_kda.kda_conv(k, d["x"], k.xp.ascontiguousarray(d["window"][::-1]), d["w"])
        return {"y": y, "window": win}

    case(Case(f"kda_conv[{label}]", ("kda_conv",), make, run, replay, ctl, CONV_ULPS, CONV_WHY))


def _gate(label: str, n: int, h: int, kd: int) -> None:
    def make(rng):
        return {"a": _bf(rng, (n, h, kd)), "a_log": np.log(rng.uniform(1.0, 16.0, h)).astype(np.float32),   # stored F32
                "dt_bias": (rng.standard_normal((h, kd)) * 0.5).astype(np.float32)}

    def run(k, d):
        return {"g": ops_kda.kda_gate(k, d["a"], d["a_log"], d["dt_bias"], LOWER)}

    def replay(d):
        return {"g": REF.kda_gate(d["a"], d["a_log"], d["dt_bias"], LOWER)}

    def ctl(k, d):                                     # dt_bias of the wrong head
        return {"g": ops_kda.kda_gate(k, d["a"], d["a_log"], k.xp.ascontiguousarray(k.xp.roll(d["dt_bias"], 1, 0)),
                                      LOWER)}

    case(Case(f"kda_gate[{label}]", ("kda_gate",), make, run, replay, ctl, GATE_ULPS, GATE_WHY))


def _l2(label: str, shape, scale=None) -> None:
    """scale: q's K^-0.5 multiplied in the kernel (control: the scale left out)."""
    def make(rng):
        return {"x": _bf(rng, shape)}

    def run(k, d):
        return {"y": ops_kda.l2norm(k, d["x"], L2_EPS, scale)}

    def replay(d):
        return {"y": REF.l2norm(d["x"], L2_EPS, scale)}

    def ctl(k, d):                                     # the last column dropped (a loop bound off by one)
        if scale is not None:
            return {"y": ops_kda.l2norm(k, d["x"], L2_EPS)}
        x = d["x"].copy()
        x[..., -1] = 0
        return {"y": ops_kda.l2norm(k, x, L2_EPS)}

    case(Case(f"l2norm[{label}]", ("l2norm",), make, run, replay, ctl))


def _rec_inputs(rng, n, h, v, kd):
    q = REF.l2norm(_bf(rng, (n, h, kd)), L2_EPS) * np.float32(kd ** -0.5)
    kk = REF.l2norm(_bf(rng, (n, h, kd)), L2_EPS)
    g = REF.kda_gate(_bf(rng, (n, h, kd)), bf16(np.log(rng.uniform(1.0, 16.0, h)).astype(np.float32)),
                     _bf(rng, (h, kd), 0.5), LOWER)
    beta = REF.sigmoid(rng.standard_normal((n, h)).astype(np.float32), out="bf16")
    S = (rng.standard_normal((h, v, kd)) * 0.3).astype(np.float32)
    return {"S": S, "q": q.astype(np.float32), "k": kk, "v": _bf(rng, (n, h, v)), "g": g, "beta": beta}


def _rec(label: str, n: int, h: int, v: int, kd: int) -> None:
    def make(rng):
        return _rec_inputs(rng, n, h, v, kd)

    def run(k, d):
        y, S = ops_kda.kda_recurrence(k, d["S"], d["q"], d["k"], d["v"], d["g"], d["beta"])
        return {"y": y, "S": S}

    def replay(d):
        y, S = REF.kda_recurrence(d["S"], d["q"], d["k"], d["v"], d["g"], d["beta"])
        return {"y": y, "S": S}

    def ctl(k, d):                                     # token n // 2 dropped from the state update
        g, beta = d["g"].copy(), d["beta"].copy()
        g[n // 2] = 1.0
        beta[n // 2] = 0.0
        y, S = ops_kda.kda_recurrence(k, d["S"], d["q"], d["k"], d["v"], g, beta)
        return {"y": y, "S": S}

    name, _ = ops_kda.rec_kernel(kd, ops_kda.rec_rows(h, v))
    case(Case(f"kda_recurrence[{label}]", (name,), make, run, replay, ctl))


def _rec_rows(label: str, n: int, h: int, v: int, kd: int, rows: int, plant: str) -> None:
    """The staged kernel at `rows` value rows a group; control: its variant with the planted mistake."""
    def make(rng):
        return _rec_inputs(rng, n, h, v, kd)

    def launch(k, d):
        y, S = ops_kda.kda_recurrence_rows(k, d["S"], d["q"], d["k"], d["v"], d["g"], d["beta"], rows)
        return {"y": y, "S": S}

    def replay(d):
        y, S = REF.kda_recurrence(d["S"], d["q"], d["k"], d["v"], d["g"], d["beta"])
        return {"y": y, "S": S}

    case(Case(f"kda_recurrence[{label}]", (ops_kda.rec_kernel(kd, rows)[0],), make, launch, replay,
              lambda k, d: launch(k.variant(plant), d)))


def _out(label: str, n: int, h: int, v: int) -> None:
    def make(rng):
        return {"y": _bf(rng, (n, h, v), 0.3), "w": _bf(rng, (v,), 0.2, 1.0), "gate": _bf(rng, (n, h, v), 2.0)}

    def run(k, d):
        return {"o": ops_kda.kda_out(k, d["y"], d["w"], d["gate"], EPS)}

    def replay(d):
        return {"o": REF.kda_out(d["y"], d["w"], d["gate"], EPS)}

    def ctl(k, d):                                     # gates of heads 0 and 1 swapped
        g = d["gate"].copy()
        g[:, 0], g[:, 1] = d["gate"][:, 1], d["gate"][:, 0]
        return {"o": ops_kda.kda_out(k, d["y"], d["w"], g, EPS)}

    case(Case(f"kda_out[{label}]", ("kda_out",), make, run, replay, ctl, OUT_ULPS, OUT_WHY))


C_TINY = 3 * 4 * 32                      # q|k|v channels of the tiny model (4 heads x 32)
#      label          n    C
_conv("decode",       1, C_TINY)
_conv("two",          2, C_TINY)         # fewer new rows than saved rows: the window keeps an old row
_conv("verify",      16, C_TINY)
_conv("prompt37",    37, C_TINY)
_conv("odd",          5, 100)
_conv("full",         3, 3 * 32 * 128)   # a full-model rank's channels
#      label          n   H    K
_gate("decode",       1,  4,  32)
_gate("prompt37",    37,  4,  32)
_gate("full",         3, 32, 128)
_l2("decode",        (1, 4, 32))
_l2("prompt37",      (37, 4, 32))
_l2("odd",           (3, 5, 40))          # K % 16 = 8
_l2("full",          (2, 32, 128))
_l2("decode.q",      (1, 4, 32), 32 ** -0.5)     # q: the K^-0.5 scale in the kernel
_l2("full.q",        (2, 32, 128), 128 ** -0.5)
#     label           n   H    V    K
_rec("decode",        1,  4,  32,  32)
_rec("verify",       16,  4,  32,  32)
_rec("prompt37",     37,  4,  32,  32)
_rec("odd",           3,  3,  24,  40)    # V not a multiple of 8 rows, K % 16 = 8
_rec("full",          4,  2, 128, 128)    # two full-size heads
# The staged kernels (KDA_CHUNK = 8 tokens a stage), controls planted in cuda_src/kda.cu: KDA_PLANT_SHORT_TAIL drops
# the last token of a prompt that ends inside a stage, KDA_PLANT_FIRST_V gives every row of a group its first row's
# v, KDA_PLANT_WHOLE_GROUPS drops a group that holds fewer than R rows (V not a multiple of R).
#          label          n   H    V    K  rows  plant
_rec_rows("tail21",      21,  2,  16, 128,  1, "KDA_PLANT_SHORT_TAIL")   # 2 stages and 5 tokens
_rec_rows("tail13.r2",   13,  2,  32,  32,  2, "KDA_PLANT_SHORT_TAIL")
_rec_rows("rows2",       17,  2,  32,  32,  2, "KDA_PLANT_FIRST_V")
_rec_rows("rows4",       11,  1,  64, 128,  4, "KDA_PLANT_FIRST_V")
_rec_rows("rows2.full",   9,  1, 128, 128,  2, "KDA_PLANT_FIRST_V")
_rec_rows("vtail.r4",    10,  2,  30,  32,  4, "KDA_PLANT_WHOLE_GROUPS")  # 7 groups of 4 rows and one of 2
_rec_rows("vtail.r2",     8,  1,  25, 128,  2, "KDA_PLANT_WHOLE_GROUPS")
_rec_rows("vtail.r4.full", 3, 1,  37, 128,  4, "KDA_PLANT_WHOLE_GROUPS")
_out("decode",        1,  4,  32)
_out("prompt37",     37,  4,  32)
_out("odd",           3,  3,  40)
_out("full",          2, 32, 128)
