"""The errors a `sim` launch raises (SimError and SimCompileError, raised while building, live in sim_build)."""

from __future__ import annotations

from .sim_build import SimError


class SimDeadlock(SimError):
    """Threads of a block wait at barriers / warp operations that can never complete."""


class SimKernelError(SimError):
    """The kernel misused a CUDA primitive in a way the emulator detects."""


class SimLaunchError(SimError):
    """The launch configuration is invalid (block too large, too much shared memory, ...)."""


class SimCrash(SimError):
    """The kernel crashed the worker process (segfault, abort, trap...)."""

    def __init__(self, message: str, kernel: str = "", signal_name: str = ""):
        super().__init__(message)
        self.kernel = kernel
        self.signal_name = signal_name


class SimTimeout(SimCrash):
    """The launch did not finish within the timeout; the worker was killed."""
