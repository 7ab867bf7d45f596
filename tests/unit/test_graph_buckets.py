"""The decode graphs' buckets (engine/graph_capture.py) and their setting (CUPYGLM_CUDA_GRAPHS, engine/build.py)."""
from __future__ import annotations

import pytest

from cupyglm.engine.build import cuda_graphs
from cupyglm.engine.graph_capture import BUCKETS, bucket


def test_a_call_runs_in_the_smallest_bucket_that_holds_it():
    assert BUCKETS == (1, 2, 4, 8, 16)
    assert [bucket(r) for r in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    assert bucket(17) is None                       # more rows than the largest bucket: eager


def test_the_setting_is_cuda_only_and_0_or_1(monkeypatch):
    monkeypatch.delenv("CUPYGLM_CUDA_GRAPHS", raising=False)
    assert not cuda_graphs("cuda")                  # off unless asked for
    monkeypatch.setenv("CUPYGLM_CUDA_GRAPHS", "1")
    assert cuda_graphs("cuda") and not cuda_graphs("numpy") and not cuda_graphs("sim")
    monkeypatch.setenv("CUPYGLM_CUDA_GRAPHS", "yes")
    with pytest.raises(ValueError, match="CUPYGLM_CUDA_GRAPHS must be 0 or 1"):
        cuda_graphs("cuda")
