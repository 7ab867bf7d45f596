"""The tensor-core kernels on a GPU with less shared memory a block (Kernels.shared_optin): an sm_120-sized emulator
(101,376 B) launches gemm_tc and gemm_tc_q (dense and grouped) and attention_tc within that limit, through their smaller builds,
with the big tiles' bits; the emulator refuses a launch above its limit, as the GPU would; the speed model keeps
the sm_90 tiles."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.contract.cases_attention_tc import PAGE, _inputs
from cupyglm.backend.qweight import stack
from cupyglm.contract.cases_gemm_q import qweight
from cupyglm.kernels import ops_attention_tc, ops_gemm_tc, ops_gemm_tc_q
from cupyglm.kernels.ops import SHARED_OPTIN, Kernels
from cupyglm.kernels.sim_errors import SimLaunchError

from bits import bf, bits

SM120 = SHARED_OPTIN["sm_120"]


@pytest.fixture
def launches(monkeypatch):
    """(kernel, dynamic shared bytes, the Kernels' opt-in limit) of every launch."""
    seen = []
    real = Kernels.launch

    def spy(self, source, name, grid, block, args, shared_mem=0):
        seen.append((name, shared_mem, self.shared_optin))
        return real(self, source, name, grid, block, args, shared_mem=shared_mem)

    monkeypatch.setattr(Kernels, "launch", spy)
    return seen


def test_sim_defaults_to_sm90_and_variants_keep_the_limit():
    k = Kernels("sim", np)
    assert k.shared_optin == SHARED_OPTIN["sm_90"] == 232_448
    small = k.with_shared_optin(SM120)
    assert small.shared_optin == SM120 and small.variant("X").shared_optin == SM120
    assert small.variant("X") is small.variant("X")


def test_gemm_tc_fits_sm120_with_the_big_tilesbits(launches):
    rng = np.random.default_rng(3)
    x, w = bf(rng, (140, 1056)), bf(rng, (270, 1056), 1056 ** -0.5)
    we, group = bf(rng, (3, 70, 1056)), (np.arange(140) % 3).astype(np.int32)
    big, small = Kernels("sim", np), Kernels("sim", np, shared_optin=SM120)
    for out in ("f32", "bf16"):
        assert np.array_equal(bits(ops_gemm_tc.gemm_tc(small, x, w, out=out)),
                              bits(ops_gemm_tc.gemm_tc(big, x, w, out=out)))
        assert np.array_equal(bits(ops_gemm_tc.gemm_tc_grouped(small, x, we, group, out=out)),
                              bits(ops_gemm_tc.gemm_tc_grouped(big, x, we, group, out=out)))
    sizes = {(lim, smem) for _, smem, lim in launches}
    assert sizes == {(SM120, ops_gemm_tc.SMALL_SHARED), (232_448, ops_gemm_tc.DENSE_SHARED)}
    assert ops_gemm_tc.SMALL_SHARED <= SM120 < ops_gemm_tc.DENSE_SHARED


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_gemm_tc_q_fits_sm120_with_the_big_tiles_bits(fmt, launches):
    rng = np.random.default_rng(4)
    x, w = bf(rng, (140, 640)), qweight(rng, fmt, 136, 640)
    we, group = stack([qweight(rng, fmt, 70, 640) for _ in range(3)]), (np.arange(140) % 3).astype(np.int32)
    big, small = Kernels("sim", np), Kernels("sim", np, shared_optin=SM120)
    assert np.array_equal(bits(ops_gemm_tc_q.gemm_tc_q(small, x, w, out="bf16")),
                          bits(ops_gemm_tc_q.gemm_tc_q(big, x, w, out="bf16")))
    assert np.array_equal(bits(ops_gemm_tc_q.gemm_tc_grouped_q(small, x, we, group)),
                          bits(ops_gemm_tc_q.gemm_tc_grouped_q(big, x, we, group)))
    sizes = {(lim, smem) for _, smem, lim in launches}
    assert sizes == {(SM120, ops_gemm_tc_q.SMALL_SHARED), (232_448, ops_gemm_tc_q.SHARED[fmt])}
    assert ops_gemm_tc_q.SMALL_SHARED <= SM120 < ops_gemm_tc_q.SHARED[fmt] <= 232_448


@pytest.mark.parametrize("h", [8, 32])
def test_attention_tc_fits_sm120_with_the_big_tilesbits(h, launches):
    d = _inputs(np.random.default_rng(5), h, 512, 240, 2, 1)
    big, small = Kernels("sim", np), Kernels("sim", np, shared_optin=SM120)

    def run(k):
        return ops_attention_tc.attention_tc(k, d["qa"], d["store"], d["tokens"], d["table"], d["seg"], PAGE,
                                             d["counts"], 512 ** -0.5)

    assert np.array_equal(bits(run(small)), bits(run(big)))
    assert [smem <= lim for _, smem, lim in launches] == [True, True]
    assert launches[0][1] == ops_attention_tc.shared_bytes(512, 1) <= SM120 < ops_attention_tc.shared_bytes(512)


def test_the_emulator_refuses_more_than_its_limit():
    rng = np.random.default_rng(1)
    x, w = bf(rng, (4, 64)), bf(rng, (8, 64))
    y = np.zeros((4, 8), np.float32)
    k = Kernels("sim", np, shared_optin=SM120)
    k.fn("gemm_tc.cu", "gemm_tc").max_dynamic_shared_size_bytes = ops_gemm_tc.DENSE_SHARED
    with pytest.raises(SimLaunchError, match="opt-in maximum of 101376"):
        k.launch("gemm_tc.cu", "gemm_tc", (1, 1, 1), (256,), (x, w, y, np.int32(4), np.int32(8), np.int32(64)),
                 shared_mem=ops_gemm_tc.DENSE_SHARED)


def test_no_tile_fits_is_refused_by_name():
    k = Kernels("sim", np, shared_optin=48 * 1024)
    rng = np.random.default_rng(2)
    with pytest.raises(ValueError, match="gemm_tc: the device's 49152 B"):
        ops_gemm_tc.gemm_tc(k, bf(rng, (4, 64)), bf(rng, (8, 64)))
    small = Kernels("sim", np, shared_optin=ops_attention_tc.shared_bytes(512, 1) - 1)
    with pytest.raises(ValueError, match=f"attention_tc at R=512: the device's {small.shared_optin} B"):
        ops_attention_tc.variant(small, 512)


def test_the_speed_model_prices_the_sm90_tiles():
    from bench.sass import kernels as sk

    assert sk.GEMM_TC.dyn_shared == sk.GEMM_TC_GROUPED.dyn_shared == ops_gemm_tc.DENSE_SHARED == 229_376
    assert sk.attention_tc_prompt(512).dyn_shared == ops_attention_tc.shared_bytes(512) > SM120
