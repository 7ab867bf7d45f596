"""A DSA layer's decode rows through the CuPy double: the call's row maps uploaded once per forward call and no
row map computed on the device in any layer, the latent rows normed inside their write and the index keys
layer-normed in that same launch, the attention chunks merged inside the pv kernel; a batch of decode sequences
writes its latent rows in one launch per layer, its index tails (a slot each in the KV store) and completed
pools in one more, and picks every row's tokens in one scores launch and one pick launch per layer (dense and
sparse rows alike), with no concatenate of token lists."""
from __future__ import annotations

import numpy as np
import pytest

from cupy_double.fixtures import cuda_double_module  # noqa: F401
import cupy_double
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.runner import ModelRunner
from cupyglm.model.glm import SeqInput

ROW_MAP_KERNELS = ("floor_divide", "remainder", "maximum", "less", "where")


@pytest.fixture(scope="module")
def cuda_ops(cuda_double_module):
    from cupyglm.backend.cuda_ops import CudaOps

    return CudaOps()


def _decode_counts(ckpt, ops, prompts):
    runner = ModelRunner(ckpt, ops, LocalComm(), 64, 16)
    states = [runner.new_state() for _ in prompts]
    out = runner.forward([SeqInput(np.asarray(p, np.int32), s) for p, s in zip(prompts, states)])
    toks = [int(np.argmax(ops.asnumpy_checked(o.logits[-1]))) for o in out]
    with cupy_double.counting(trace=True) as c:
        runner.model.forward([SeqInput(np.array([t], np.int32), s, decode=True) for t, s in zip(toks, states)])
    for s in states:
        runner.release(s)
    return c


@pytest.mark.parametrize("prompts", [[[5, 17, 300, 42]], [[5, 17, 300], list(range(60, 100)), [7] * 13]],
                         ids=["one", "three"])
def test_dsa_decode_rows_launches(tiny_ckpt, cuda_ops, prompts):
    cfg = tiny_ckpt.config
    dsa = sum(1 for t in cfg.layer_types if t != "linear_attention")
    c = _decode_counts(tiny_ckpt, cuda_ops, prompts)
    kernels, launches = c.where.get("kernels", {}), c.where.get("launches", {})
    assert not [k for k in ROW_MAP_KERNELS if k in kernels], kernels       # no per-layer row map on the device
    assert "attention_merge" not in launches, launches                    # merged inside attention_chunk_pv
    assert launches.get("kv_write_rows_rmsnorm_keys") == dsa, launches     # one normed write per layer, any batch
    assert "layernorm_rows" not in launches, launches                     # the index keys normed in that write
    assert "check_ids_distinct" not in launches, launches                  # the maps' ids were checked on the host
    assert launches.get("attention_chunk_pv") == dsa, launches
    assert launches.get("index_tail_pool") == dsa, launches                 # every sequence's tail, one launch
    assert launches.get("dsa_pick") == dsa, launches                       # every row picked, one launch a layer
    assert launches.get("index_scores_rows") == dsa, launches             # every row scored, one launch a layer
    assert "index_scores" not in launches, launches                       # no per-segment scores
