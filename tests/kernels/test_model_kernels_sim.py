"""The model kernels (cuda_src/hc.cu, kda.cu, indexer.cu, attention.cu, moe.cu) on the CPU emulator.

* every op against the NumPy reference (NumpyOps) on inputs other than the contract's (other seeds and
  sizes), under forward, reverse and shuffled thread orders, with bit-identical outputs across the orders and
  the tolerance its contract case states (0 where no exp is involved);
* kda_recurrence / kda_conv: one call over n tokens equals the same tokens fed in any split (state and window
  carried), bit for bit: prefill = decode;
* attention, hc_pre, moe_route, index_scores: a row's output does not depend on the other rows of the call;
* the launchers refuse wrong dtypes and shapes naming the kernel and parameter.
"""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import BF16, bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract import cases_attention, cases_hc, cases_indexer, cases_kda, cases_moe
from cupyglm.contract.registry import ulp_distance
from cupyglm.kernels import ops_attention, ops_hc, ops_indexer, ops_kda, ops_moe
from cupyglm.kernels.ops import Kernels

REF = NumpyOps()
ORDERS = ("forward", "reverse", "shuffled")
KS = {o: Kernels("sim", np, order=o) for o in ORDERS}
K = KS["forward"]


def _bf(rng, shape, std=1.0, mean=0.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std) + np.float32(mean))


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


# ---- every op vs the reference, three thread orders -----------------------------------------------------------
def _hc_pre_args(rng, t, d):
    inp = cases_hc._inputs(rng, t, 4, d)
    return (inp["X"], inp["fn"], inp["base"], inp["scale"], 1e-5, 1e-6, 20)


def _hc_post_args(rng, t, d):
    X, fn, base, scale, *_ = _hc_pre_args(rng, t, d)
    _, post, comb = REF.hc_pre(X, fn, base, scale, 1e-5, 1e-6, 20)
    return (X, (rng.standard_normal((t, d)) * 2.0).astype(np.float32), post, comb)   # branch: the fp32 partial


def _rec_args(rng, n, h, v, kd):
    d = cases_kda._rec_inputs(rng, n, h, v, kd)
    return (d["S"], d["q"], d["k"], d["v"], d["g"], d["beta"])


def _attn_args(rng, positions, h, r, chunk, npools):
    d = cases_attention._inputs(rng, positions, h, r, npools, 2.0)
    return (d["qa"], d["store"], d["rows"], d["counts"], r ** -0.5, chunk)


def _route_args(rng, t, e, k):
    logits = (rng.standard_normal((t, e)) * 2).astype(np.float32)
    logits[:, 1] = logits[:, 0]                    # a tie in every row
    return (logits, (rng.standard_normal(e) * 0.1).astype(np.float32), k, 2.5)     # bias stored F32


# (op, launcher, args builder, per-output tolerance in fp32 ULPs as the contract states it)
SPECS = [
    ("hc_pre", ops_hc.hc_pre, lambda r: _hc_pre_args(r, 5, 128),
     (cases_hc.X_ULPS, cases_hc.GATE_ULPS, cases_hc.GATE_ULPS)),
    ("hc_post", ops_hc.hc_post, lambda r: _hc_post_args(r, 6, 200), (0,)),
    ("stream_mean", ops_hc.stream_mean, lambda r: (_bf(r, (4, 4, 130)),), (0,)),
    ("kda_conv", ops_kda.kda_conv, lambda r: (_bf(r, (6, 200)), _bf(r, (3, 200)), _bf(r, (200, 4), 0.5)),
     (cases_kda.CONV_ULPS, 0)),
    ("kda_gate", ops_kda.kda_gate, lambda r: (_bf(r, (3, 2, 48)), np.log(r.uniform(1, 16, 2)).astype(np.float32),
                                              (r.standard_normal((2, 48)) * 0.5).astype(np.float32), -5.0), (cases_kda.GATE_ULPS,)),
    ("l2norm", ops_kda.l2norm, lambda r: (_bf(r, (3, 5, 64)), 1e-6), (0,)),
    ("kda_recurrence", ops_kda.kda_recurrence, lambda r: _rec_args(r, 6, 3, 48, 64), (0, 0)),
    ("kda_out", ops_kda.kda_out, lambda r: (_bf(r, (4, 3, 48), 0.3), _bf(r, (48,), 0.2, 1.0), _bf(r, (4, 3, 48), 2.0),
                                            1e-5), (cases_kda.OUT_ULPS,)),
    ("index_pool", ops_indexer.index_pool, lambda r: (_bf(r, (7, 4, 48)), _bf(r, (7, 4, 48), 2.0), _bf(r, (4, 48), .5)),
     (cases_indexer.POOL_ULPS,)),
    ("index_scores", ops_indexer.index_scores,
     lambda r: (_bf(r, (5, 8, 64)), r.standard_normal((5, 8)).astype(np.float32), _bf(r, (70, 64))), (0,)),
    ("attention", ops_attention.attention, lambda r: _attn_args(r, [3, 40, 41, 90], 2, 96, 24, 8),
     (cases_attention.ULPS,)),
    ("moe_route", ops_moe.moe_route, lambda r: _route_args(r, 9, 24, 4), (0, cases_moe.ROUTE_ULPS)),
    ("swiglu", ops_moe.swiglu, lambda r: (_bf(r, (5, 96), 6.0), _bf(r, (5, 96), 6.0), 10.0), (cases_moe.SWIGLU_ULPS,)),
    ("moe_combine", ops_moe.moe_combine, lambda r: ((r.standard_normal((5, 3, 96))).astype(np.float32),
                                                    r.uniform(0, 1, (5, 3)).astype(np.float32),
                                                    r.standard_normal((5, 96)).astype(np.float32)), (0,)),
    ("sigmoid", ops_moe.sigmoid, lambda r: ((r.standard_normal((7, 33)) * 4).astype(np.float32),),
     (cases_moe.SIG_ULPS,)),
    ("residual_add", ops_hc.residual_add, lambda r: (_bf(r, (5, 130), 2.0), (r.standard_normal((5, 130)) * 2).astype(np.float32)),
     (0,)),
]


@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
def test_op_matches_reference_in_every_thread_order(spec):
    name, launcher, build, tols = spec
    args = build(np.random.default_rng(20260))
    want = _as_tuple(getattr(REF, name)(*args))
    first = None
    for order in ORDERS:
        got = _as_tuple(launcher(KS[order], *args))
        assert len(got) == len(want) == len(tols)
        for g, w, tol in zip(got, want, tols):
            assert g.shape == w.shape and g.dtype == w.dtype, (order, g.shape, w.shape, g.dtype, w.dtype)
            if w.dtype.kind == "f" or w.dtype == BF16:
                assert ulp_distance(g, w) <= tol, (name, order, ulp_distance(g, w), tol)
            else:
                assert np.array_equal(g, w), (name, order)
        if first is None:
            first = got
        else:
            for a, b in zip(first, got):
                assert a.tobytes() == b.tobytes(), f"{name}: {order} differs from forward (a race)"


# ---- prefill = decode -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("splits", [[1] * 9, [9], [4, 5], [2, 6, 1]])
def test_kda_recurrence_state_split_invariance(splits):
    S, q, k, v, g, beta = _rec_args(np.random.default_rng(5), 9, 4, 32, 32)
    y_all, S_all = ops_kda.kda_recurrence(K, S, q, k, v, g, beta)
    ys, state, at = [], S, 0
    for n in splits:
        sl = slice(at, at + n)
        y, state = ops_kda.kda_recurrence(K, state, q[sl], k[sl], v[sl], g[sl], beta[sl])
        ys.append(y)
        at += n
    assert np.array_equal(_bits(np.concatenate(ys)), _bits(y_all))
    assert np.array_equal(_bits(state), _bits(S_all))
    assert not np.isnan(S_all).any()


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_kda_recurrence_staged_equals_the_generic_kernel(rows):
    """The staged kernel at 1, 2 or 4 value rows a group (V = 36: a last group short of rows; 19 tokens: a prompt
    ending inside a stage; q an unaligned view, copied by the launcher) has the generic kernel's bits."""
    n, h, vd, kd = 19, 2, 36, 128
    S, q, k, v, g, beta = _rec_args(np.random.default_rng(6), n, h, vd, kd)
    y0, S0 = K.empty((n, h, vd), K.bf16), K.empty(S.shape)
    K.launch(ops_kda.SRC, "kda_recurrence", (-(-vd // 8), h), (128,),
             (S, q, k, v, g, beta, y0, S0, np.int32(n), np.int32(h), np.int32(vd), np.int32(kd)))
    qv = np.concatenate([np.zeros(1, np.float32), q.ravel()])[1:].reshape(q.shape)
    assert qv.__array_interface__["data"][0] % 16
    y, S1 = ops_kda.kda_recurrence_rows(K, S, qv, k, v, g, beta, rows)
    assert np.array_equal(_bits(y), _bits(y0)) and np.array_equal(_bits(S1), _bits(S0))


@pytest.mark.parametrize("splits", [[1] * 7, [7], [2, 5], [1, 1, 5]])
def test_kda_conv_window_split_invariance(splits):
    rng = np.random.default_rng(6)
    x, win, w = _bf(rng, (7, 96)), _bf(rng, (3, 96)), _bf(rng, (96, 4), 0.5)
    y_all, win_all = ops_kda.kda_conv(K, x, win, w)
    ys, at = [], 0
    for n in splits:
        y, win = ops_kda.kda_conv(K, x[at:at + n], win, w)
        ys.append(y)
        at += n
    assert np.array_equal(_bits(np.concatenate(ys)), _bits(y_all))
    assert np.array_equal(_bits(win), _bits(win_all))


# ---- row independence -----------------------------------------------------------------------------------------
def test_attention_row_independence():
    """Each row alone (and beside rows with other lists, other queries, other chunk counts) gives the same bits."""
    qa, store, rows, counts, scale, chunk = _attn_args(np.random.default_rng(8), [0, 7, 35, 36, 50, 120], 4, 64, 32, 8)
    together = ops_attention.attention(K, qa, store, rows, counts, scale, chunk)
    for i in range(qa.shape[0]):
        alone = ops_attention.attention(K, qa[i:i + 1].copy(), store, rows[i:i + 1].copy(), counts[i:i + 1].copy(),
                                        scale, chunk)
        assert np.array_equal(_bits(alone[0]), _bits(together[i])), i
    perm = np.random.default_rng(9).permutation(qa.shape[0])
    shuffled = ops_attention.attention(K, qa[perm].copy(), store, rows[perm].copy(), counts[perm].copy(), scale, chunk)
    assert np.array_equal(_bits(shuffled), _bits(together[perm]))
    assert not np.isnan(together).any()            # the NaN store rows outside the lists were never read


def test_row_ops_do_not_depend_on_the_batch():
    rng = np.random.default_rng(10)
    X, fn, base, scale, *rest = _hc_pre_args(rng, 7, 64)
    full = ops_hc.hc_pre(K, X, fn, base, scale, *rest)
    one = ops_hc.hc_pre(K, X[3:4].copy(), fn, base, scale, *rest)
    for a, b in zip(full, one):
        assert np.array_equal(_bits(a[3:4]), _bits(b))
    logits, bias, topk, sc = _route_args(rng, 7, 16, 3)
    ids, w = ops_moe.moe_route(K, logits, bias, topk, sc)
    ids1, w1 = ops_moe.moe_route(K, logits[5:6].copy(), bias, topk, sc)
    assert np.array_equal(ids[5:6], ids1) and np.array_equal(_bits(w[5:6]), _bits(w1))
    qi, hw, pk = _bf(rng, (6, 4, 32)), rng.standard_normal((6, 4)).astype(np.float32), _bf(rng, (20, 32))
    s = ops_indexer.index_scores(K, qi, hw, pk)
    s1 = ops_indexer.index_scores(K, qi[2:3].copy(), hw[2:3].copy(), pk)
    assert np.array_equal(_bits(s[2:3]), _bits(s1))


def test_moe_route_ties_go_to_the_lower_id():
    logits = np.zeros((2, 12), dtype=np.float32)             # every score ties
    ids, w = ops_moe.moe_route(K, logits, np.zeros(12, np.float32), 4, 2.5)
    assert ids.tolist() == [[0, 1, 2, 3]] * 2
    assert np.array_equal(_bits(w), _bits(REF.moe_route(logits, np.zeros(12, np.float32), 4, 2.5)[1]))


# ---- launchers refuse bad arguments ----------------------------------------------------------------------------
def test_launchers_refuse_wrong_dtype_and_shape():
    rng = np.random.default_rng(11)
    S, q, k, v, g, beta = _rec_args(rng, 2, 2, 16, 16)
    with pytest.raises(ValueError, match="kda_recurrence: parameter beta"):
        ops_kda.kda_recurrence(K, S, q, k, v, g, beta.astype(np.float64))
    with pytest.raises(ValueError, match="kda_recurrence: parameter v"):
        ops_kda.kda_recurrence(K, S, q, k, v[:, :, :8], g, beta)
    qa, store, rows, counts, scale, chunk = _attn_args(rng, [5], 2, 32, 8, 8)
    with pytest.raises(ValueError, match="attention: parameter rows"):
        ops_attention.attention(K, qa, store, rows.astype(np.int64), counts, scale, chunk)
    with pytest.raises(ValueError, match="hc_pre: parameter fn"):
        ops_hc.hc_pre(K, _bf(rng, (1, 4, 16)), _bf(rng, (24, 63)), _bf(rng, (24,)), _bf(rng, (3,)), 1e-5, 1e-6, 20)
