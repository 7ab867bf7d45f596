"""What a sublayer's cross-rank sum costs on the cuda code path (the CuPy double), at TP=2 with NcclComm's own
collective code: one collective (the allgather of the partial) and no launch of its own (hc_post, fused with the
next hc_pre + norm, adds the ranks' parts in rank order as it reads them; decode rows run its split form,
hc_post_split then hc_mix_norm); a decode token makes 2 collectives a layer plus the lm_head's gather. The test comms
gather in rank order, and hc_post's launcher refuses a branch that is neither [T, D] nor [R, T, D]."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import cupy_double
from cupy_double.fixtures import cuda_double_module, cuda_ops  # noqa: F401
from model_helpers import ThreadComm, ThreadGroup

from cupyglm.distributed.comm import NcclComm
from cupyglm.model.glm import SeqInput

TP = 2
SPLIT = {"hc_post_split": 1, "hc_mix_norm": 1}     # hc_post_pre_norm's decode form (hc_split.cu)


class _MirrorNccl:
    """NCCL's allGather of `size` ranks in one process, every rank holding this one's bytes (the calls are the
    point here, not the values); counted as the double's NCCL counts its calls."""

    def __init__(self, size: int):
        self.size = size

    def allGather(self, send, recv, count, dtype, stream):
        from cupy_double import nccl

        src = nccl._view(send, count, dtype, "sendbuf")
        nccl._view(recv, count * self.size, dtype, "recvbuf")[:] = np.tile(src, self.size)
        cupy_double.STATE.count("collectives", what="allGather")


def _mirror_comm(size: int) -> NcclComm:
    """NcclComm's collectives (allgather, allreduce_sum, concat_last) over a mirrored NCCL of `size` ranks."""
    import cupy
    from cupy.cuda import nccl

    from cupyglm.kernels.ops import Kernels

    c = NcclComm.__new__(NcclComm)
    c._cupy, c._nccl, c.rank, c.size, c.nccl = cupy, nccl, 0, size, _MirrorNccl(size)
    c._kernels = Kernels("cuda", cupy)
    return c


@pytest.fixture(scope="module")
def decode(cuda_ops, tiny_dir):
    """Rank 0's model at TP=2 after a prompt, and a begun decode call: (model, comm, call, layer 0's inputs)."""
    from cupyglm.checkpoint.loader import Checkpoint
    from cupyglm.engine.runner import ModelRunner

    comm = _mirror_comm(TP)
    model = ModelRunner(Checkpoint.open(tiny_dir), cuda_ops, comm, 16, 16).model
    st = model.new_state()
    model.forward([SeqInput(np.arange(5, 17, dtype=np.int32), st)])
    call = model.begin([SeqInput(np.array([7], np.int32), st, decode=True)])
    return model, comm, call, model.ends_enter(cuda_ops.xp.asarray(call.tokens))


def _counts(fn):
    with cupy_double.counting(trace=True) as c:
        out = fn()
    return c, out


def _extra(full, own) -> tuple[int, dict, int, int]:
    """What the sublayer's whole call ran beyond its own compute: (collectives, launches by name, cupy kernels,
    syncs)."""
    named = {k: v - own.where.get("launches", {}).get(k, 0) for k, v in full.where.get("launches", {}).items()}
    return (full.collectives - own.collectives, {k: v for k, v in named.items() if v},
            full.kernels - own.kernels, full.syncs - own.syncs)


def test_attention_sublayer_is_one_gather_and_the_fused_hc_post(decode):
    model, comm, call, (X, h, post, comb) = decode
    blk = model.blocks[0]
    assert blk.is_kda
    own, _ = _counts(lambda: blk.attn(h, call.segs))
    full, _ = _counts(lambda: blk.attention(X, h, post, comb, call.segs, model.kv, comm))
    assert _extra(full, own) == (1, SPLIT, 0, 0)


def test_ffn_sublayer_is_one_gather_and_the_fused_hc_post(decode):
    model, comm, call, (X, h, post, comb) = decode
    blk, nxt = model.blocks[0], model.blocks[1]
    X, h, post, comb = blk.attention(X, h, post, comb, call.segs, model.kv, comm)
    own, _ = _counts(lambda: blk.mlp(h, call.decode))
    full, _ = _counts(lambda: blk.ffn(X, h, post, comb, call.decode, comm, nxt))
    assert _extra(full, own) == (1, SPLIT, 0, 0)
    own, _ = _counts(lambda: model.blocks[-1].mlp(h, call.decode))
    last, _ = _counts(lambda: model.blocks[-1].ffn(X, h, post, comb, call.decode, comm, None))
    assert _extra(last, own) == (1, {"hc_post": 1}, 0, 0)


def test_decode_token_collectives_are_two_a_layer_and_the_lm_head(decode):
    model, comm, call, _ = decode
    st = call.items[0].state
    c, _ = _counts(lambda: model.forward([SeqInput(np.array([9], np.int32), st, decode=True)]))
    layers = len(model.blocks)
    assert c.where["collectives"] == {"allGather": 2 * layers + 1}
    assert not [k for k in c.where["launches"] if k.startswith("rank_sum")]


def test_thread_comm_gathers_in_rank_order():
    group = ThreadGroup(3)
    out = [None] * 3

    def rank(r):
        out[r] = ThreadComm(group, r).allgather(np.full((2, 3), r, np.float32))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for o in out:
        assert o.shape == (3, 2, 3) and [int(o[r, 0, 0]) for r in range(3)] == [0, 1, 2]


@pytest.mark.parametrize("shape", [(4,), (1, 2, 5, 8), (2, 3, 8), (0, 2, 8)])
def test_hc_post_refuses_a_branch_of_another_shape(cuda_ops, shape):
    from cupyglm.kernels import ops_hc

    xp, k = cuda_ops.xp, cuda_ops.kernels
    X = xp.zeros((2, 4, 8), dtype=k.bf16)
    post, comb = xp.zeros((2, 4), np.float32), xp.zeros((2, 4, 4), np.float32)
    with pytest.raises(ValueError, match="hc_post: parameter branch"):
        ops_hc.hc_post(k, X, xp.zeros(shape, np.float32), post, comb)
