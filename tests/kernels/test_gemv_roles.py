"""A row's role picks its GEMM kernel (DESIGN §3b): decode/verify rows go to cuda_src/gemv*.cu, prompt rows to
gemm*.cu, whatever the number of rows; a forward puts decode sequences' rows first and gives outputs back in the
batch's order; a mixed batch equals each sequence alone and the numpy reference, bit for bit (sim)."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.sim_ops import SimOps
from cupyglm.model.batch import decode_rows, segments
from cupyglm.model.glm import SeqInput
from model_helpers import bits, build_models


class Recorder:
    """Wraps a SimOps' Kernels.launch: the kernel names launched since the last take()."""

    def __init__(self, ops):
        self.names: list[str] = []
        launch = ops.kernels.launch

        def rec(src, name, *a, **kw):
            self.names.append(name)
            return launch(src, name, *a, **kw)

        ops.kernels.launch = rec

    def take(self) -> list[str]:
        out, self.names = self.names, []
        return out


def _gemms(names):
    return sorted({n for n in names if n.startswith(("gemm", "gemv"))})


def test_role_not_row_count_picks_the_kernel():
    ops = SimOps()
    rec = Recorder(ops)
    rng = np.random.default_rng(0)
    w = bf16(rng.standard_normal((40, 64)))
    for m in (1, 16):
        x = bf16(rng.standard_normal((m, 64)))
        ops.gemm(x, w)
        assert _gemms(rec.take()) == ["gemm_tc"], f"{m} prompt rows"
        ops.gemm(x, w, decode=m)
        assert _gemms(rec.take()) == ["gemv_lane16"], f"{m} decode rows"
    x = bf16(rng.standard_normal((9, 64)))
    y = ops.gemm(x, w, out="bf16", decode=4)
    assert _gemms(rec.take()) == ["gemm_tc_bf16", "gemv_lane16_bf16"]
    assert np.array_equal(bits(y), bits(NumpyOps().gemm(x, w, out="bf16", decode=4)))


def test_norm_prologue_by_role():
    """rmsnorm_gemm_multi: decode rows in one launch (the norm in the GEMV's prologue, no norm kernel); kda_out_gemm:
    the norm kernel once, then decode rows on the GEMV; prompt rows through the norm kernel and gemm_tc.cu; every mix
    equals the numpy norm-then-gemm."""
    ops, ref = SimOps(), NumpyOps()
    rec = Recorder(ops)
    rng = np.random.default_rng(1)
    y, gate = bf16(rng.standard_normal((9, 3, 32)) * 0.3), bf16(rng.standard_normal((9, 3, 32)))
    wn, w = bf16(1 + 0.2 * rng.standard_normal(32)), bf16(rng.standard_normal((24, 96)) * 0.1)
    x, xn = bf16(rng.standard_normal((9, 64))), bf16(1 + 0.2 * rng.standard_normal(64))
    ws = (bf16(rng.standard_normal((40, 64)) * 0.1), bf16(rng.standard_normal((16, 64)) * 0.1))
    for d, want in ((9, ["gemv_lane16", "kda_out"]), (0, ["gemm_tc", "kda_out"]),
                    (4, ["gemm_tc", "gemv_lane16", "kda_out"])):
        got = ops.kda_out_gemm(y, wn, gate, 1e-5, w, decode=d)
        assert sorted(set(rec.take())) == want, d
        assert np.array_equal(bits(got), bits(ref.kda_out_gemm(y, wn, gate, 1e-5, w, decode=d)))
        assert np.array_equal(bits(got), bits(ref.gemm(ref.kda_out(y, wn, gate, 1e-5).reshape(9, 96), w, decode=d)))
    for d, want in ((9, ["gemv_multi_rmsnorm_lane16"]), (0, ["gemm_tc_bf16", "rmsnorm_rows"]),
                    (2, ["gemm_tc_bf16", "gemv_multi_rmsnorm_lane16", "rmsnorm_rows"])):
        got = ops.rmsnorm_gemm_multi(x, xn, 1e-5, ws, ("bf16", "f32"), decode=d)
        names = sorted(set(rec.take()))
        assert [n for n in names if n != "gemm_tc"] == want, d
        normed = ref.rmsnorm(x, xn, 1e-5)
        for g, wp, o in zip(got, ws, ("bf16", "f32")):
            assert np.array_equal(bits(g), bits(ref.gemm(normed, wp, out=o, decode=d)))


@pytest.mark.parametrize("bad", [-1, 10, 2.0, True, None])
def test_decode_count_is_checked_on_every_backend(bad):
    x, w = bf16(np.ones((9, 16))), bf16(np.ones((4, 16)))
    for ops in (NumpyOps(), SimOps()):
        with pytest.raises(ValueError, match="decode"):
            ops.gemm(x, w, decode=bad)


def test_decode_segments_must_come_first():
    a = segments([None, None], [0, 5], [3, 1], [True, False])
    assert decode_rows(a) == 3
    with pytest.raises(ValueError, match="follows a prompt"):
        decode_rows(segments([None, None], [0, 5], [3, 1], [False, True]))


@pytest.fixture(scope="module")
def models(tiny_ckpt):
    ref = build_models(tiny_ckpt, tp=1, num_pages=64)[0]
    sim_ops = SimOps()
    return ref, build_models(tiny_ckpt, tp=1, num_pages=64, mtp=True, ops=sim_ops)[0], Recorder(sim_ops)


def test_decode_rows_use_only_the_gemv_and_a_mixed_batch_is_exact(models):
    ref, sim, rec = models
    prompts = [list(range(3, 40)), [9, 8, 7, 6, 5]]
    rs = [ref.new_state() for _ in prompts]
    ss = [sim.new_state() for _ in prompts]
    for m, sts in ((ref, rs), (sim, ss)):
        m.forward([SeqInput(np.asarray(p, np.int32), s) for p, s in zip(prompts, sts)])
    assert not any(n.startswith("gemv") for n in rec.take()), "prompt rows went to the gemv"
    # a prompt chunk of a third sequence first in the batch, the two decode rows after it
    third = [100, 101, 102, 103, 104, 105]
    rs.append(ref.new_state())
    ss.append(sim.new_state())
    feeds = [np.array([11], np.int32), np.array([12], np.int32)]
    want = ref.forward([SeqInput(np.asarray(third, np.int32), rs[2])] +
                       [SeqInput(f, s, decode=True) for f, s in zip(feeds, rs[:2])])
    got = sim.forward([SeqInput(np.asarray(third, np.int32), ss[2])] +
                      [SeqInput(f, s, decode=True) for f, s in zip(feeds, ss[:2])])
    names = rec.take()
    assert {"gemv_lane16", "gemv_lane16_bf16", "gemv_swiglu_lane16", "moe_route_swiglu_lane16",
            "moe_down_combine_lane16", "gemv_multi_lane16", "gemv_multi_swiglu_lane16", "kda_out",
            "gemv_multi_rmsnorm_lane16"} <= set(names)
    for w, g in zip(want, got):                     # outputs in the batch's order
        assert np.array_equal(bits(w.logits), bits(g.logits))
    # decode rows alone: no gemm kernel at all
    want = ref.forward([SeqInput(np.array([13], np.int32), s, decode=True) for s in rs])
    got = sim.forward([SeqInput(np.array([13], np.int32), s, decode=True) for s in ss])
    names = rec.take()
    assert not any(n.startswith("gemm") for n in names), _gemms(names)
    for w, g in zip(want, got):
        assert np.array_equal(bits(w.logits), bits(g.logits))
    assert got[0].mtp_logits is not None
    for m, sts in ((ref, rs), (sim, ss)):
        for s in sts:
            m.release(s)
