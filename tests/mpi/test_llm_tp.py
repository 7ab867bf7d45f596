"""The offline LLM under `mpirun -n 2` (TP=2): concurrent equals solo, and two runs are identical.

Run as a script by mpirun (`python tests/mpi/test_llm_tp.py`), it prints one RESULT line of JSON on rank 0.
"""
import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi
LENGTHS = [5, 40, 70, 12]


def script(model: str | None = None) -> None:
    """model: a checkpoint directory (the quantised tiny ones of test_quant_tp.py), else the built-in tiny."""
    import numpy as np

    from cupyglm import LLM, SamplingParams

    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 496, n).tolist() for n in LENGTHS]
    params = [SamplingParams(temperature=0, max_tokens=8),
              SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=8),
              SamplingParams(temperature=1.0, top_k=20, min_p=0.05, seed=5, max_tokens=6, min_tokens=2),
              SamplingParams(temperature=1.2, seed=11, ignore_eos=True, max_tokens=7)]
    llm = LLM(model=model, backend="numpy", parallel=4, context=128, kv_pages=48, log=False)
    together = llm.generate(prompts, params)
    alone = [llm.generate([p], [sp]) for p, sp in zip(prompts, params)]
    if llm.rank == 0:
        free = llm.engine.free_pages
        print("RESULT " + json.dumps({"tp": llm.world.size, "free": free, "total": llm.engine.total_pages,
                                      "together": [c.token_ids for c in together],
                                      "alone": [a[0].token_ids for a in alone]}), flush=True)
    else:
        assert together == [] and all(a == [] for a in alone)
    llm.close()


def _result(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, out
    return json.loads(lines[0][len("RESULT "):])


def check_concurrent_equals_solo_twice(launch, model: str | None = None) -> None:
    """`script` under `mpirun -n 2`, twice: every page free after, concurrent = solo, and the two runs equal."""
    from .helpers import run_job

    args = ["-n", "2", sys.executable, str(Path(__file__).resolve())] + ([model] if model else [])
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


@pytest.mark.timeout(300)
def test_tp2_concurrent_equals_solo_and_repeats(launch, tiny_dir):
    check_concurrent_equals_solo_twice(launch)


if __name__ == "__main__":
    script(sys.argv[1] if len(sys.argv) > 1 else None)
