"""The quantised tiny checkpoints (make-tiny --quant fp8|nvfp4) under `mpirun -n 2` (TP=2, every rank reading its
shard of the packed weights and scales): concurrent equals solo through the offline LLM, and the run repeats."""
import os
import sys
from pathlib import Path

import pytest

from .test_llm_tp import _result

pytestmark = pytest.mark.mpi


@pytest.mark.timeout(400)
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_quantised_tp2_concurrent_equals_solo_and_repeats(launch, tmp_path, fmt):
    from cupyglm.checkpoint.tiny import write_tiny

    from .helpers import run_job

    model = write_tiny(tmp_path / fmt, quant=fmt)
    args = ["-n", "2", sys.executable, str(Path(__file__).resolve().parent / "test_llm_tp.py"), str(model)]
    env = {"CUPYGLM_CACHE_DIR": os.environ["CUPYGLM_CACHE_DIR"]}
    results = []
    for _ in range(2):
        rc, out, _ = run_job(launch, args, env, timeout=240)
        assert rc == 0, out
        results.append(_result(out))
    first = results[0]
    assert first["tp"] == 2 and first["free"] == first["total"] == 48
    assert first["together"] == first["alone"]
    assert all(len(t) >= 1 for t in first["together"])
    assert results[1] == first
