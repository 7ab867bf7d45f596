"""bf16 storage: weights, KV rows, pooled keys and the bf16 parts of a sequence's state are 16-bit arrays
(ml_dtypes.bfloat16 on numpy), and a weight shard stays a zero-copy view over the memory-mapped checkpoint."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend.lanes import BF16, bf16
from cupyglm.checkpoint.names import TEXT_PREFIX
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.runner import ModelRunner
from cupyglm.model.glm import SeqInput

ops = NumpyOps()


def test_weight_keeps_a_contiguous_bf16_array_as_is():
    a = bf16(np.arange(12, dtype=np.float32).reshape(3, 4))
    w = ops.weight(a)
    assert w.dtype == BF16 and np.shares_memory(w, a)
    f32 = np.array([1.0 + 2**-10, -3.0], np.float32)            # a tensor stored F32 stays fp32, unrounded
    assert ops.weight(f32).dtype == np.float32 and np.shares_memory(ops.weight(f32), f32)
    exact = np.array([1.0, 0.5, -3.0], np.float64)              # other float values that are bf16 values: converted
    assert ops.weight(exact).dtype == BF16 and ops.weight(exact).astype(np.float32).tolist() == [1.0, 0.5, -3.0]
    with pytest.raises(ValueError, match="never rounded on load"):
        ops.weight(np.array([1.0 + 2**-10], np.float64))
    with pytest.raises(ValueError, match="expects a bf16"):
        ops.weight(np.array([1, 2], np.int32))


def _arrays(obj, seen=None, path="model"):
    """Every numpy array reachable from the model's objects (attributes, lists, dicts), with its path."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        yield path, obj
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            yield from _arrays(x, seen, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, x in obj.items():
            yield from _arrays(x, seen, f"{path}[{k!r}]")
    elif type(obj).__module__.startswith("cupyglm.model"):
        for k, x in vars(obj).items():
            if k not in ("cfg", "ops", "comm", "kv"):
                yield from _arrays(x, seen, f"{path}.{k}")


def test_model_weights_kv_and_state_are_bf16_and_shards_are_views(tiny_ckpt):
    ckpt = tiny_ckpt
    cfg = ckpt.config

    class Rank1of2(LocalComm):                  # rank 1's shard of TP=2; the step below runs no collective
        rank, size = 1, 2

    runner = ModelRunner(ckpt, ops, Rank1of2(), 8, cfg.page_tokens, mtp=True)
    model = runner.model
    arrays = list(_arrays(model))
    assert len(arrays) > 50
    wrong = [(p, a.dtype) for p, a in arrays if a.dtype not in (BF16, np.float32)]
    assert not wrong, wrong[:5]
    fp32 = {p.rsplit(".", 1)[-1] for p, a in arrays if a.dtype == np.float32}
    assert fp32 and fp32 <= {"base", "scale", "a_log", "dt_bias", "bias"}, fp32   # only what the checkpoint stores F32
    # rank 1's row-split tensor holds exactly the second half of the stored one, in its stored bf16
    dsa = next(b for b in model.blocks if not b.is_kda).attn
    layer = next(i for i, b in enumerate(model.blocks) if not b.is_kda)
    full = ckpt.tensor(f"{TEXT_PREFIX}layers.{layer}.self_attn.q_b_proj.weight")
    half = full.shape[0] // 2
    assert dsa.q_b.dtype == BF16 and np.array_equal(dsa.q_b.view(np.uint16), full[half:].view(np.uint16))
    for store in (*runner.kv.latent.values(), *runner.kv.pooled.values()):
        assert store.dtype == BF16 and store.itemsize == 2


def test_state_keeps_bf16_where_the_model_does(tiny_ckpt):
    cfg = tiny_ckpt.config
    runner = ModelRunner(tiny_ckpt, ops, LocalComm(), 8, cfg.page_tokens, mtp=True)
    st = runner.new_state()
    runner.forward([SeqInput(np.arange(1, 7, dtype=np.int32), st)])      # 6 tokens: an incomplete pool remains
    assert st.kda_state and all(s.dtype == np.float32 for s in st.kda_state.values())   # fp32 recurrent state
    assert all(w.dtype == BF16 for w in st.kda_conv.values())
    assert st.index_tail and all(a.dtype == BF16 and b.dtype == BF16 for a, b in st.index_tail.values())
    assert st.mtp_pending is not None and st.mtp_pending.dtype == BF16
    runner.release(st)
