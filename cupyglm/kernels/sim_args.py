"""Checking a `sim` launch's grid, block and arguments the way the GPU would take them, refusing what cupy would
pass silently differently (Python ints/floats, non-contiguous arrays, a scalar of the wrong width)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .sim_errors import SimLaunchError

_SCALAR_DTYPES: dict[str, np.dtype] = {
    "int": np.dtype(np.int32),
    "unsigned int": np.dtype(np.uint32),
    "long long": np.dtype(np.int64),
    "long": np.dtype(np.int64),
    "unsigned long long": np.dtype(np.uint64),
    "unsigned long": np.dtype(np.uint64),
    "short": np.dtype(np.int16),
    "unsigned short": np.dtype(np.uint16),
    "char": np.dtype(np.int8),
    "signed char": np.dtype(np.int8),
    "unsigned char": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
}


def _bf16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


# The element dtypes a numpy array may have for a `T*` parameter, by T. A bf16 buffer is an
# ml_dtypes.bfloat16 array (the sim storage) or uint16 bit patterns (the cuda storage, on the host); a char
# buffer is any one-byte type. Pointee types not listed (structs, vector types, void) are not checked.
_POINTER_DTYPES: dict[str, tuple[str, ...]] = {
    "float": ("float32",), "double": ("float64",), "__nv_bfloat16": ("bfloat16", "uint16"),
    "int": ("int32",), "unsigned int": ("uint32",), "long long": ("int64",), "long": ("int64",),
    "unsigned long long": ("uint64",), "unsigned long": ("uint64",), "short": ("int16",),
    "unsigned short": ("uint16",), "bool": ("bool",),
    "char": ("int8", "uint8", "bool"), "signed char": ("int8", "uint8", "bool"),
    "unsigned char": ("uint8", "int8", "bool"),
}


def pointer_dtypes(ctype: str) -> tuple[str, ...] | None:
    """The dtype names a `T*` / `const T*` parameter accepts, or None when T is not checked."""
    base = ctype[:-1].strip()
    if base.startswith("const "):
        base = base[len("const "):]
    return _POINTER_DTYPES.get(base)


def _scalar_dtype(ctype: str) -> np.dtype:
    if ctype == "__nv_bfloat16":
        return _bf16()
    try:
        return _SCALAR_DTYPES[ctype]
    except KeyError:
        raise SimLaunchError(f"kernel parameter type {ctype!r} cannot be passed by value to the emulator") from None


def _describe(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return f"numpy.ndarray (dtype {a.dtype}, shape {a.shape})"
    if isinstance(a, np.generic):
        return f"np.{a.dtype.name}"
    mod = type(a).__module__
    return type(a).__name__ if mod == "builtins" else f"{mod}.{type(a).__name__}"


def dim3(v: Any, what: str) -> tuple[int, int, int]:
    """A grid or block: an int or a tuple of 1-3 ints, padded with 1s."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        t = (int(v),)
    elif isinstance(v, (tuple, list)) and 1 <= len(v) <= 3 and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v
    ):
        t = tuple(int(x) for x in v)
    else:
        raise ValueError(f"{what} must be an int or a tuple of 1-3 ints, got {v!r}")
    t = t + (1,) * (3 - len(t))
    if any(x < 1 or x > 0xFFFFFFFF for x in t):
        raise ValueError(f"{what} dimensions must be >= 1, got {v!r}")
    return t  # type: ignore[return-value]


def check_args(kernel: str, param_names: Sequence[str], args: Sequence[Any], sig: list[str]) -> None:
    """Pointers must be C-contiguous numpy arrays, scalars numpy scalars of exactly the parameter's dtype."""
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"kernel {kernel}: args must be a tuple, got {_describe(args)}")
    names = param_names if len(param_names) == len(sig) else tuple(f"arg{i}" for i in range(len(sig)))
    if len(args) != len(sig):
        params = ", ".join(f"{t} {n}" for t, n in zip(sig, names))
        raise ValueError(f"kernel {kernel} takes {len(sig)} arguments ({params}), got {len(args)}")
    for i, (ctype, a) in enumerate(zip(sig, args)):
        where = f"kernel {kernel} parameter {i} '{names[i]}'"
        if ctype.endswith("*"):
            if not isinstance(a, np.ndarray):
                raise ValueError(f"{where} expects a pointer ({ctype}): a C-contiguous numpy array, got {_describe(a)}")
            if not a.flags.c_contiguous:
                raise ValueError(f"{where} ({ctype}): the numpy array must be C-contiguous (use np.ascontiguousarray)")
            allowed = pointer_dtypes(ctype)
            if allowed is not None and a.dtype.name not in allowed:
                raise ValueError(f"{where} ({ctype}) expects a {' or '.join(allowed)} array, got {a.dtype.name}")
        else:
            dt = _scalar_dtype(ctype)
            if not (isinstance(a, np.generic) and a.dtype == dt):
                raise ValueError(f"{where} expects {ctype} (np.{dt.name}), got {_describe(a)}")
