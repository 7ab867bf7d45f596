"""pytest fixtures of the CuPy double; a test module imports the ones it uses:

    from cupy_double.fixtures import cuda_double, cuda_double_module   # noqa: F401
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
