"""The CuPy double's own rules (tests/cupy_double): what CuPy refuses, it refuses; what it counts is right."""
from __future__ import annotations

import numpy as np
import pytest

from cupy_double.fixtures import cuda_double  # noqa: F401


@pytest.fixture
def cp(cuda_double):
    import cupy

    return cupy


def test_no_implicit_numpy_conversion(cp):
    x = cp.arange(6, dtype=cp.float32).reshape(2, 3)
    h = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(x)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.ascontiguousarray(x)
    with pytest.raises(TypeError, match="Unsupported type"):
        x + h
    with pytest.raises(TypeError, match="Unsupported type"):
        h * x
    with pytest.raises(TypeError, match="Unsupported type"):
        np.add(x, h)
    with pytest.raises(TypeError, match="Unsupported type"):
        cp.concatenate([x, h])
    with pytest.raises(TypeError, match="incorrect type"):
        cp.ascontiguousarray(h)
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        x[...] = h
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        x[0] = h[0]


def test_allowed_conversions(cp):
    h = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = cp.asarray(h)                                      # an explicit upload
    x[0, 0] = np.float32(7)                                # numpy scalars are scalars
    x[1] = np.array(2.0)                                   # a 0-d numpy array is a scalar for fill
    x[cp.asarray(np.array([0])), 1] = np.array([9.0], np.float32)   # advanced index: uploaded, as CuPy does
    y = np.add(x, x) * 2 + 1.5                             # numpy ufuncs dispatch to the double
    assert isinstance(y, cp.ndarray)
    assert cp.asnumpy(y).tolist() == [[29.5, 37.5, 9.5], [9.5, 9.5, 9.5]]
    u = cp.asarray(h).view(cp.uint32)                      # views keep the allocation
    assert u.dtype == np.uint32 and np.array_equal(u.get(), h.view(np.uint32))
    b = cp.zeros((4,), cp.uint16)
    b.view(cp.uint8)[:2] = 0xFF
    assert b.get().tolist() == [0xFFFF, 0, 0, 0]


def test_syncs_and_copies_are_counted(cp):
    import cupy_double

    h = np.arange(8, dtype=np.int32)
    with cupy_double.counting() as c:
        x = cp.asarray(h)
        s = x.sum()
        int(s), float(s), bool(s), s.item(), x.get(), cp.asnumpy(x), x.tolist()
        x[cp.asarray(np.array([1, 2], np.int32))] = 0
    assert c.syncs == 7 and c.h2d == 2 and c.h2d_bytes == h.nbytes + 2 * h.itemsize
    assert c.kernels >= 2 and c.launches == 0


def test_fresh_allocations_are_poisoned(cp):
    assert np.isnan(cp.empty((3,), cp.float32).get()).all()
    assert (cp.empty((3,), cp.int32).get() == -1).all()
    assert (cp.empty_like(cp.zeros((2,), cp.uint16)).get() == 0xFFFF).all()     # bf16 NaN bits


def test_memory_budget(cp):
    import cupy_double

    cupy_double.set_budget(cupy_double.in_use() + 1024)
    keep = cp.empty((256,), cp.float32)                    # exactly the budget
    with pytest.raises(cp.cuda.memory.OutOfMemoryError, match="Out of memory allocating 4 bytes"):
        cp.empty((1,), cp.float32)
    free, total = cp.cuda.runtime.memGetInfo()
    assert free == 0 and total == cupy_double.in_use()
    del keep
    cp.empty((256,), cp.float32)                           # freed memory is available again


def test_bf16_is_not_a_cupy_dtype(cp):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with pytest.raises(TypeError, match="Unsupported dtype"):
        cp.asarray(np.zeros(2, ml_dtypes.bfloat16))


def test_visible_devices(cp, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert cp.cuda.runtime.getDeviceCount() == 1
    cp.cuda.Device(0).use()
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="invalid device ordinal"):
        cp.cuda.Device(1).use()
