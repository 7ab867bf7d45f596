"""Stream capture in the CuPy double (tests/cupy_double/capture.py): recorded, not run; replayed against the
current contents of the same allocations; what a capturing stream refuses, refused."""
from __future__ import annotations

import numpy as np
import pytest

import cupy_double
from cupy_double.fixtures import cuda_double  # noqa: F401


@pytest.fixture
def cp(cuda_double):
    import cupy

    return cupy


def _capture(cp, body, mode=None):
    s, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with s, cp.cuda.using_allocator(pool.malloc):
        s.begin_capture(mode)
        try:
            out = body()
        finally:
            g = s.end_capture()
    return g, out


def _kernels(cp):
    from cupyglm.kernels.ops import Kernels

    return Kernels("cuda", cp)


def test_kernels_are_recorded_not_run_and_replay_reads_current_contents(cp):
    from cupyglm.kernels import guards

    k = _kernels(cp)
    ids = cp.asarray(np.array([0, 5, 9], np.int32))
    flags = cp.zeros((4, 2), dtype=cp.uint32)
    with cupy_double.counting() as c:
        g, _ = _capture(cp, lambda: guards.launch_range(k, ids, flags, 8, 1))
    assert c.launches == 0 and c.captured == 1
    assert int(flags[1, 0]) == 0                         # not run during capture
    with cupy_double.counting() as c:
        g.launch()
    assert int(flags[1, 0]) == 1 and c.graph_launches == 1 and c.graph_kernels == 1 and c.launches == 0
    ids[...] = 20                                        # updated in place: the replay sees the new ids
    g.launch()
    assert int(flags[1, 0]) == 1 + 3


def test_cupy_ops_are_recorded_and_their_results_poisoned_until_launch(cp):
    x = cp.arange(4, dtype=cp.float32)
    y = cp.ones(4, dtype=cp.float32)

    def body():
        z = x * np.float32(2) + y
        y[...] = z[::-1]                                 # an in-place write: recorded, not run
        return z, z.reshape(2, 2)
    g, (z, zv) = _capture(cp, body)
    assert np.isnan(z.get()).all() and np.array_equal(y.get(), np.ones(4))
    g.launch()
    assert np.array_equal(z.get(), [1, 3, 5, 7]) and np.array_equal(zv.get(), [[1, 3], [5, 7]])
    assert np.array_equal(y.get(), [7, 5, 3, 1])
    x[...] = 10
    g.launch()
    assert np.array_equal(z.get(), [27, 25, 23, 21]) and np.array_equal(y.get(), [21, 23, 25, 27])
    assert g.sizes["graph_ops"] == 3                     # multiply, add, the setitem: 3 CuPy kernels


@pytest.mark.parametrize("what, body", [
    ("device-to-host read", lambda cp, x: int(x[0])),
    ("device-to-host read", lambda cp, x: x.get()),
    ("device-to-host read", lambda cp, x: cp.asnumpy(x)),
    ("host-to-device", lambda cp, x: cp.asarray(np.ones(3, np.float32))),
    ("host-to-device", lambda cp, x: x.set(np.ones(4, np.float32))),
    ("host index array", lambda cp, x: x[np.array([0, 1])]),
    ("Stream.synchronize", lambda cp, x: cp.cuda.get_current_stream().synchronize()),
    ("cudaDeviceSynchronize", lambda cp, x: cp.cuda.runtime.deviceSynchronize()),
    ("boolean mask", lambda cp, x: x[x > 1]),
    ("nonzero", lambda cp, x: cp.nonzero(x)),
])
def test_refused_during_capture_and_the_capture_is_invalidated(cp, what, body):
    x = cp.arange(4, dtype=cp.float32)
    s, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with s, cp.cuda.using_allocator(pool.malloc):
        s.begin_capture()
        with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match=what):
            body(cp, x)
        with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
            s.end_capture()
    assert not s.is_capturing()


def test_allocations_need_a_private_pool_and_relaxed_mode(cp):
    x = cp.arange(4, dtype=cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="private memory pool"):
            x + x
        with pytest.raises(cp.cuda.runtime.CUDARuntimeError):
            s.end_capture()
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="global / thread-local"):
        _capture(cp, lambda: x + x, mode=cp.cuda.runtime.streamCaptureModeGlobal)
    g, y = _capture(cp, lambda: x + x, mode=cp.cuda.runtime.streamCaptureModeRelaxed)
    g.launch()
    assert np.array_equal(y.get(), [0, 2, 4, 6])


def test_work_off_the_capturing_stream_is_refused(cp):
    x = cp.arange(4, dtype=cp.float32)
    s, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="legacy null stream"):
        cp.cuda.Stream.null.begin_capture()
    s.begin_capture()                                    # not entered: the work goes to the null stream
    with cp.cuda.using_allocator(pool.malloc), pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="while stream"):
        x.fill(1)
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError):
        s.end_capture()


def test_a_launch_after_a_captured_allocation_was_freed_raises(cp):
    x = cp.arange(4, dtype=cp.float32)
    g, y = _capture(cp, lambda: x * np.float32(3))
    g.launch()
    del x
    import gc

    gc.collect()
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="freed"):
        g.launch()


def test_a_shared_pool_reuses_freed_blocks_across_captures(cp):
    x = cp.arange(4, dtype=cp.float32)
    s, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    ptrs = []

    def capture(body):
        with s, cp.cuda.using_allocator(pool.malloc):
            s.begin_capture()
            out = body()
            return s.end_capture(), out

    def first():
        t = x + x                                        # a temporary: its block is free again after the capture
        ptrs.append(t.data.ptr)
        return t * np.float32(3)

    def second():
        u = x * x
        ptrs.append(u.data.ptr)
        return u + np.float32(1)
    g1, a = capture(first)
    g2, b = capture(second)
    assert ptrs[0] == ptrs[1]                            # the second graph's temporary is the first's block
    g1.launch()
    g2.launch()
    assert np.array_equal(a.get(), [0, 6, 12, 18]) and np.array_equal(b.get(), [1, 2, 5, 10])
    assert pool.total_bytes() == 3 * 16
