"""The launchers' id and position guards on device arrays (cuda through the CuPy double): checked on the
device by cuda_src/checks.cu without a host sync, reported by name when the step's flags are read once."""
from __future__ import annotations

import numpy as np
import pytest

from cupy_double.fixtures import cuda_double  # noqa: F401
from cupyglm.kernels.guards import DeviceCheckError

ONE = 0x3F80                                            # 1.0 as bf16 bits


@pytest.fixture
def ops(cuda_double):
    from cupyglm.backend.cuda_ops import CudaOps

    return CudaOps()


def _no_sync(cuda_double, fn):
    with cuda_double.counting() as c:
        out = fn()
    assert c.syncs == 0, c
    return out


def test_write_rows_ids_out_of_range_and_repeated(ops, cuda_double):
    xp = ops.xp
    store = xp.zeros((16, 8), xp.uint16)                  # bf16 storage: uint16 bit patterns
    values = xp.full((4, 8), ONE, xp.uint16)
    _no_sync(cuda_double, lambda: ops.write_rows(store, xp.asarray(np.array([1, 2, 16, -1], np.int32)), values))
    with pytest.raises(DeviceCheckError, match=r"write_rows: parameter rows holds ids outside \[0, 16\) "
                                               r"\(2 of them, the first at index 2\)"):
        ops.raise_device_errors()
    ops.raise_device_errors()                                   # read and cleared: nothing pending now
    _no_sync(cuda_double, lambda: ops.write_rows(store, xp.asarray(np.array([3, 5, 3, 5], np.int32)), values))
    with pytest.raises(DeviceCheckError, match=r"write_rows: parameter rows repeats a row id .*\(2 of them, "
                                               r"the first at index 2\)"):
        ops.raise_device_errors()


def test_read_rows_and_gemm_grouped_ids(ops, cuda_double):
    xp = ops.xp
    _no_sync(cuda_double, lambda: ops.read_rows(xp.zeros((8, 4), xp.uint16), xp.asarray(np.array([9], np.int32))))
    x, w = xp.full((3, 16), ONE, xp.uint16), xp.full((2, 16, 16), ONE, xp.uint16)
    y = _no_sync(cuda_double, lambda: ops.gemm_grouped(x, w, xp.asarray(np.array([0, 2, 1], np.int32))))
    assert np.isnan(y.get()[1]).all() and not np.isnan(y.get()[[0, 2]]).any()      # the bad row: NaN, no fault
    with pytest.raises(DeviceCheckError) as e:
        ops.raise_device_errors()
    assert "read_rows: parameter rows holds ids outside [0, 8) (1 of them, the first at index 0)" in str(e.value)
    assert "gemm_tc_grouped: parameter group holds expert ids outside [0, 2) (1 of them, the first at index 1)" \
        in str(e.value)


def test_pick_positions(ops, cuda_double):
    xp = ops.xp
    scores = xp.zeros((2, 4), xp.float32)
    _no_sync(cuda_double, lambda: ops.pick(scores, xp.asarray(np.array([3, -2], np.int32)), 2, 4, 11))
    with pytest.raises(DeviceCheckError, match=r"pick: parameter positions holds a negative position "
                                               r"\(1 of them, the first at index 1\)"):
        ops.raise_device_errors()


def test_a_clean_step_reports_nothing(ops, cuda_double):
    xp = ops.xp
    store = xp.zeros((16, 8), xp.uint16)
    ops.write_rows(store, xp.asarray(np.array([4, 0, 15], np.int32)), xp.full((3, 8), ONE, xp.uint16))
    with cuda_double.counting() as c:
        ops.raise_device_errors()
    assert c.syncs == 1                                          # the flags, read once
    assert store.get()[[0, 4, 15]].tolist() == [[ONE] * 8] * 3


def test_the_flags_come_back_with_the_steps_result_in_one_transfer(ops, cuda_double):
    xp = ops.xp
    store = xp.zeros((16, 8), xp.uint16)
    ops.write_rows(store, xp.asarray(np.array([4, 0], np.int32)), xp.full((2, 8), ONE, xp.uint16))
    tokens = xp.asarray(np.array([7, -3, 11], np.int32))
    with cuda_double.counting() as c:
        host = ops.asnumpy_checked(tokens)
    assert c.syncs == 1 and host.dtype == np.int32 and host.tolist() == [7, -3, 11]
    ops.write_rows(store, xp.asarray(np.array([3, 99], np.int32)), xp.full((2, 8), ONE, xp.uint16))
    with cuda_double.counting() as c:
        with pytest.raises(DeviceCheckError, match=r"write_rows: parameter rows"):
            ops.asnumpy_checked(tokens)                          # raised before anyone reads the tokens
    assert c.syncs == 1
    ops.raise_device_errors()                                    # read and cleared: nothing pending now


def test_decode_rows_grouped_gemv_flags_bad_ids_itself(ops, cuda_double):
    """Decode rows: the grouped gemv kernels count an expert id outside [0, E) into the step's flags themselves,
    with the message and first index of the check launch they replace, and no check_ids_range runs."""
    xp = ops.xp
    x, w = xp.full((4, 16), ONE, xp.uint16), xp.full((2, 16, 16), ONE, xp.uint16)
    group = xp.asarray(np.array([0, 1, 5, 5], np.int32))
    with cuda_double.counting(trace=True) as c:
        y = ops.gemm_grouped(x, w, group, decode=4)
        a = ops.gemm_grouped_swiglu(x, w, w, group, 10.0, decode=4)
    assert c.syncs == 0, c
    launched = c.where.get("launches", {})
    assert not any("check_ids_range" in str(key) for key in launched), launched
    assert np.isnan(y.get()[2:]).all() and not np.isnan(y.get()[:2]).any()
    assert a.shape == (4, 16)
    with pytest.raises(DeviceCheckError) as e:
        ops.raise_device_errors()
    assert "gemm_grouped: parameter group holds expert ids outside [0, 2) (2 of them, the first at index 2)" \
        in str(e.value)
    assert "gemm_grouped_swiglu: parameter group holds expert ids outside [0, 2) (2 of them, the first at index 2)" \
        in str(e.value)
    ops.raise_device_errors()                                   # read and cleared


def test_kv_rows_and_pick_check_their_ids_themselves(ops, cuda_double):
    """write_rows, read_rows and pick count bad ids / positions into the step's flags in the kernel itself: the
    bad row is skipped (write), NaN (read) or kept inside its list (pick), the messages are those of the check
    launches they replace, and no check_ids_range or check_pick_rows runs."""
    xp = ops.xp
    store = xp.zeros((16, 8), xp.uint16)
    with cuda_double.counting(trace=True) as c:
        ops.write_rows(store, xp.asarray(np.array([3, 16], np.int32)), xp.full((2, 8), ONE, xp.uint16))
        y = ops.read_rows(store, xp.asarray(np.array([-1, 3], np.int32)))
        tok, cnt = ops.pick(xp.zeros((2, 4), xp.float32), xp.asarray(np.array([3, 12], np.int32)), 2, 4, 8)
    assert c.syncs == 0, c
    launched = " ".join(str(key) for key in c.where.get("launches", {}))
    assert "check_ids_range" not in launched and "check_pick_rows" not in launched, launched
    assert "kv_write_rows" in launched and "kv_read_rows" in launched and "dsa_pick" in launched, launched
    assert store.get()[3].tolist() == [ONE] * 8 and not store.get()[[0, 1, 2, 15]].any()
    bits = y.get().view(np.uint16)
    assert ((bits[0] & 0x7F80) == 0x7F80).all() and (bits[0] & 0x7F).all()      # the bad id's row: NaN
    assert bits[1].tolist() == [ONE] * 8
    with pytest.raises(DeviceCheckError) as e:
        ops.raise_device_errors()
    assert "write_rows: parameter rows holds ids outside [0, 16) (1 of them, the first at index 1)" in str(e.value)
    assert "read_rows: parameter rows holds ids outside [0, 16) (1 of them, the first at index 0)" in str(e.value)
    assert "pick: parameter width is too small for a row's position (1 of them, the first at index 1)" \
        in str(e.value)
    assert cnt.get()[0] == 4 and tok.get()[0].tolist() == [0, 1, 2, 3, -1, -1, -1, -1]
    ops.raise_device_errors()                                   # read and cleared
