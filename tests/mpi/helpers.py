"""Helpers for tests that launch real `mpirun` jobs (MPICH's Hydra from the venv's bin)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from procjob import MPIRUN, Job, job_env

SELFCHECK = [sys.executable, "-m", "cupyglm.distributed.selfcheck", "--backend", "numpy"]


@pytest.fixture(scope="session")
def mpirun() -> Path:
    if not MPIRUN.exists():
        pytest.skip(f"no mpirun beside {sys.executable}")
    return MPIRUN


@pytest.fixture
def launch(mpirun):
    jobs: list[Job] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> Job:
        job = Job([str(mpirun), *args], job_env(env))
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()


def run_job(launch, args: list[str], env: dict[str, str] | None = None,
            timeout: float = 60.0) -> tuple[int, str, float]:
    job = launch(args, env)
    rc, took = job.wait(timeout)
    return rc, job.output, took
