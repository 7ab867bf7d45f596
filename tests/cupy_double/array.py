"""The double's ndarray: device memory stood for by a host numpy array, with CuPy's conversion rules.

CuPy's rules mirrored here (cupy/_core/core.pyx, _routines_indexing.pyx, _kernel.pyx):
* no implicit conversion to numpy: `__array__` raises TypeError, so np.asarray(x), np.ascontiguousarray(x),
  np.float32(x) and any numpy call that needs the data refuse; numpy ufuncs and functions on these arrays
  dispatch (`__array_ufunc__`, `__array_function__`) to the cupy namespace, which refuses a numpy array
  operand with "Unsupported type" (a numpy scalar or a Python number is a scalar and is fine);
* `x[basic index] = numpy_array` goes through ndarray.fill: ValueError for a non-scalar numpy array;
  `x[integer/bool array index] = numpy_array` and a host index array are uploaded (counted as h2d);
* cupy.ascontiguousarray(numpy_array) is a TypeError (the argument is typed cupy ndarray);
* explicit transfers: cupy.asarray / cupy.array / ndarray.set upload, .get() / cupy.asnumpy download.
Results of basic indexing, reshape, view, transpose share the allocation; everything else is a new one.
Every operation goes through `compute` (a result) or `capture.kernel` (a side effect), so stream capture
(capture.py) records it instead of running it.
"""
from __future__ import annotations

import numpy as np

from . import capture
from .capture import compute, _keys, _refuse_mask
from .state import STATE, Buffer, OutOfMemoryError

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy "
            "array explicitly.")
SUPPORTED_KINDS = "biufc"


def check_dtype(dt) -> np.dtype:
    dt = np.dtype(dt)
    if dt.kind not in SUPPORTED_KINDS:
        raise TypeError(f"Unsupported dtype {dt}")        # e.g. ml_dtypes.bfloat16: cupy has no such dtype
    return dt


def alloc(shape, dtype, poison: bool = True) -> "ndarray":
    """A fresh allocation; poisoned (every byte 0xFF: NaN in floats and bf16 bits, -1 in ints) like garbage."""
    dt = check_dtype(dtype)
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
    if capture.capturing():                      # from the capture's private pool (capture.py)
        a, buf = capture.capture_pool().array(shape, dt)
        return ndarray._view(a, buf)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if STATE.budget is not None and STATE.in_use + nbytes > STATE.budget:
        raise OutOfMemoryError(nbytes, STATE.in_use, STATE.budget)
    a = np.empty(shape, dt)
    if poison and a.size:
        a.reshape(-1).view(np.uint8).fill(0xFF)
    return ndarray._own(a)


def refuse_host(x, where: str = "") -> None:
    if isinstance(x, np.ndarray):
        raise TypeError(f"Unsupported type {type(x)}" + (f" ({where})" if where else ""))


def unwrap(x, allow_host: bool = False):
    """An operand as numpy: our arrays unwrapped; host arrays refused (unless an explicit upload)."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray) and not allow_host:
        refuse_host(x)
    if isinstance(x, (list, tuple)):
        return type(x)(unwrap(v, allow_host) for v in x)
    return x


def buffers_of(args) -> list:
    out = []
    for x in args:
        if isinstance(x, ndarray):
            out.append(x._buf)
        elif isinstance(x, (list, tuple)):
            out.extend(buffers_of(x))
        elif isinstance(x, dict):
            out.extend(buffers_of(list(x.values())))
    return out


def view_of(res, sources):
    """res with numpy scalars as 0-d arrays, or a view of the source allocation it shares when it shares one."""
    if isinstance(res, np.generic):
        res = np.asarray(res)
    if isinstance(res, np.ndarray):
        for b in sources:
            if np.may_share_memory(res, b.array):
                return ndarray._view(res, b)
    return res


def wrap(res, sources=(), what: str = "op"):
    """A numpy result as a double array: a view when it shares one of `sources`' allocations, else a new
    allocation made by one CuPy kernel."""
    if isinstance(res, tuple):
        return tuple(wrap(r, sources, what) for r in res)
    if isinstance(res, list):
        return [wrap(r, sources, what) for r in res]
    res = view_of(res, sources)
    if not isinstance(res, np.ndarray):
        return res
    STATE.count("kernels", what=what)
    return ndarray._own(np.ascontiguousarray(res) if res.ndim else res.copy())


def _is_advanced(key) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (ndarray, np.ndarray, list)) for k in keys)


def _index(key):
    """A key with host index arrays uploaded (as CuPy does) and our arrays unwrapped."""
    keys = key if isinstance(key, tuple) else (key,)
    out = []
    for k in keys:
        if isinstance(k, (np.ndarray, list)):
            capture.refuse("a host index array (a pageable host-to-device copy)")
            h = np.asarray(k)
            STATE.count("h2d", what="index")
            STATE.count("h2d_bytes", h.nbytes)
            out.append(h)
        elif isinstance(k, ndarray):
            out.append(k._a)
        else:
            out.append(k)
    return tuple(out)


def sync(x: "ndarray", what: str) -> np.ndarray:
    capture.refuse(f"a device-to-host read ({what})")
    STATE.count("syncs", what=what)
    STATE.count("d2h_bytes", x._a.nbytes)
    return x._a


class Flags:
    def __init__(self, a: np.ndarray, own: bool):
        self.c_contiguous = bool(a.flags.c_contiguous)
        self.f_contiguous = bool(a.flags.f_contiguous)
        self.owndata = own

    def __getitem__(self, name):
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous,
                "OWNDATA": self.owndata}[name]


class _Unowned:
    """The buffer of an ndarray over memory the double did not allocate (no device budget)."""

    __slots__ = ("array", "__weakref__")

    def __init__(self, array: np.ndarray):
        self.array = array


class MemoryPointer:
    def __init__(self, a: np.ndarray):
        self.ptr = int(a.__array_interface__["data"][0])

    def __int__(self):
        return self.ptr


class ndarray:
    """cupy.ndarray stand-in. `ndarray(shape, dtype)` allocates (uninitialised, i.e. poisoned)."""

    __slots__ = ("_a", "_buf")
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if strides is not None or order != "C":
            raise NotImplementedError("cupy double: ndarray(shape, dtype[, memptr]) only")
        if memptr is not None:                     # over mapped pinned host memory (cupy.cuda.MemoryPointer)
            from .copies import pinned_view

            dt = check_dtype(dtype)
            shape = (int(shape),) if np.isscalar(shape) else tuple(int(x) for x in shape)
            view = pinned_view(int(memptr.ptr), int(np.prod(shape, dtype=np.int64)) * dt.itemsize)
            self._a = view.view(dt).reshape(shape)
            self._buf = _Unowned(self._a)
            return
        made = alloc(shape, dtype)
        self._a, self._buf = made._a, made._buf

    @classmethod
    def _own(cls, a: np.ndarray) -> "ndarray":
        check_dtype(a.dtype)
        obj = cls.__new__(cls)
        obj._a, obj._buf = a, Buffer(a)
        return obj

    @classmethod
    def _view(cls, a: np.ndarray, buf) -> "ndarray":
        obj = cls.__new__(cls)
        obj._a, obj._buf = a, buf
        return obj

    # -- attributes --------------------------------------------------------------------------------------
    shape = property(lambda s: s._a.shape)
    dtype = property(lambda s: s._a.dtype)
    ndim = property(lambda s: s._a.ndim)
    size = property(lambda s: s._a.size)
    nbytes = property(lambda s: s._a.nbytes)
    itemsize = property(lambda s: s._a.itemsize)
    strides = property(lambda s: s._a.strides)
    flags = property(lambda s: Flags(s._a, s._a is s._buf.array))
    data = property(lambda s: MemoryPointer(s._a))
    T = property(lambda s: s.transpose())
    base = property(lambda s: None if s._a is s._buf.array else ndarray._view(s._buf.array, s._buf))

    # -- conversions (refused, or counted syncs) ----------------------------------------------------------
    def __array__(self, *args, **kwargs):
        raise TypeError(IMPLICIT)

    def get(self, stream=None, order="C", out=None, blocking=True):
        return np.array(sync(self, "get"), order=order)

    def set(self, arr, stream=None):
        if isinstance(arr, ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        capture.refuse("ndarray.set (a pageable host-to-device copy)")
        arr = np.asarray(arr)
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError(f"Shape/dtype mismatch: {arr.shape} {arr.dtype} vs {self.shape} {self.dtype}")
        STATE.count("h2d", what="set")
        STATE.count("h2d_bytes", arr.nbytes)
        self._a[...] = arr

    def item(self):
        return sync(self, "item").item()

    def tolist(self):
        return sync(self, "tolist").tolist()

    def __int__(self):
        return int(sync(self, "int"))

    def __float__(self):
        return float(sync(self, "float"))

    def __complex__(self):
        return complex(sync(self, "complex"))

    def __index__(self):
        if self.dtype.kind not in "iu" or self.size != 1:
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return int(sync(self, "index"))

    def __bool__(self):
        return bool(sync(self, "bool"))

    def __repr__(self):
        return f"array({sync(self, 'repr')!r})"

    __str__ = __repr__

    def __len__(self):
        if not self.ndim:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if not self.ndim:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    __hash__ = None

    # -- numpy protocols: dispatch to the cupy namespace -------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.pop("out", None)
        if out is not None:
            out = tuple(out) if isinstance(out, tuple) else (out,)
            for o in out:
                if not isinstance(o, ndarray):
                    raise TypeError(f"Unsupported type {type(o)} (out)")
            kwargs["out"] = tuple(o._a for o in out)
        args = [unwrap(x) for x in inputs]
        for x in inputs:
            if isinstance(x, (list, tuple)):
                raise TypeError(f"Unsupported type {type(x)}")
        fn = getattr(ufunc, method)
        if out is not None:
            capture.kernel(ufunc.__name__, lambda: fn(*args, **kwargs), buffers_of(list(inputs) + list(out)))
            return out[0] if len(out) == 1 else out
        return compute(lambda: fn(*args, **kwargs), (), ufunc.__name__, inputs)

    def __array_function__(self, func, types, args, kwargs):
        from . import xp

        fn = getattr(xp, func.__name__, None)
        if fn is None:
            return NotImplemented
        return fn(*args, **kwargs)

    # -- indexing ----------------------------------------------------------------------------------------
    def __getitem__(self, key):
        _refuse_mask(key)
        k = _index(key)
        if not _is_advanced(key) and Ellipsis not in k:
            k = k + (Ellipsis,)                  # a 0-d view, never a numpy scalar (CuPy returns arrays)
        a = self._a
        return compute(lambda: a[k], (self._buf,), "getitem", _keys(key))

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray) and not isinstance(value, np.generic):
            if not _is_advanced(key):
                if value.shape != ():
                    raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
                value = value.item()
            else:
                capture.refuse("a host value array (a pageable host-to-device copy)")
                STATE.count("h2d", what="setitem")
                STATE.count("h2d_bytes", value.nbytes)
        _refuse_mask(key)
        a, k, v = self._a, _index(key), unwrap(value, allow_host=True)

        def run():
            a[k] = v
        capture.kernel("setitem", run, [self._buf] + buffers_of(_keys(key) + [value]))

    # -- methods with CuPy's meaning ---------------------------------------------------------------------
    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        dt = check_dtype(dtype)
        if not copy and dt == self.dtype:
            return self
        a = self._a
        return compute(lambda: np.ascontiguousarray(a.astype(dt)), (), "astype", [self])

    def copy(self, order="C"):
        a = self._a
        return compute(lambda: np.array(a, order="C"), (), "copy", [self])

    def view(self, dtype=None):
        v = self._a.view() if dtype is None else self._a.view(check_dtype(dtype))
        return ndarray._view(v, self._buf)

    def fill(self, value):
        if isinstance(value, np.ndarray):
            if value.shape != ():
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            value = value.item()
        if isinstance(value, ndarray):
            value = value._a
        a = self._a
        capture.kernel("fill", lambda: a.fill(value), [self._buf])

    def reshape(self, *shape, order="C"):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        a = self._a
        return compute(lambda: a.reshape(shape, order=order), (self._buf,), "reshape", [self])

    def __getattr__(self, name):
        attr = getattr(np.ndarray, name, None)
        if attr is None or name.startswith("_") or not callable(attr):
            raise AttributeError(f"'cupy double ndarray' object has no attribute {name!r}")
        target = getattr(self._a, name)

        def method(*args, **kwargs):
            a, kw = unwrap(list(args)), {k: unwrap(v) for k, v in kwargs.items()}
            return compute(lambda: target(*a, **kw), (self._buf,), name, [self] + list(args) + list(kwargs.values()))
        return method


def _binary(uf, reflected=False, inplace=False):
    def op(self, other):
        if isinstance(other, (list, tuple)):
            raise TypeError(f"Unsupported type {type(other)}")
        if inplace:
            mine, o = self._a, unwrap(other)
            capture.kernel(uf.__name__, lambda: uf(mine, o, out=mine), buffers_of([self, other]))
            return self
        a, b = (unwrap(other), self._a) if reflected else (self._a, unwrap(other))
        return compute(lambda: uf(a, b), (), uf.__name__, [self, other])
    return op


for _name, _uf in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                   ("floordiv", np.floor_divide), ("mod", np.remainder), ("pow", np.power),
                   ("and", np.bitwise_and), ("or", np.bitwise_or), ("xor", np.bitwise_xor),
                   ("lshift", np.left_shift), ("rshift", np.right_shift), ("matmul", np.matmul)):
    setattr(ndarray, f"__{_name}__", _binary(_uf))
    setattr(ndarray, f"__r{_name}__", _binary(_uf, reflected=True))
    setattr(ndarray, f"__i{_name}__", _binary(_uf, inplace=True))
for _name, _uf in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal)):
    setattr(ndarray, f"__{_name}__", _binary(_uf))
for _name, _uf in (("neg", np.negative), ("pos", np.positive), ("abs", np.absolute), ("invert", np.invert)):
    setattr(ndarray, f"__{_name}__", lambda self, _uf=_uf: compute(lambda: _uf(self._a), (), _uf.__name__, [self]))
