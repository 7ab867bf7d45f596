"""Contract cases of cuda_src/gemv_q.cu: the decode/verify rows (the leading `decode` rows) of ops gemm,
gemm_grouped, gemm_swiglu and gemm_grouped_swiglu with FP8 block-scaled and NVFP4 weights, replayed by the NumPy
reference (decode rows: backend/tc_quant.py's tensor-core order over exact bf16 weights), 0 ULPs; mixed calls
also run the tensor-core gemm_tc_q.cu kernels for their prompt rows, so one output checks both.

Inputs as cases_gemm_q: real quantised weights whose block and group scales differ, N and K past whole FP8
blocks, K not a multiple of 16 bytes of packed values (scalar loads) as well as 16-byte loads, several stages.
Planted controls, each a kernel variant, in turn per format: the scale of the next block along K
(CONTROL_SCALE_NEXT_BLOCK), the scale grid read transposed (CONTROL_SCALE_TRANSPOSED), NVFP4's two nibbles of a
byte swapped (CONTROL_NIBBLE_SWAP), a block's mma steps reversed (CONTROL_TC_REVERSED), IEEE fp32 multiply-adds
in place of the tensor core's model (CONTROL_TC_IEEE), an A fragment's two k halves swapped
(CONTROL_TC_TRANSPOSED); grouped cases also route one decode row to an expert no row uses (its scales are NaN).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.cases_gemm_q import qweight
from cupyglm.contract.cases_gemv import prompt_kernel
from cupyglm.backend.qweight import stack
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemm, ops_gemm_swiglu, ops_gemv_q

REF = NumpyOps()
_TC = ("CONTROL_TC_TRANSPOSED", "CONTROL_TC_REVERSED", "CONTROL_TC_IEEE")
CONTROLS = {"fp8": ("CONTROL_SCALE_NEXT_BLOCK", "CONTROL_SCALE_TRANSPOSED") + _TC,
            "nvfp4": ("CONTROL_SCALE_NEXT_BLOCK", "CONTROL_SCALE_TRANSPOSED", "CONTROL_NIBBLE_SWAP") + _TC}
_USED: dict[str, list[str]] = {}


def _pool(fmt: str, f32_out: bool) -> tuple[str, ...]:
    """The format's planted variants (the summation-order ones only where the output is fp32: a reordered fp32
    sum rarely survives the bf16 rounding)."""
    return CONTROLS[fmt] if f32_out else CONTROLS[fmt][:-2]


def _define(kernel: str, fmt: str, f32_out: bool, by_kernel: dict[str, list[str]] = _USED) -> str:
    """The kernel's next planted variant in turn (kept in by_kernel, the module's own); _cover adds cases for any
    the table leaves out."""
    used = by_kernel.setdefault(kernel, [])
    pool = _pool(fmt, f32_out)
    used.append(pool[len(used) % len(pool)])
    return used[-1]


def _tag(define: str) -> str:
    return define.removeprefix("CONTROL_").lower()


def _x(rng, m: int, k: int, std: float = 1.0):
    return bf16(rng.standard_normal((m, k)).astype(np.float32) * np.float32(std))


def _experts(rng, fmt: str, e: int, absent, n: int, k: int, block) -> object:
    """An [E, N, K] stack; experts in `absent` (no row uses them) get NaN scales, so reading them shows."""
    w = stack([qweight(rng, fmt, n, k, block) for _ in range(e)])
    if fmt == "fp8":
        w.scale[absent] = np.nan
    else:
        w.scale2[absent] = np.nan
    return w


def _group(rng, m: int, d: int, used: int) -> np.ndarray:
    """Expert ids sorted within each role, as the MoE sorts them."""
    ids = rng.permutation(np.arange(m) % used)
    return np.concatenate([np.sort(ids[:d]), np.sort(ids[d:])]).astype(np.int32)


def _misroute(kn, group, d: int, used: int, e: int):
    g = group.copy()
    g[d // 2] = used if used < e else (int(g[d // 2]) + 1) % e     # one decode row to an expert no row uses
    return kn.xp.asarray(g)


def _kernels(kernel: str, d: int, m: int, prompt: str) -> tuple:
    return (kernel,) if d == m else (kernel, prompt)


def _dense(label: str, fmt: str, m: int, d: int, n: int, k: int, out: str, block=(128, 128)) -> None:
    suffix = "" if out == "f32" else "_bf16"
    kernel = f"gemv_{fmt}_lane16{suffix}"
    define = _define(kernel, fmt, out == "f32")

    def make(rng):
        return {"x": _x(rng, m, k), "w": qweight(rng, fmt, n, k, block)}

    def run(kn, dd):
        return {"y": ops_gemm.gemm(kn, dd["x"], dd["w"].to(kn.xp), out=out, decode=d)}

    def replay(dd):
        return {"y": REF.gemm(dd["x"], dd["w"], out=out, decode=d)}

    case(Case(f"gemv_{fmt}{suffix.replace('_', '.')}[{label},{_tag(define)}]",
              _kernels(kernel, d, m, prompt_kernel(kernel)), make, run, replay,
              lambda kn, dd: run(kn.variant(define), dd)))


def _grouped(label: str, fmt: str, m: int, d: int, e: int, used: int, n: int, k: int, out: str, control: str,
             block=(128, 128)) -> None:
    suffix = "" if out == "f32" else "_bf16"
    kernel = f"gemv_grouped_{fmt}_lane16{suffix}"
    define = _define(kernel, fmt, out == "f32") if control == "variant" else None

    def make(rng):
        group = _group(rng, m, d, used)
        return {"x": _x(rng, m, k), "w": _experts(rng, fmt, e, np.setdiff1d(np.arange(e), group), n, k, block),
                "group": group}

    def run(kn, dd, group=None):
        g = dd["group"] if group is None else group
        return {"y": ops_gemm.gemm_grouped(kn, dd["x"], dd["w"].to(kn.xp), g, out=out, decode=d)}

    def replay(dd):
        return {"y": REF.gemm_grouped(dd["x"], dd["w"], dd["group"], out=out, decode=d)}

    if define is None:
        def ctl(kn, dd):
            return run(kn, dd, _misroute(kn, dd["group"], d, used, e))
    else:
        def ctl(kn, dd):
            return run(kn.variant(define), dd)

    case(Case(f"gemv_grouped_{fmt}{suffix.replace('_', '.')}[{label},{_tag(define) if define else 'route'}]",
              (kernel,), make, run, replay, ctl))


def _swiglu(label: str, fmt: str, m: int, d: int, e: int, used: int, n: int, k: int, limit, control: str,
            block=(128, 128)) -> None:
    """e = 0: the dense MLP kernel; e > 0: the grouped experts' kernel."""
    kind = "gemv_swiglu" if e == 0 else "gemv_grouped_swiglu"
    kernel = f"{kind}_{fmt}_lane16"
    define = _define(kernel, fmt, False) if control == "variant" else None

    def make(rng):
        x = _x(rng, m, k, 3.0)                                   # some pass the limit
        if e == 0:
            return {"x": x, "g": qweight(rng, fmt, n, k, block), "u": qweight(rng, fmt, n, k, block)}
        group = _group(rng, m, d, used)
        absent = np.setdiff1d(np.arange(e), group)
        return {"x": x, "g": _experts(rng, fmt, e, absent, n, k, block),
                "u": _experts(rng, fmt, e, absent, n, k, block), "group": group}

    def run(kn, dd, group=None, swap=False):
        g, u = dd["g"].to(kn.xp), dd["u"].to(kn.xp)
        if swap:
            g, u = u, g
        if e == 0:
            return {"y": ops_gemm_swiglu.gemm_swiglu(kn, dd["x"], g, u, limit, decode=d)}
        gr = dd["group"] if group is None else group
        return {"y": ops_gemm_swiglu.gemm_grouped_swiglu(kn, dd["x"], g, u, gr, limit, decode=d)}

    def replay(dd):
        if e == 0:
            return {"y": REF.gemm_swiglu(dd["x"], dd["g"], dd["u"], limit, decode=d)}
        return {"y": REF.gemm_grouped_swiglu(dd["x"], dd["g"], dd["u"], dd["group"], limit, decode=d)}

    if control == "variant":
        def ctl(kn, dd):
            return run(kn.variant(define), dd)
    elif control == "swap":
        def ctl(kn, dd):
            return run(kn, dd, swap=True)
    else:
        def ctl(kn, dd):
            return run(kn, dd, group=_misroute(kn, dd["group"], d, used, e))

    case(Case(f"{kind}_{fmt}[{label},{_tag(define) if define else control}]",
              _kernels(kernel, d, m, prompt_kernel(kernel)), make, run, replay, ctl))


def _flags(fmt: str, m: int, e: int, n: int, k: int, bad: int) -> None:
    """The grouped quantised gemv counting ids outside [0, E) into its guard slot itself (the last `bad` rows,
    sorted last as moe_sort puts them): their rows are NaN, flags = [bad, ~first bad row]. Control: slot -1."""
    def make(rng):
        ids = np.sort(rng.integers(0, e, m - bad)).astype(np.int32)
        tail = np.where(np.arange(bad) < bad // 2, e, e + 3).astype(np.int32)
        return {"x": _x(rng, m, k), "w": stack([qweight(rng, fmt, n, k) for _ in range(e)]),
                "group": np.concatenate([ids, tail])}

    def launch(kn, dd, slot):
        y = kn.empty((m, n), np.float32)
        flags = kn.xp.zeros((1, 2), dtype=np.uint32)
        ops_gemv_q.gemv_grouped(kn, dd["x"], dd["w"].to(kn.xp), dd["group"], y, "", (flags, slot))
        return {"y": y, "flags": flags}

    def replay(dd):
        y = np.full((m, n), np.nan, np.float32)
        for r in range(m - bad):
            y[r] = REF.gemm(dd["x"][r:r + 1], dd["w"][dd["group"][r]], decode=1)[0]
        return {"y": y, "flags": np.array([[bad, ~np.uint32(m - bad)]], dtype=np.uint32)}

    case(Case(f"gemv_grouped_{fmt}.flags", (f"gemv_grouped_{fmt}_lane16",), make,
              lambda kn, dd: launch(kn, dd, 0), replay, lambda kn, dd: launch(kn, dd, -1)))


for _f, _odd in (("fp8", 1100), ("nvfp4", 1104)):   # K with rows of packed bytes not a multiple of 16
    #        label        fmt   M    d    N     K     out
    _dense("decode",      _f,   1,   1, 272,  512, "f32")       # one token; a partial FP8 edge block in N
    _dense("verify",      _f,  16,  16,  40, _odd, "f32")       # 16 rows, three stages, scalar loads
    _dense("rows17",      _f,  17,  17,  33, 1536, "f32")       # two row groups, three full stages
    _dense("mixed",       _f,  20,   4, 144,  272, "f32")       # 4 decode rows + 16 prompt rows in one call
    _dense("long-k",      _f,   3,   3,  24, 4352, "f32")       # stages of 1,024 (FP8) / 2,048 (NVFP4) k, a tail
    _dense("decode",      _f,   1,   1, 272,  512, "bf16")
    _dense("verify",      _f,  16,  16,  40, _odd, "bf16")
    _dense("mixed",       _f,  19,   3, 200,  272, "bf16")
    #          label        fmt   M    d    E  used   N     K    out    control
    _grouped("decode",      _f,   8,   8,   8,   5,  64, 1040, "f32", "variant")   # a token's 8 slots, 3 stages
    _grouped("runs",        _f,  48,  48,   6,   2, 144,  256, "f32", "variant")   # runs longer than 16 rows
    _grouped("mixed",       _f,  30,  10,   6,   4,  33,  256, "f32", "route")     # decode pairs, then prompt
    _grouped("decode",      _f,   8,   8,   8,   5,  64,  512, "bf16", "variant")
    _grouped("long-k",      _f,  20,  20,   4,   2,  24, 4352, "bf16", "route")     # several stages, runs > 16
    _grouped("tiny",        _f,   8,   8,   8,   4,  32,   64, "bf16", "route", (32, 32))   # tiny's blocks
    #         label        fmt   M    d    E  used   N    K   limit  control
    _swiglu("decode",      _f,   1,   1,   0,   0,  64, 512,  2.0, "variant")       # one token, the clamp bites
    _swiglu("verify",      _f,  16,  16,   0,   0,  48, 608,  None, "variant")      # three stages of 256
    _swiglu("mixed",       _f,  12,   3,   0,   0, 160, 256,  2.0, "swap")          # 3 decode + 9 prompt rows
    _swiglu("long-k",      _f,   2,   2,   0,   0,  24, 2304,  2.0, "swap")         # stages of 512 / 1,024 k
    _swiglu("tail",        _f,   5,   5,   0,   0,  20, 512,  2.0, "variant")       # a pair block of 4 columns
    _swiglu("decode-8",    _f,   8,   8,   8,   5,  64, 512,  2.0, "variant")       # one token's 8 pairs
    _swiglu("long-k",      _f,  20,  20,   4,   2,  24, 2304, None, "route")
    _swiglu("verify",      _f,  64,  64,   8,   3, 144, 256,  None, "variant")      # runs longer than 16 rows
    _swiglu("mixed",       _f,  40,  16,   8,   6,  40, 256,  2.0, "route")
    _flags(_f, 40, 3, 17, 256, 20)                              # bad runs longer than 16 rows


def _cover() -> None:
    """Every kernel meets every planted variant of its format: one more case (a decode call across two stages
    and two FP8 blocks each way) for each the table leaves out."""
    for kernel, used in list(_USED.items()):
        fmt = "fp8" if "_fp8_" in kernel else "nvfp4"
        f32_out = not kernel.endswith("_bf16") and "swiglu" not in kernel
        for define in _pool(fmt, f32_out):
            if define in used:
                continue
            out = "f32" if f32_out else "bf16"
            if kernel.startswith("gemv_grouped_swiglu"):
                _swiglu("cover", fmt, 8, 8, 4, 3, 144, 768, 2.0, "variant")
            elif kernel.startswith("gemv_swiglu"):
                _swiglu("cover", fmt, 2, 2, 0, 0, 144, 768, 2.0, "variant")
            elif kernel.startswith("gemv_grouped"):
                _grouped("cover", fmt, 8, 8, 4, 3, 144, 768, out, "variant")
            else:
                _dense("cover", fmt, 2, 2, 144, 768, out)


_cover()
