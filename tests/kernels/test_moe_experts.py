"""op moe_experts (cuda_src/moe_decode.cu) beyond the contract's cases: a call whose pairs exceed the fused
kernels' shared memory runs the separate ops (the same bits, other launches); quantised experts (FP8, NVFP4; the
shared down quantised or bf16) take the two fused launches, on the emulator and on the cuda path (the CuPy
double's launch count); and the launchers refuse what the kernels cannot take."""
from __future__ import annotations

import numpy as np
import pytest

from cupy_double.fixtures import cuda_double  # noqa: F401
from cupyglm.backend.lanes import bf16, to_bits
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.qweight import QWeight, stack
from cupyglm.contract.cases_gemm_q import qweight
from cupyglm.kernels import ops_moe_decode
from cupyglm.kernels.ops import Kernels


def _inputs(t, e, d, n, ns, seed=0):
    rng = np.random.default_rng(seed)

    def bf(shape, std=1.0):
        return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std))

    return (bf((t, d)), (rng.standard_normal((t, e)) * 2.0).astype(np.float32),
            (rng.standard_normal(e) * 0.1).astype(np.float32), bf((e, n, d), d ** -0.5), bf((e, n, d), d ** -0.5),
            bf((e, d, n), n ** -0.5), bf((t, ns)), bf((d, ns), ns ** -0.5))


def _call(ops_or_k, fn, t, k, e, d, n, ns):
    x, logits, bias, gate, up, down, sh_act, sh_down = _inputs(t, e, d, n, ns)
    return fn(*(() if ops_or_k is None else (ops_or_k,)), x, logits, bias, k, 2.5, gate, up, down, 10.0, sh_act,
              sh_down)


@pytest.mark.parametrize("t,k", [(3, 4), (ops_moe_decode.MAX_PAIRS // 4 + 1, 4)])
def test_fused_and_separate_paths_give_the_reference_bits(t, k, monkeypatch):
    kn = Kernels("sim", np)
    launched, launch = [], Kernels.launch
    monkeypatch.setattr(Kernels, "launch", lambda self, src, name, *a, **kw: (launched.append(name),
                                                                              launch(self, src, name, *a, **kw)))
    got = _call(kn, ops_moe_decode.moe_experts, t, k, 12, 32, 16, 8)
    want = _call(None, NumpyOps().moe_experts, t, k, 12, 32, 16, 8)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    fused = t * k <= ops_moe_decode.MAX_PAIRS
    assert (launched == ["moe_route_swiglu_lane16", "moe_down_combine_lane16"]) == fused, launched
    assert ("moe_route_sort" in launched) == (not fused)


def test_launchers_refuse_what_the_kernels_cannot_take():
    kn = Kernels("sim", np)
    x, logits, bias, gate, up, down, sh_act, sh_down = _inputs(2, 6, 16, 16, 8)
    with pytest.raises(ValueError, match="k must be"):
        ops_moe_decode.route_swiglu(kn, x, logits, bias, 7, 2.5, gate, up, 10.0, 1)
    with pytest.raises(ValueError, match="pairs"):
        ops_moe_decode.route_swiglu(kn, x, logits, bias, 2, 2.5, gate, up, 10.0, 0)
    with pytest.raises(ValueError, match="tickets"):
        ops_moe_decode.down_combine(kn, bf16(np.zeros((4, 16), np.float32)), down, np.zeros(4, np.int32),
                                    np.arange(4, dtype=np.int32), np.ones((2, 2), np.float32), sh_act, sh_down,
                                    np.zeros(3, np.uint32))


def _q_inputs(fmt, sh_fmt, t, e=12, d=64, n=32, ns=32, seed=0):
    """_inputs with the experts' gate / up / down in fmt and the shared down in sh_fmt (or bf16)."""
    x, logits, bias, _, _, _, sh_act, sh_down = _inputs(t, e, d, n, ns, seed)
    rng = np.random.default_rng(seed + 1)

    def q(f, rows, cols):
        return qweight(rng, f, rows, cols, (32, 32))

    gate, up, down = (stack([q(fmt, *shape) for _ in range(e)]) for shape in ((n, d), (n, d), (d, n)))
    return x, logits, bias, gate, up, down, sh_act, sh_down if sh_fmt == "bf16" else q(sh_fmt, d, ns)


def _recording(monkeypatch):
    launched, launch = [], Kernels.launch
    monkeypatch.setattr(Kernels, "launch", lambda self, src, name, *a, **kw: (launched.append(name),
                                                                              launch(self, src, name, *a, **kw)))
    return launched


@pytest.mark.parametrize("fmt,sh_fmt,t", [("fp8", "fp8", 3), ("nvfp4", "nvfp4", 1), ("fp8", "bf16", 9),
                                          ("nvfp4", "bf16", 9), ("nvfp4", "fp8", 2)])
def test_quantised_experts_take_the_fused_launches_with_the_reference_bits(fmt, sh_fmt, t, monkeypatch):
    launched = _recording(monkeypatch)
    args = _q_inputs(fmt, sh_fmt, t)
    x, logits, bias, gate, up, down, sh_act, sh_down = args
    got = ops_moe_decode.moe_experts(Kernels("sim", np), x, logits, bias, 4, 2.5, gate, up, down, 10.0, sh_act,
                                     sh_down)
    want = NumpyOps().moe_experts(x, logits, bias, 4, 2.5, gate, up, down, 10.0, sh_act, sh_down)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    fused = [f"moe_route_swiglu_{fmt}_lane16", f"moe_down_combine_{fmt}_lane16"]
    assert (launched == fused) == (sh_fmt in (fmt, "bf16")), launched     # a shared down in another format: apart


@pytest.mark.parametrize("fmt,sh_fmt", [("fp8", "fp8"), ("nvfp4", "nvfp4"), ("nvfp4", "bf16")])
def test_quantised_experts_launch_twice_on_the_cuda_path(cuda_double, fmt, sh_fmt):
    import cupy
    import cupy_double

    args = _q_inputs(fmt, sh_fmt, 5)
    dev = [a.to(cupy) if isinstance(a, QWeight) else cupy.asarray(to_bits(a) if a.dtype == bf16(np.zeros(1)).dtype
                                                                      else a) for a in args]
    x, logits, bias, gate, up, down, sh_act, sh_down = dev
    k = Kernels("cuda", cupy)
    with cupy_double.counting(trace=True) as c:
        got = ops_moe_decode.moe_experts(k, x, logits, bias, 4, 2.5, gate, up, down, 10.0, sh_act, sh_down)
    assert c.launches == 2 and c.kernels == 0, c.where          # no CuPy kernel either (the gather, stand-ins)
    x, logits, bias, gate, up, down, sh_act, sh_down = args
    want = NumpyOps().moe_experts(x, logits, bias, 4, 2.5, gate, up, down, 10.0, sh_act, sh_down)
    assert np.array_equal(got.get().view(np.uint32), want.view(np.uint32))
