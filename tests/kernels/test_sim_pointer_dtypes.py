"""The emulator checks a pointer argument's element dtype against the kernel's parameter type, as the GPU
would read the bytes: `__nv_bfloat16*` takes ml_dtypes.bfloat16 (the sim storage) or uint16 bit patterns (the
cuda storage), `float*` float32, `int*` int32; anything else is refused naming the parameter."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cupyglm.kernels import CUDA_SRC, load_module
from cupyglm.kernels.sim_args import pointer_dtypes

BF16 = np.dtype(ml_dtypes.bfloat16)
i32 = np.int32


@pytest.fixture(scope="module")
def st():
    return load_module("sim", CUDA_SRC / "selftest.cu")


def test_bf16_pointer_takes_bfloat16_or_its_uint16_bits_with_the_same_result(st):
    n = 64
    a = (np.arange(n, dtype=np.float32) * 0.25 - 3).astype(BF16)
    b = (np.arange(n, dtype=np.float32) * -0.5 + 1).astype(BF16)
    out_bf, out_bits = np.zeros((4, n), BF16), np.zeros((4, n), np.uint16)
    fn = st.get_function("bf16_arith")
    fn(1, 64, (a, b, out_bf, i32(n)))
    fn(1, 64, (a.view(np.uint16), b.view(np.uint16), out_bits, i32(n)))
    assert np.array_equal(out_bf.view(np.uint16), out_bits)
    assert out_bf[0].astype(np.float32).tolist() == (a.astype(np.float32) + b.astype(np.float32)).tolist()


@pytest.mark.parametrize("bad", [np.float32, np.float16, np.int16])
def test_bf16_pointer_refuses_other_dtypes_by_name(st, bad):
    n = 8
    a = np.zeros(n, BF16)
    with pytest.raises(ValueError, match=r"parameter 0 'a' \(const __nv_bfloat16\*\) expects a bfloat16 or uint16 "
                                         rf"array, got {np.dtype(bad).name}"):
        st.get_function("bf16_arith")(1, 32, (np.zeros(n, bad), a, np.zeros((4, n), BF16), i32(n)))


def test_float_and_ushort_pointers_are_checked_too(st):
    x = np.zeros(8, np.float64)
    with pytest.raises(ValueError, match=r"'in' \(const float\*\) expects a float32 array, got float64"):
        st.get_function("bf16_convert")(1, 32, (x, np.zeros(8, np.uint16), np.zeros(8, np.float32), i32(8)))
    with pytest.raises(ValueError, match=r"'rn_bits' \(unsigned short\*\) expects a uint16 array, got bfloat16"):
        st.get_function("bf16_convert")(1, 32, (x.astype(np.float32), np.zeros(8, BF16), np.zeros(8, np.float32),
                                                i32(8)))


def test_pointer_dtype_table():
    assert pointer_dtypes("const __nv_bfloat16*") == ("bfloat16", "uint16")
    assert pointer_dtypes("__nv_bfloat16*") == ("bfloat16", "uint16")
    assert pointer_dtypes("const int*") == ("int32",)
    assert pointer_dtypes("unsigned long long*") == ("uint64",)
    assert pointer_dtypes("struct*") is None and pointer_dtypes("const void*") is None
