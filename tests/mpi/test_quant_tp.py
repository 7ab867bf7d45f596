"""The quantised tiny checkpoints (make-tiny --quant fp8|nvfp4) under `mpirun -n 2` (TP=2, every rank reading its
shard of the packed weights and scales): concurrent equals solo through the offline LLM, and the run repeats."""
import pytest

from .test_llm_tp import check_concurrent_equals_solo_twice

pytestmark = pytest.mark.mpi


@pytest.mark.timeout(400)
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_quantised_tp2_concurrent_equals_solo_and_repeats(launch, tmp_path, fmt):
    from cupyglm.checkpoint.tiny import write_tiny

    check_concurrent_equals_solo_twice(launch, str(write_tiny(tmp_path / fmt, quant=fmt)))
