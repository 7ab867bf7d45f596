"""Fixtures for the mpi tier: see helpers.py."""
from .helpers import launch, mpirun  # noqa: F401
