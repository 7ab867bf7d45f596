"""The dense layers (below first_k_dense_replace) clamp their SwiGLU at swiglu_limit exactly as the experts do,
and on the tiny checkpoint the clamp changes the output: its dense-MLP weights are wide enough that some of the
real activations' pre-activations pass the limit."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.kv.store import KVStore
from cupyglm.model.glm import GLMModel, SeqInput
from cupyglm.model.moe import MLP

PROMPT = np.random.default_rng(1).integers(0, 512, 40).astype(np.int32)


def _model(ckpt):
    cfg, ops = ckpt.config, NumpyOps()
    return GLMModel(cfg, ckpt.shard(0, 1), ops, LocalComm(), KVStore(cfg, ops, 8, cfg.page_tokens))


def _logits(model) -> np.ndarray:
    return model.forward([SeqInput(PROMPT, model.new_state(), all_logits=True)])[0].logits


def test_dense_mlp_is_built_with_the_limit(tiny_ckpt):
    cfg = tiny_ckpt.config
    model = _model(tiny_ckpt)
    dense = [b.mlp for b in model.blocks[:cfg.first_k_dense_replace]]
    assert dense and all(isinstance(m, MLP) and m.limit == cfg.swiglu_limit for m in dense)
    assert all(b.mlp.limit == cfg.swiglu_limit for b in model.blocks[cfg.first_k_dense_replace:])


def test_the_clamp_changes_the_dense_layer_and_the_logits(tiny_ckpt):
    cfg = tiny_ckpt.config
    clamped = _model(tiny_ckpt)
    seen = []
    mlp0 = clamped.blocks[0].mlp

    def record(x, decode=0):
        seen.append(np.array(x))
        return MLP.__call__(mlp0, x, decode)

    clamped.blocks[0].mlp = record
    want = _logits(clamped)
    clamped.blocks[0].mlp = mlp0

    # layer 0's MLP on the activations the model really gave it: some gate / up values pass the limit
    x = seen[0]
    pre = np.concatenate([x @ mlp0.gate.T, x @ mlp0.up.T], axis=1)
    share = np.mean(np.abs(pre) > cfg.swiglu_limit)
    assert 0.001 < share < 0.05, share
    limited = mlp0(x)
    mlp0.limit = None
    free = mlp0(x)
    assert np.max(np.abs(limited - free)) > 0.1 * np.std(limited)

    plain = _model(tiny_ckpt)
    for b in plain.blocks[:cfg.first_k_dense_replace]:
        b.mlp.limit = None
    got = _logits(plain)
    assert np.all(np.isfinite(want)) and 0.3 < want.std() < 3.0          # the random model stays sane
    assert np.max(np.abs(want - got)) > 0.1 and np.any(want.argmax(-1) != got.argmax(-1))
