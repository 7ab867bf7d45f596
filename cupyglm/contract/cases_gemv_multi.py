"""Contract cases of cuda_src/gemv_multi.cu: ops gemm_multi, the decode rows of several projections in one launch
(the KDA layer's q/k/v, f_a, g_a and b with its sigmoid; its f_b and g_b; the DSA layer's q_a, kv_a and the
indexer's wk, gate and weights; q_b and wq_b), each part against its own reference gemm (and sigmoid).

Controls: -DCONTROL_TC_REVERSED (a 32-block's two mma steps in the other order, gemv_tc.cuh) where a part keeps
fp32; the parts' inputs swapped where two parts read different rows; otherwise the last K term dropped (bf16
outputs).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemm_multi

REF = NumpyOps()


def _bf(rng, shape, std=1.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std))


def _multi_case(label: str, m: int, d: int, parts, shared: bool, control: str) -> Case:
    """parts: (N_p, K_p, out_p); shared: every part reads one x (all K_p equal), else x_p of its own."""
    def make(rng):
        dd = {f"w{p}": _bf(rng, (n, k), k ** -0.5) for p, (n, k, _) in enumerate(parts)}
        if shared:
            dd["x"] = _bf(rng, (m, parts[0][1]))
        else:
            dd.update({f"x{p}": _bf(rng, (m, k)) for p, (_, k, _) in enumerate(parts)})
        return dd

    def xs_of(dd):
        return tuple(dd["x"] if shared else dd[f"x{p}"] for p in range(len(parts)))

    def ws_of(dd):
        return tuple(dd[f"w{p}"] for p in range(len(parts)))

    outs = tuple(o for _, _, o in parts)

    def pack(ys):
        return {f"y{p}": y for p, y in enumerate(ys)}

    def run(kn, dd):
        return pack(ops_gemm_multi.gemm_multi(kn, xs_of(dd), ws_of(dd), outs, decode=d))

    def replay(dd):
        return pack(REF.gemm_multi(xs_of(dd), ws_of(dd), outs, decode=d))

    if control == "order":
        def ctl(kn, dd):
            return pack(ops_gemm_multi.gemm_multi(kn.variant("CONTROL_TC_REVERSED"), xs_of(dd), ws_of(dd), outs,
                                                  decode=d))
    elif control == "swap":
        def ctl(kn, dd):                        # part 0 reads part 1's rows and back (K_0 = K_1)
            xs = xs_of(dd)
            return pack(ops_gemm_multi.gemm_multi(kn, (xs[1], xs[0], *xs[2:]), ws_of(dd), outs, decode=d))
    else:
        def ctl(kn, dd):                        # the last K term dropped (tail off-by-one)
            xs = []
            for x in xs_of(dd):
                x = x.copy()
                x[..., -1] = 0
                xs.append(kn.xp.asarray(x))
            return pack(ops_gemm_multi.gemm_multi(kn, tuple(xs), ws_of(dd), outs, decode=d))

    kernels = ("gemv_multi_lane16",) if d == m else ("gemv_multi_lane16", "gemm_tc", "gemm_tc_bf16")
    return case(Case(f"gemv_multi[{label}]", kernels, make, run, replay, ctl))


KDA_X = ((96, 256, "bf16"), (16, 256, "bf16"), (16, 256, "bf16"), (4, 256, "sigmoid_bf16"))   # qkv f_a g_a b
DSA_X = ((48, 256, "bf16"), (40, 256, "bf16"), (32, 256, "bf16"), (32, 256, "bf16"), (32, 256, "f32"))
#           label          M   d   parts                                             shared  control
_multi_case("kda-x",        1,  1, KDA_X,                                            True,   "tail")
_multi_case("kda-x-verify", 16, 16, KDA_X,                                           True,   "tail")
_multi_case("lowrank",      3,  3, ((64, 16, "bf16"), (64, 16, "bf16")),             False,  "swap")   # f_b g_b
_multi_case("dsa-x",        2,  2, DSA_X,                                            True,   "order")
_multi_case("stages",       17, 17, ((33, 1100, "f32"), (20, 1536, "bf16"), (5, 100, "sigmoid_bf16")),
            False, "order")                                                          # K % 8 = 4: scalar loads
_multi_case("mixed",        20, 4, ((24, 256, "f32"), (8, 256, "sigmoid_bf16")),     True,   "order")
_multi_case("six",          5,  5, tuple((n, 64, "f32") for n in (16, 1, 17, 32, 15, 2)), True, "order")


def _swiglu_case(label: str, m: int, d: int, na: int, ns: int, k: int, out: str, limit, control: str) -> Case:
    """gemm_and_swiglu: the router-like plain part and the shared expert's SwiGLU part in one launch."""
    def make(rng):
        return {"x": _bf(rng, (m, k)), "w": _bf(rng, (na, k), k ** -0.5), "wg": _bf(rng, (ns, k), k ** -0.5),
                "wu": _bf(rng, (ns, k), k ** -0.5)}

    def pack(pair):
        return {"y": pair[0], "act": pair[1]}

    def run(kn, dd):
        return pack(ops_gemm_multi.gemm_and_swiglu(kn, dd["x"], dd["w"], out, dd["wg"], dd["wu"], limit, decode=d))

    def replay(dd):
        return pack(REF.gemm_and_swiglu(dd["x"], dd["w"], out, dd["wg"], dd["wu"], limit, decode=d))

    if control == "order":
        def ctl(kn, dd):
            return pack(ops_gemm_multi.gemm_and_swiglu(kn.variant("CONTROL_TC_REVERSED"), dd["x"], dd["w"], out,
                                                       dd["wg"], dd["wu"], limit, decode=d))
    else:
        def ctl(kn, dd):                        # gate and up exchanged
            return pack(ops_gemm_multi.gemm_and_swiglu(kn, dd["x"], dd["w"], out, dd["wu"], dd["wg"], limit,
                                                       decode=d))

    kernels = ("gemv_multi_swiglu_lane16",) if d == m else ("gemv_multi_swiglu_lane16", "gemm_tc",
                                                            "gemm_tc_bf16", "swiglu")
    return case(Case(f"gemv_multi_swiglu[{label}]", kernels, make, run, replay, ctl))


#            label       M   d   N_a  N_s    K   out    limit  control
_swiglu_case("decode",   1,  1,  64,  48, 256, "f32",  10.0, "order")   # router of 64 experts + shared expert
_swiglu_case("verify",  16, 16,  24,  40, 520, "f32",  10.0, "swap")    # K % 8 = 0, two stages of the SwiGLU
_swiglu_case("nolimit",  3,  3,  17,  33, 100, "bf16", None, "swap")    # scalar loads, no clamp
_swiglu_case("mixed",   20,  4,  16,  16, 256, "f32",  10.0, "order")   # 4 decode rows + 16 prompt rows


def _grouped_dense_case(label: str, m: int, e: int, used: int, n: int, k: int, m2: int, k2: int,
                        control: str) -> Case:
    """gemm_grouped_dense: the experts' grouped down projection (m sorted pairs over `used` of e experts, the rest
    poisoned with NaN) and the shared expert's dense one in one launch."""
    def make(rng):
        w = _bf(rng, (e, n, k), k ** -0.5)
        group = np.sort(rng.permutation(np.arange(m) % used)).astype(np.int32)
        w[np.setdiff1d(np.arange(e), group)] = np.nan
        return {"x": _bf(rng, (m, k)), "w": w, "group": group, "x2": _bf(rng, (m2, k2)),
                "w2": _bf(rng, (n, k2), k2 ** -0.5)}

    def pack(pair):
        return {"y": pair[0], "y2": pair[1]}

    def run(kn, dd):
        return pack(ops_gemm_multi.gemm_grouped_dense(kn, dd["x"], dd["w"], dd["group"], dd["x2"], dd["w2"],
                                                      decode=m, decode2=m2))

    def replay(dd):
        return pack(REF.gemm_grouped_dense(dd["x"], dd["w"], dd["group"], dd["x2"], dd["w2"], decode=m,
                                           decode2=m2))

    if control == "order":
        def ctl(kn, dd):
            return pack(ops_gemm_multi.gemm_grouped_dense(kn.variant("CONTROL_TC_REVERSED"), dd["x"], dd["w"],
                                                          dd["group"], dd["x2"], dd["w2"], decode=m, decode2=m2))
    else:
        def ctl(kn, dd):                        # one pair routed to the next expert
            group = dd["group"].copy()
            group[m // 2] = (group[m // 2] + 1) % used
            return pack(ops_gemm_multi.gemm_grouped_dense(kn, dd["x"], dd["w"], kn.xp.asarray(group), dd["x2"],
                                                          dd["w2"], decode=m, decode2=m2))

    return case(Case(f"gemv_grouped_dense[{label}]", ("gemv_grouped_dense_lane16",), make, run, replay, ctl))


#                   label     M   E  used   N     K   M2   K2   control
_grouped_dense_case("decode",  8,  8,   5,  64, 1040,  1, 520, "order")   # one token's 8 pairs + its shared row
_grouped_dense_case("verify", 48,  6,   2,  40,  256, 16, 256, "route")   # runs longer than 16 rows
_grouped_dense_case("odd",     6,  4,   3,  33,  100,  3,  72, "route")   # scalar loads, N % 16 = 1
