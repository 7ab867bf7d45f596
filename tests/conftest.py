"""Shared fixtures. Every test session runs with CUPYGLM_CACHE_DIR in a session temp dir, so no test touches
the user's home cache; `tiny_dir` / `tiny_ckpt` are the built-in tiny checkpoint built there once."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory, request):
    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):       # pytest-xdist: workers share one cache (and race to build)
        root = root.parent
    cache = root / "cupyglm-cache"
    cache.mkdir(parents=True, exist_ok=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("CUPYGLM_CACHE_DIR", str(cache))
    yield cache
    mp.undo()


@pytest.fixture(scope="session")
def tiny_dir(_session_cache_dir):
    from cupyglm.checkpoint.tiny import default_tiny_dir

    return default_tiny_dir()


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_dir):
    from cupyglm.checkpoint.loader import Checkpoint

    return Checkpoint.open(tiny_dir)
