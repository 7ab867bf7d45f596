"""kda_step's out= (model/kda.py's views of a multi-sequence call's y and gate rows): the kernel writes the
caller's rows in place with the bits of the out-of-place call, and the launcher refuses a view it cannot write."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend import make_ops
from cupyglm.backend.lanes import BF16
from cupyglm.contract.cases_kda_step import _params
from cupyglm.contract.cases_kda import _bf

H, K, R, N, TAPS = 2, 16, 16, 2, 4


@pytest.fixture(scope="module")
def step():
    ops, rng = make_ops("sim"), np.random.default_rng(3)
    d = _params(rng, N, H, K, R, TAPS)
    S = (rng.standard_normal((H, K, K)) * 0.3).astype(np.float32)         # [H, K, K] fp32
    window = _bf(rng, (TAPS - 1, 3 * H * K))                               # [taps - 1, 3HK] bf16

    def call(out=None):
        return ops.kda_step(S, d["x"], window, d["w"], d["fa"], d["ga"], d["f_b"], d["g_b"], d["a_log"],
                            d["dt_bias"], d["beta"], -5.0, 1e-6, K ** -0.5, out=out)
    return call


def test_out_views_are_written_in_place_with_the_same_bits(step):
    y0, g0, S0, w0 = step()
    y = np.full((N + 2, H, K), np.nan, BF16)                               # [rows, H, K] bf16: the call's rows
    gate = np.full((N + 2, H, K), np.nan, BF16)
    got = step(out=(y[1:1 + N], gate[1:1 + N]))
    assert got[0].base is y and got[1].base is gate
    assert np.array_equal(y[1:1 + N].view(np.uint16), y0.view(np.uint16))
    assert np.array_equal(gate[1:1 + N].view(np.uint16), g0.view(np.uint16))
    assert np.isnan(y[[0, N + 1]].astype(np.float32)).all() and np.isnan(gate[[0, N + 1]].astype(np.float32)).all()
    assert np.array_equal(got[2], S0) and np.array_equal(got[3].view(np.uint16), w0.view(np.uint16))


def test_out_views_it_cannot_write_are_refused(step):
    ok = np.zeros((N, H, K), BF16)
    with pytest.raises(ValueError, match=r"kda_step: parameter out gate must have shape"):
        step(out=(ok, np.zeros((N + 1, H, K), BF16)))
    with pytest.raises(ValueError, match=r"kda_step: parameter out y must be bfloat16, got float32"):
        step(out=(np.zeros((N, H, K), np.float32), ok))
    with pytest.raises(ValueError, match=r"kda_step: parameter out y must be C-contiguous"):
        step(out=(np.zeros((H, N, K), BF16).transpose(1, 0, 2), ok))
    ro = np.zeros((N, H, K), BF16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"kda_step: out gate must be writeable"):
        step(out=(ok, ro))
    with pytest.raises(ValueError, match=r"kda_step: out must be \(y, gate\) views, got 1 arrays"):
        step(out=(ok,))
