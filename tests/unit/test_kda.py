"""KDA: the fp32 delta rule against a float64 naive loop; splitting a sequence never changes a bit."""
import numpy as np
import pytest

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps

ops = NumpyOps()
TOL = 2e-4   # relative to max |y|: fp32 state vs float64 over 40 tokens


def _inputs(seed, n=40, h=3, k=32):
    rng = np.random.default_rng(seed)
    q = ops.l2norm(bf16(rng.standard_normal((n, h, k)).astype(np.float32)), 1e-6) * np.float32(k ** -0.5)
    kk = ops.l2norm(bf16(rng.standard_normal((n, h, k)).astype(np.float32)), 1e-6)
    v = bf16(rng.standard_normal((n, h, k)).astype(np.float32))          # [n, H, V] bf16, as the model keeps it
    g = np.exp(-5.0 * rng.random((n, h, k))).astype(np.float32)
    beta = bf16(rng.random((n, h)).astype(np.float32))                 # [n, H] bf16
    return q, kk, v, g, beta


def _naive(q, k, v, g, beta):
    v, beta = v.astype(np.float64), beta.astype(np.float64)
    n, h, d = q.shape
    S = np.zeros((h, d, d))
    ys = []
    for t in range(n):
        S = S * g[t][:, None, :].astype(np.float64)
        kv = np.einsum("hvk,hk->hv", S, k[t])
        S = S + np.einsum("hv,hk->hvk", (v[t] - kv) * beta[t][:, None], k[t])
        ys.append(np.einsum("hvk,hk->hv", S, q[t]))
    return np.stack(ys), S


def test_recurrence_matches_float64_reference():
    q, k, v, g, beta = _inputs(0)
    S0 = np.zeros((3, 32, 32), np.float32)
    y, S = ops.kda_recurrence(S0, q, k, v, g, beta)
    y_ref, S_ref = _naive(q, k, v, g, beta)
    assert y.dtype == bf16(0).dtype
    assert np.max(np.abs(y.astype(np.float64) - y_ref)) <= TOL * np.max(np.abs(y_ref)) + 1e-2   # y is bf16-rounded
    assert np.max(np.abs(S - S_ref)) <= TOL * np.max(np.abs(S_ref))


@pytest.mark.parametrize("split", [1, 7, 20, 39])
def test_state_is_bit_identical_however_the_tokens_are_split(split):
    q, k, v, g, beta = _inputs(1)
    S0 = np.zeros((3, 32, 32), np.float32)
    y_all, S_all = ops.kda_recurrence(S0, q, k, v, g, beta)
    y1, S1 = ops.kda_recurrence(S0, q[:split], k[:split], v[:split], g[:split], beta[:split])
    y2, S2 = ops.kda_recurrence(S1, q[split:], k[split:], v[split:], g[split:], beta[split:])
    assert np.array_equal(S_all, S2)
    assert np.array_equal(y_all, np.concatenate([y1, y2]))
    S = S0
    for t in range(q.shape[0]):
        _, S = ops.kda_recurrence(S, q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1])
    assert np.array_equal(S_all, S)


def test_conv_window_carries_across_calls():
    rng = np.random.default_rng(3)
    x = bf16(rng.standard_normal((10, 8)).astype(np.float32))        # [n, C] bf16
    w = bf16(rng.standard_normal((8, 4)).astype(np.float32))
    win = ops.bf16_full((3, 8), 0.0)
    y_all, win_all = ops.kda_conv(x, win, w)
    y1, w1 = ops.kda_conv(x[:4], win, w)
    y2, w2 = ops.kda_conv(x[4:], w1, w)
    assert np.array_equal(y_all, np.concatenate([y1, y2])) and np.array_equal(win_all, w2)
    full = np.concatenate([win, x]).astype(np.float64)
    ref = np.stack([(full[t:t + 4] * w.T).sum(0) for t in range(10)])
    ref = ref / (1 + np.exp(-ref))
    assert np.allclose(y_all, ref, rtol=1e-2, atol=1e-2)
