"""The `cupy` namespace of the double (installed as sys.modules["cupy"]).

Explicit transfers are the only way host data gets in or out: asarray / array (counted h2d), asnumpy (a
counted sync). Every other function is numpy's, run on the unwrapped arrays, refusing a numpy array operand
as CuPy does ("Unsupported type"); a result that is a new array counts as one CuPy kernel.
"""
from __future__ import annotations

import numpy as np

from . import array as _arr
from . import capture
from .array import ndarray, alloc, check_dtype, unwrap, buffers_of
from .capture import compute
from .state import STATE

__version__ = "14.0.0-double"

# dtypes and constants are numpy's, as in CuPy
for _n in ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
           "float32", "float64", "complex64", "complex128", "intp", "dtype", "iinfo", "finfo", "inf", "nan",
           "pi", "newaxis", "result_type", "can_cast", "promote_types"):
    globals()[_n] = getattr(np, _n)


def _host_upload(a, dtype, what: str) -> ndarray:
    capture.refuse(f"cupy.{what} of host data (a pageable host-to-device copy)")
    h = np.array(a, dtype=dtype, order="C", copy=True)
    if h.dtype == object:
        raise TypeError(f"Unsupported type {type(a)}")
    STATE.count("h2d", what=what)
    STATE.count("h2d_bytes", h.nbytes)
    return ndarray._own(h)


def asarray(a, dtype=None, order=None, blocking=False):
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    return _host_upload(a, dtype, "asarray")


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, blocking=False):
    if isinstance(obj, ndarray):
        return obj.astype(dtype or obj.dtype, copy=copy)
    return _host_upload(obj, dtype, "array")


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    if isinstance(a, ndarray):
        return a.get(order=order)
    return np.asarray(a, order=order)


def ascontiguousarray(a, dtype=None):
    if not isinstance(a, ndarray):
        raise TypeError("Argument 'a' has incorrect type (expected cupy._core.core._ndarray_base, "
                        f"got {type(a).__name__})")
    if a.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    dt = None if dtype is None else check_dtype(dtype)
    return compute(lambda: np.ascontiguousarray(a._a, dtype=dt), (), "ascontiguousarray", [a])


def get_array_module(*args):
    import sys

    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


def empty(shape, dtype=float, order="C"):
    return alloc(shape, dtype)


def empty_like(a, dtype=None, order="K", subok=None, shape=None):
    return alloc(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


def zeros(shape, dtype=float, order="C"):
    out = alloc(shape, dtype)
    a = out._a
    capture.kernel("zeros", lambda: a.fill(0), [out._buf])          # a memset
    return out


def zeros_like(a, dtype=None, order="K", subok=None, shape=None):
    return zeros(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


def ones(shape, dtype=float, order="C"):
    out = alloc(shape, dtype, poison=False)
    out.fill(1)
    return out


def full(shape, fill_value, dtype=None, order="C"):
    if isinstance(fill_value, np.ndarray):
        _arr.refuse_host(fill_value, "fill_value")
    dt = np.result_type(fill_value) if dtype is None else dtype
    out = alloc(shape, dt, poison=False)
    out.fill(fill_value)
    return out


def _numpy_function(name: str):
    fn = getattr(np, name)

    def call(*args, **kwargs):
        a = unwrap(list(args))
        kw = {}
        for k, v in kwargs.items():
            if k == "out":
                if not isinstance(v, ndarray):
                    raise TypeError(f"Unsupported type {type(v)} (out)")
                kw[k] = v._a
            else:
                kw[k] = unwrap(v)
        if "out" in kwargs:
            capture.kernel(name, lambda: fn(*a, **kw), buffers_of(list(args) + list(kwargs.values())))
            return kwargs["out"]
        if name in _DATA_SHAPED or (name == "where" and len(args) + len(kwargs) == 1):
            capture.refuse(f"cupy.{name} (its result's shape is read back)")
        return compute(lambda: fn(*a, **kw), buffers_of(args) if name in _VIEWS else (), name,
                       list(args) + list(kwargs.values()))
    call.__name__ = name
    return call


# numpy functions whose result's shape depends on the data (CuPy reads a count back)
_DATA_SHAPED = frozenset({"nonzero", "flatnonzero", "argwhere", "unique", "compress", "extract"})
# numpy functions that return views of their argument (no kernel)
_VIEWS = frozenset({"reshape", "transpose", "swapaxes", "moveaxis", "squeeze", "expand_dims", "broadcast_to",
                    "ravel", "atleast_1d", "atleast_2d", "diagonal"})


def __getattr__(name: str):
    if name.startswith("_") or not hasattr(np, name):
        raise AttributeError(f"module 'cupy' (double) has no attribute {name!r}")
    obj = getattr(np, name)
    if isinstance(obj, np.ufunc) or callable(obj):
        f = _numpy_function(name)
        globals()[name] = f
        return f
    return obj


from .raw import RawKernel, RawModule  # noqa: E402
from . import cuda  # noqa: E402
