"""The emulator's mma.m16n8k16 (cuda_src/mma.cuh through cuda_src/sim/cuemu_mma.h): the PTX fragment layouts
(identity tiles put every element where the PTX ISA says), bit-identity with the NumPy model of the tensor core
(backend/tensor_core.py) under the three thread orders, row invariance, and a partial warp refused."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend import tensor_core as tc
from cupyglm.backend.lanes import bf16
from cupyglm.contract.cases_mma import adversarial
from cupyglm.kernels import mma_probe
from cupyglm.kernels.ops import Kernels
from cupyglm.kernels.sim_build import TC_ARCH


def _k(order="forward"):
    return Kernels("sim", np, order=order)


def bits(x):
    return np.ascontiguousarray(x).view(np.uint32)


@pytest.mark.parametrize("ldm", [False, True], ids=["global", "ldmatrix"])
def test_fragment_layouts_put_every_element_in_its_place(ldm):
    vals = bf16(np.arange(1, 129, dtype=np.float32).reshape(16, 8))
    # A = I: D = B (every B element reaches its (k, n))
    d = mma_probe.mma_chain(_k(), bf16(np.eye(16, dtype=np.float32)), vals, np.zeros((16, 8), np.float32), ldm)
    assert np.array_equal(d, vals.astype(np.float32))
    # B = [I; 0]: D = A[:, :8]; B = [0; I]: D = A[:, 8:]
    a = bf16(np.arange(256, dtype=np.float32).reshape(16, 16))
    top = bf16(np.vstack([np.eye(8), np.zeros((8, 8))]).astype(np.float32))
    bot = bf16(np.vstack([np.zeros((8, 8)), np.eye(8)]).astype(np.float32))
    zero = np.zeros((16, 8), np.float32)
    assert np.array_equal(mma_probe.mma_chain(_k(), a, top, zero, ldm), a[:, :8].astype(np.float32))
    assert np.array_equal(mma_probe.mma_chain(_k(), a, bot, zero, ldm), a[:, 8:].astype(np.float32))
    # A = 0: D = C, element by element
    c = np.arange(128, dtype=np.float32).reshape(16, 8) - 60.5
    assert np.array_equal(mma_probe.mma_chain(_k(), bf16(np.zeros((16, 16), np.float32)), vals, c, ldm), c)


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
@pytest.mark.parametrize("ldm", [False, True], ids=["global", "ldmatrix"])
def test_emulator_equals_the_model_bit_for_bit(order, ldm):
    a, b, c = adversarial(np.random.default_rng(7), 48, 16, 96)
    got = mma_probe.mma_chain(_k(order), a, b, c, ldmatrix=ldm)
    want = tc.mma_chain(a, b, c, arch=TC_ARCH)
    assert np.array_equal(bits(got), bits(want))
    # and the model is not an IEEE sum on these inputs (the test can tell them apart)
    ieee = (a.astype(np.float32) @ b.astype(np.float32) + c).astype(np.float32)
    assert not np.array_equal(bits(got), bits(ieee))


def test_rows_do_not_depend_on_the_batch():
    a, b, c = adversarial(np.random.default_rng(8), 64, 8, 32)
    full = mma_probe.mma_chain(_k(), a, b, c)
    part = mma_probe.mma_chain(_k(), np.ascontiguousarray(a[16:32]), b, np.ascontiguousarray(c[16:32]))
    assert np.array_equal(bits(full[16:32]), bits(part))


def test_a_partial_warp_is_refused():
    a, b, c = adversarial(np.random.default_rng(9), 16, 8, 16)
    d = np.zeros((16, 8), np.float32)
    with pytest.raises(Exception, match="all 32 lanes"):
        _k().launch(mma_probe.SRC, mma_probe.KERNEL, (1, 1), (16,), (a, b, c, d, np.int32(8), np.int32(16), np.int32(0)))


def test_launcher_refuses_shapes_off_the_tile():
    a, b, c = adversarial(np.random.default_rng(9), 16, 8, 16)
    with pytest.raises(ValueError, match="multiples"):
        mma_probe.mma_chain(_k(), np.ascontiguousarray(a[:, :8]), np.ascontiguousarray(b[:8]), c)
