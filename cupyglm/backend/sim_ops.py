"""The `sim` backend: NumPy arrays, and every op that has a kernel runs the very cuda_src/*.cu kernel on the CPU
emulator (cupyglm.kernels.sim). Ops without a kernel yet run the NumPy reference.

The emulator's thread order comes from CUPYGLM_SIM_ORDER (forward | reverse | shuffled).
"""
from __future__ import annotations

import numpy as np

from cupyglm import env
from cupyglm.backend._dispatch import bind_kernel_ops
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.kernels.ops import Kernels


def _host(a):
    """Kernels take C-contiguous arrays; views the model passes (transposes) are copied."""
    if isinstance(a, np.ndarray) and not a.flags.c_contiguous:
        return np.ascontiguousarray(a)
    return a


class SimOps(NumpyOps):
    name = "sim"
    xp = np

    def __init__(self, order: str | None = None):
        self.kernels = Kernels("sim", np, order=order if order is not None else env.get("CUPYGLM_SIM_ORDER"))
        self.kernel_ops = bind_kernel_ops(self, self.kernels, _host)
