"""op moe_experts (cuda_src/moe_decode.cu) beyond the contract's cases: a call whose pairs exceed the fused
kernels' shared memory runs the separate ops (the same bits, other launches), and the launchers refuse what the
kernels cannot take."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
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
