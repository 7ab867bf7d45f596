"""The `cuda` backend: CuPy arrays on the device, every op a cuda_src/*.cu kernel through cupy.RawModule.

An op of the interface that has no kernel yet raises NotImplementedError naming it: nothing compute runs on
the host behind the user's back. `import cupy` happens when a CudaOps is made, not when this module is
imported.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend._dispatch import bind_kernel_ops, numpy_op_names
from cupyglm.backend.lanes import BF16, BF16_BITS, from_bits, stored_weight, to_bits
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.kernels import ops as kops
from cupyglm.kernels.ops import Kernels


class CudaOps(NumpyOps):
    name = "cuda"
    bf16_dtype = BF16_BITS     # cupy has no bf16 dtype: uint16 arrays of bf16 bit patterns

    def __init__(self):
        import cupy

        self.cupy = cupy
        self.xp = cupy
        self.kernels = Kernels("cuda", cupy)

        def device(a):
            if isinstance(a, np.ndarray):
                return cupy.asarray(np.ascontiguousarray(a))
            if isinstance(a, cupy.ndarray) and not a.flags.c_contiguous:
                return cupy.ascontiguousarray(a)
            return a

        self.kernel_ops = bind_kernel_ops(self, self.kernels, device)
        for name in numpy_op_names():
            if name not in kops.OPS and name not in kops.KERNEL_FREE:
                setattr(self, name, _missing(name))

    def weight(self, array):
        """A checkpoint tensor on the device in bf16 storage: its bf16 bit patterns copied once, as uint16 (a
        float array must hold bf16 values exactly, as on numpy)."""
        a = stored_weight(array)
        return self.cupy.asarray(a if a.dtype == np.float32 else to_bits(a))

    def bf16_full(self, shape, value: float):
        """A new device bf16 array (uint16 bit patterns) filled with bf16(value)."""
        bits = int(to_bits(np.array([value], dtype=np.float32).astype(BF16))[0])
        return self.cupy.full(shape, bits, dtype=self.cupy.uint16)

    def asnumpy(self, x) -> np.ndarray:
        """A device array on the host; bf16 storage (uint16 bit patterns) comes back as ml_dtypes.bfloat16."""
        h = self.cupy.asnumpy(x)
        return from_bits(h) if h.dtype == BF16_BITS else h

    def raise_device_errors(self) -> None:
        """guards.DeviceCheckError naming every device-side precondition (cuda_src/checks.cu) that failed."""
        from cupyglm.kernels import guards
        guards.raise_pending(self.kernels)

    def asnumpy_checked(self, x) -> np.ndarray:
        """x on the host, the device checks' flags in the same transfer (raises guards.DeviceCheckError)."""
        from cupyglm.kernels import guards
        h = guards.fetch_checked(self.kernels, x)
        return from_bits(h) if h.dtype == BF16_BITS else h


def _missing(name: str):
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"cuda backend: op {name!r} has no kernel in cuda_src/ yet; "
                                  "refusing to run it on the host (use --backend numpy or sim)")
    refuse.__name__ = name
    return refuse
