"""Shared by SimOps and CudaOps: bind every registered kernel op (cupyglm.kernels.ops.OPS) onto an ops object."""
from __future__ import annotations

import functools

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.kernels import ops as kops


def numpy_op_names() -> list[str]:
    """The public methods of the ops interface (NumpyOps)."""
    return sorted(n for n in dir(NumpyOps) if not n.startswith("_") and callable(getattr(NumpyOps, n)))


def bind_kernel_ops(obj, k: kops.Kernels, prepare) -> list[str]:
    """Set obj.<name> to the launcher of every registered op; `prepare(x)` adapts one positional array argument
    that the op does not write in place (contiguous, on the device); keyword options (out=) pass as they are.
    Returns the bound names."""
    kops.load_all()
    known = set(numpy_op_names())
    bound = []
    for name, launcher in sorted(kops.OPS.items()):
        if name not in known:
            raise ValueError(f"kernel op {name!r} is registered but NumpyOps has no method of that name")
        keep = set(kops.INPLACE.get(name, ()))

        def method(*args, _launcher=launcher, _keep=keep, _name=name, **options):
            args = tuple(a if i in _keep else prepare(a) for i, a in enumerate(args))
            return _launcher(k, *args, **options)

        functools.update_wrapper(method, getattr(NumpyOps, name))
        setattr(obj, name, method)
        bound.append(name)
    return bound
