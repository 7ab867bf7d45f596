"""pytest fixtures of the CuPy double; a test module imports the ones it uses:

    from cupy_double.fixtures import cuda_double, cuda_double_module   # noqa: F401

`cuda_ops` (a module's CudaOps over the double) and `graph_runner` (a ModelRunner with or without CUDA graphs) serve
the graph-capture tests.
"""
from __future__ import annotations

import pytest

import cupy_double


@pytest.fixture
def cuda_double():
    """The double installed for one test (unlimited memory); yields the cupy_double package."""
    with cupy_double.installed():
        yield cupy_double


@pytest.fixture(scope="module")
def cuda_double_module():
    """The double installed for a whole test module (its models are built once)."""
    with cupy_double.installed():
        yield cupy_double


@pytest.fixture(scope="module")
def cuda_ops(cuda_double_module):
    """The cuda backend's ops over the module's double."""
    from cupyglm.backend.cuda_ops import CudaOps

    return CudaOps()


def graph_runner(ckpt, ops, graphs: bool):
    """A one-rank ModelRunner (64 pages of 16 tokens, poisoned pages) replaying decode calls as graphs or eager."""
    from cupyglm.distributed.comm import LocalComm
    from cupyglm.engine.runner import ModelRunner

    return ModelRunner(ckpt, ops, LocalComm(), 64, 16, poison=True, graphs=graphs)
