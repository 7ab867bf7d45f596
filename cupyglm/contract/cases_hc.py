"""Contract cases of cuda_src/hc.cu (ops hc_pre, hc_pre_norm, hc_post, stream_mean).

hc_pre is registered twice per shape: `hc_pre[..]` checks the fp32 gates (post, comb) and `hc_pre.x[..]` the
bf16 collapsed input x, because their tolerances differ in fp32 units (see TOL below).
Controls: hc_pre and hc_pre.x with two streams swapped (one Sinkhorn step dropped is no control: 20 steps have
converged, measured within 3 ULPs), hc_post with two streams swapped, stream_mean with the last stream dropped.
hc_post_pre_norm's control is hc_post's (the branch read unrounded); hc_pre_norm's control is a variant whose
fused norm reads the collapse unrounded (-DCONTROL_NORM_UNROUNDED). Up to ops_hc.SPLIT_ROWS rows hc_post_pre_norm
runs hc_split.cu (hc_post_split, hc_mix_norm); `hc_post_pre_norm.first[..]` plants its row's first block running
the tail (-DCONTROL_HC_FIRST_DONE), and the prompt shapes (more rows) keep hc.cu's one-block-a-row kernel.
hc_post.ranks and hc_post_pre_norm.ranks take the ranks' gathered partials [R, T, D] and add them in rank order
as they read them: their control is a kernel variant adding from the last rank (-DHC_PLANT_RANKS_REVERSED); the
partials carry large cancelling terms so that the order shows after the bf16 read (two ranks commute, so R >= 3).
hc_post.round and residual_add take an fp32 sublayer output that they round to bf16 as they read it: their
control is a kernel variant reading it unrounded (-DCONTROL_UNROUNDED).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend import lanes
from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_hc

REF = NumpyOps()
NORM_EPS, HC_EPS, ITERS = 1e-5, 1e-6, 20
BF16_ULP = 1 << 16
# The kernels compute exp with exp_f32 (cuda_src/exp_f32.cuh: +, *, rint and 2**k only, the same bits on GPU,
# emulator and NumPy). While the NumPy reference still uses np.exp (SIMD, <= 2 ULP, rounds differently) the
# tolerances below hold; once lanes.exp_f32 (the NumPy twin) is the reference's exp they are all 0.
EXACT_EXP = hasattr(lanes, "exp_f32")

# post/comb go through exp (sigmoid, the row softmax): the kernels' exp_f32 and NumPy's SIMD exp differ by
# up to 2 fp32 ULPs; Sinkhorn's 20 normalisations carry that into comb. Measured max over 60
# seeds at these shapes: post 3, comb 10 ULPs (stated with margin).
GATE_ULPS = 0 if EXACT_EXP else 32
GATE_WHY = "exp_f32 (sigmoid, row softmax) differs from NumPy's exp by <= 2 ULP; Sinkhorn carries it (measured <= 10)"
# x = bf16(sum pre_s X_s): pre is 1-2 fp32 ULPs off, which flips a bf16 rounding now and then; where the 4
# terms cancel the flip is worth more ULPs of the small result (measured <= 2 bf16 ULPs).
X_ULPS = 0 if EXACT_EXP else 4 * BF16_ULP
X_WHY = "pre = sigmoid(..) is <= 2 fp32 ULPs off (exp_f32 vs NumPy exp): flipped bf16 roundings (measured <= 2 bf16 ULPs)"


def _bf(rng, shape, std=1.0, mean=0.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std) + np.float32(mean))


def _inputs(rng, t, s, d):
    nm = s * (s + 2)
    return {"X": _bf(rng, (t, s, d)), "fn": _bf(rng, (nm, s * d), 0.5 / np.sqrt(s * d)),
            "base": (rng.standard_normal(nm) * 0.5).astype(np.float32),          # stored F32: values beyond bf16
            "scale": rng.uniform(0.5, 1.5, 3).astype(np.float32)}


def _swap01(xp, X):
    Y = X.copy()
    Y[:, 0], Y[:, 1] = X[:, 1], X[:, 0]
    return xp.ascontiguousarray(Y)


def _hc_pre(label: str, t: int, d: int, s: int = 4) -> None:
    def make(rng):
        return _inputs(rng, t, s, d)

    def pre(k, d_, iters=ITERS, X=None):
        return ops_hc.hc_pre(k, d_["X"] if X is None else X, d_["fn"], d_["base"], d_["scale"], NORM_EPS, HC_EPS,
                             iters)

    def run_gates(k, d_):
        _, post, comb = pre(k, d_)
        return {"post": post, "comb": comb}

    def replay_gates(d_):
        _, post, comb = REF.hc_pre(d_["X"], d_["fn"], d_["base"], d_["scale"], NORM_EPS, HC_EPS, ITERS)
        return {"post": post, "comb": comb}

    def ctl_gates(k, d_):                               # streams 0 and 1 swapped
        _, post, comb = pre(k, d_, X=_swap01(k.xp, d_["X"]))
        return {"post": post, "comb": comb}

    def run_x(k, d_):
        return {"x": pre(k, d_)[0]}

    def replay_x(d_):
        return {"x": REF.hc_pre(d_["X"], d_["fn"], d_["base"], d_["scale"], NORM_EPS, HC_EPS, ITERS)[0]}

    def ctl_x(k, d_):                                   # streams 0 and 1 swapped
        return {"x": pre(k, d_, X=_swap01(k.xp, d_["X"]))[0]}

    case(Case(f"hc_pre[{label}]", ("hc_pre",), make, run_gates, replay_gates, ctl_gates, GATE_ULPS, GATE_WHY))
    case(Case(f"hc_pre.x[{label}]", ("hc_pre",), make, run_x, replay_x, ctl_x, X_ULPS, X_WHY))


def _hc_pre_norm(label: str, t: int, d: int, s: int = 4) -> None:
    """hc_pre with the sublayer's rmsnorm fused: h, post and comb against hc_pre then rmsnorm."""
    def make(rng):
        inp = _inputs(rng, t, s, d)
        inp["w"] = _bf(rng, (d,), 0.2, 1.0)
        return inp

    def launch(k, d_):
        h, post, comb = ops_hc.hc_pre_norm(k, d_["X"], d_["fn"], d_["base"], d_["scale"], d_["w"], NORM_EPS,
                                           HC_EPS, ITERS)
        return {"h": h, "post": post, "comb": comb}

    def replay(d_):
        h, post, comb = REF.hc_pre_norm(d_["X"], d_["fn"], d_["base"], d_["scale"], d_["w"], NORM_EPS, HC_EPS,
                                        ITERS)
        return {"h": h, "post": post, "comb": comb}

    def ctl(k, d_):                                     # the norm reads the collapse before its bf16 rounding
        return launch(k.variant("CONTROL_NORM_UNROUNDED"), d_)

    case(Case(f"hc_pre_norm[{label}]", ("hc_pre_norm",), make, launch, replay, ctl, GATE_ULPS, GATE_WHY))


def _hc_post_pre_norm(label: str, t: int, d: int, s: int = 4) -> None:
    """hc_post then the next hc_pre_norm in one launch: X', h, post', comb' against the two reference ops."""
    def make(rng):
        inp = _inputs(rng, t, s, d)
        _, post, comb = REF.hc_pre(inp["X"], inp["fn"], inp["base"], inp["scale"], NORM_EPS, HC_EPS, ITERS)
        nxt = _inputs(rng, t, s, d)
        return {"X": inp["X"], "branch": (rng.standard_normal((t, d)) * 2.0).astype(np.float32), "post": post,
                "comb": comb, "fn": nxt["fn"], "base": nxt["base"], "scale": nxt["scale"],
                "w": _bf(rng, (d,), 0.2, 1.0)}

    def args(d_):
        return (d_["X"], d_["branch"], d_["post"], d_["comb"], d_["fn"], d_["base"], d_["scale"], d_["w"],
                NORM_EPS, HC_EPS, ITERS)

    def pack(out):
        return dict(zip(("X", "h", "post", "comb"), out))

    def ctl(k, d_):                                     # the branch read unrounded
        return pack(ops_hc.hc_post_pre_norm(k.variant("CONTROL_UNROUNDED"), *args(d_)))

    def run(k, d_):
        return pack(ops_hc.hc_post_pre_norm(k, *args(d_)))

    def replay(d_):
        return pack(REF.hc_post_pre_norm(*args(d_)))

    def ctl_first(k, d_):                               # the row's first block runs the tail
        return pack(ops_hc.hc_post_pre_norm(k.variant("CONTROL_HC_FIRST_DONE"), *args(d_)))

    kernels = ("hc_post_split", "hc_mix_norm") if t <= ops_hc.SPLIT_ROWS else ("hc_post_pre_norm",)
    case(Case(f"hc_post_pre_norm[{label}]", kernels, make, run, replay, ctl, GATE_ULPS, GATE_WHY))
    if t <= ops_hc.SPLIT_ROWS:
        case(Case(f"hc_post_pre_norm.first[{label}]", kernels, make, run, replay, ctl_first, GATE_ULPS, GATE_WHY))


def _hc_post(label: str, t: int, d: int, s: int = 4) -> None:
    def make(rng):
        inp = _inputs(rng, t, s, d)
        _, post, comb = REF.hc_pre(inp["X"], inp["fn"], inp["base"], inp["scale"], NORM_EPS, HC_EPS, ITERS)
        branch = (rng.standard_normal((t, d)) * 2.0).astype(np.float32)     # [T, D] fp32: the summed partial
        return {"X": inp["X"], "branch": branch, "post": post, "comb": comb}

    def run(k, d_):
        return {"X": ops_hc.hc_post(k, d_["X"], d_["branch"], d_["post"], d_["comb"])}

    def replay(d_):
        return {"X": REF.hc_post(d_["X"], d_["branch"], d_["post"], d_["comb"])}

    def ctl(k, d_):                                     # streams 0 and 1 swapped
        return {"X": ops_hc.hc_post(k, _swap01(k.xp, d_["X"]), d_["branch"], d_["post"], d_["comb"])}

    def ctl_round(k, d_):                               # the branch read unrounded
        return {"X": ops_hc.hc_post(k.variant("CONTROL_UNROUNDED"), d_["X"], d_["branch"], d_["post"], d_["comb"])}

    case(Case(f"hc_post[{label}]", ("hc_post",), make, run, replay, ctl))
    case(Case(f"hc_post.round[{label}]", ("hc_post",), make, run, replay, ctl_round))


def _partials(rng, r: int, t: int, d: int) -> np.ndarray:
    """[r, T, D] fp32 partials whose first two ranks carry cancelling terms of ~2^12, so that adding from the last
    rank loses bits the bf16 read of the sum still shows."""
    parts = (rng.standard_normal((r, t, d)) * 2.0).astype(np.float32)
    big = (rng.standard_normal((t, d)) * 4096.0).astype(np.float32)
    parts[0] += big
    parts[1] -= big
    return parts


def _hc_post_ranks(r: int, t: int, d: int, s: int = 4) -> None:
    """hc_post and hc_post_pre_norm reading R ranks' partials: the reference sums them first (rank_sum)."""
    def make(rng):
        inp = _inputs(rng, t, s, d)
        _, post, comb = REF.hc_pre(inp["X"], inp["fn"], inp["base"], inp["scale"], NORM_EPS, HC_EPS, ITERS)
        nxt = _inputs(rng, t, s, d)
        return {"X": inp["X"], "branch": _partials(rng, r, t, d), "post": post, "comb": comb, "fn": nxt["fn"],
                "base": nxt["base"], "scale": nxt["scale"], "w": _bf(rng, (d,), 0.2, 1.0)}

    def post_args(d_):
        return d_["X"], d_["branch"], d_["post"], d_["comb"]

    def fused_args(d_):
        return (*post_args(d_), d_["fn"], d_["base"], d_["scale"], d_["w"], NORM_EPS, HC_EPS, ITERS)

    def pack(out):
        return dict(zip(("X", "h", "post", "comb"), out))

    reversed_ = "HC_PLANT_RANKS_REVERSED"
    case(Case(f"hc_post.ranks[r{r}]", ("hc_post",), make, lambda k, d_: {"X": ops_hc.hc_post(k, *post_args(d_))},
              lambda d_: {"X": REF.hc_post(*post_args(d_))},
              lambda k, d_: {"X": ops_hc.hc_post(k.variant(reversed_), *post_args(d_))}))
    case(Case(f"hc_post_pre_norm.ranks[r{r}]", ("hc_post_split", "hc_mix_norm"), make,
              lambda k, d_: pack(ops_hc.hc_post_pre_norm(k, *fused_args(d_))),
              lambda d_: pack(REF.hc_post_pre_norm(*fused_args(d_))),
              lambda k, d_: pack(ops_hc.hc_post_pre_norm(k.variant(reversed_), *fused_args(d_))), GATE_ULPS, GATE_WHY))


def _residual(label: str, t: int, d: int) -> None:
    def make(rng):
        return {"x": _bf(rng, (t, d), 2.0), "partial": (rng.standard_normal((t, d)) * 2.0).astype(np.float32)}

    def run(k, d_):
        return {"y": ops_hc.residual_add(k, d_["x"], d_["partial"])}

    def replay(d_):
        return {"y": REF.residual_add(d_["x"], d_["partial"])}

    def ctl(k, d_):                                     # the partial read unrounded
        return {"y": ops_hc.residual_add(k.variant("CONTROL_UNROUNDED"), d_["x"], d_["partial"])}

    case(Case(f"residual_add[{label}]", ("residual_add",), make, run, replay, ctl))


def _stream_mean(label: str, t: int, d: int, s: int = 4) -> None:
    def make(rng):
        return {"X": _bf(rng, (t, s, d), 2.0)}

    def run(k, d_):
        return {"y": ops_hc.stream_mean(k, d_["X"])}

    def replay(d_):
        return {"y": REF.stream_mean(d_["X"])}

    def ctl(k, d_):                                     # the last stream dropped
        X = d_["X"].copy()
        X[:, -1] = 0
        return {"y": ops_hc.stream_mean(k, X)}

    case(Case(f"stream_mean[{label}]", ("stream_mean",), make, run, replay, ctl))


#         label        T    D
_hc_pre("decode",      1,  256)      # tiny model, one token
_hc_pre("verify",     16,  256)      # 16 verify rows
_hc_pre("prompt37",   37,  256)      # a prompt chunk
_hc_pre("odd",         3,   72)      # 4D = 288: K % 256 != 0
_hc_pre("full",        2, 4096)      # full-model width (K = 16384)
_hc_pre_norm("decode", 1,  256)
_hc_pre_norm("verify", 16,  256)
_hc_pre_norm("odd",     3,   72)
_hc_pre_norm("full",    2, 4096)
_hc_post_pre_norm("decode", 1, 256)
_hc_post_pre_norm("verify", 16, 256)
_hc_post_pre_norm("odd",     3,  72)
_hc_post_pre_norm("full",    2, 4096)
_hc_post_pre_norm("prompt70", 70, 256)  # past SPLIT_ROWS: hc.cu's one block a row
_hc_post("decode",     1,  256)
_hc_post("verify",    16,  256)
_hc_post("prompt37",  37,  256)
_hc_post("odd",        3,  300)      # D not a multiple of the block
_hc_post_ranks(3,      2,  256)      # TP=3: three ranks' partials summed as hc_post reads them
_hc_post_ranks(4,     16,  300)      # TP=4, verify rows, D not a multiple of the block
_residual("decode",    1,  256)      # the MTP layer's residuals, one token
_residual("prompt37", 37,  256)
_residual("odd",       3,  300)
_stream_mean("decode", 1,  256)
_stream_mean("prompt37", 37, 256)
_stream_mean("odd",    3,  300)
