"""SimOps (cuda_src kernels on the CPU emulator behind the ops interface) and CudaOps' refusal of host compute."""
from __future__ import annotations

import numpy as np
import pytest

from cupyglm.backend import make_ops
from cupyglm.backend.lanes import BF16, bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.kernels import ops as kops

FRAMEWORK = {"gemm", "gemm_heads", "rmsnorm", "layernorm", "write_rows", "read_rows", "pick"}


def test_sim_ops_binds_every_registered_op():
    ops = make_ops("sim")
    assert ops.name == "sim" and ops.xp is np
    assert FRAMEWORK <= set(ops.kernel_ops) == set(kops.OPS)
    assert ops.gemm.__doc__ == NumpyOps.gemm.__doc__


def test_sim_write_rows_mutates_the_callers_store_and_views_are_accepted():
    ops, ref = make_ops("sim"), NumpyOps()
    rng = np.random.default_rng(0)
    store = np.full((32, 8), np.nan, BF16)                          # [rows, C] bf16, as kv/store.py allocates
    want = store.copy()
    rows = np.array([5, 17, 2], np.int32)
    vals = bf16(rng.standard_normal((3, 8)).astype(np.float32))
    ops.write_rows(store, rows, vals)
    ref.write_rows(want, rows, vals)
    assert store.dtype == BF16 and np.array_equal(store.view(np.uint16), want.view(np.uint16))
    x = bf16(rng.standard_normal((5, 3, 40)).astype(np.float32))      # [T, H, K]
    w = bf16(rng.standard_normal((3, 7, 40)).astype(np.float32))      # [H, N, K]
    xt = x.transpose(1, 0, 2)                                    # a non-contiguous view, as dsa.py passes
    assert not xt.flags.c_contiguous
    assert np.array_equal(ops.gemm_heads(xt, w), ref.gemm_heads(np.ascontiguousarray(xt), w))
    with pytest.raises(ValueError, match="rows repeats"):
        ops.write_rows(store, np.array([1, 1], np.int32), vals[:2])
    with pytest.raises(ValueError, match="outside"):
        ops.read_rows(store, np.array([32], np.int32))
    with pytest.raises(ValueError, match="store must be C-contiguous"):
        ops.write_rows(np.zeros((8, 32), BF16).T, rows, vals)
    with pytest.raises(ValueError, match="write_rows: parameter store must be bfloat16, got float32"):
        ops.write_rows(np.zeros((32, 8), np.float32), rows, vals)


def test_tiny_model_on_sim_with_the_framework_kernels_equals_numpy(tiny_ckpt):
    """Only the framework's ops on the emulator (others' in-progress kernels reverted to NumPy): tokens and
    logits bit-identical to the numpy backend."""
    from cupyglm.distributed.comm import LocalComm
    from cupyglm.engine.runner import ModelRunner
    from cupyglm.model.glm import SeqInput

    sim = make_ops("sim")
    for name in set(sim.kernel_ops) - FRAMEWORK:
        delattr(sim, name)
    out = {}
    for label, ops in (("numpy", NumpyOps()), ("sim", sim)):
        r = ModelRunner(tiny_ckpt, ops, LocalComm(), 8, tiny_ckpt.config.page_tokens, poison=True)
        st = r.new_state()
        prompt = np.arange(3, 43, dtype=np.int32)                # 40 tokens: past the dense limit (35)
        logits = [r.forward([SeqInput(prompt, st)])[0].logits[-1]]
        for _ in range(4):
            tok = int(np.argmax(logits[-1]))
            logits.append(r.forward([SeqInput(np.array([tok], np.int32), st)])[0].logits[-1])
        out[label] = np.stack(logits)
    assert np.array_equal(out["sim"].view(np.uint32), out["numpy"].view(np.uint32))


def test_cuda_ops_refuses_ops_without_a_kernel(monkeypatch):
    pytest.importorskip("cupy")
    from cupyglm.backend.cuda_ops import CudaOps

    kops.load_all()
    ops_now = dict(kops.OPS)
    ops_now.pop("sigmoid", None)
    monkeypatch.setattr(kops, "OPS", ops_now)
    ops = CudaOps()
    assert ops.name == "cuda"
    with pytest.raises(NotImplementedError, match="'sigmoid'"):
        ops.sigmoid(np.zeros(3, np.float32))
    assert "gemm" in ops.kernel_ops and "weight" not in ops.kernel_ops


def test_launchers_refuse_wrong_calls_naming_the_parameter():
    ops = make_ops("sim")
    f = np.zeros((2, 16), BF16)
    with pytest.raises(ValueError, match="rmsnorm: parameter w must have shape"):
        ops.rmsnorm(f, np.zeros(15, BF16), 1e-5)
    with pytest.raises(ValueError, match="rmsnorm: parameter x must be bfloat16, got float32"):
        ops.rmsnorm(f.astype(np.float32), np.zeros(16, BF16), 1e-5)
    with pytest.raises(ValueError, match="layernorm: parameter b"):
        ops.layernorm(f, np.zeros(16, BF16), np.zeros(16, np.float64), 1e-6)
    with pytest.raises(ValueError, match="read_rows: parameter rows must be int32"):
        ops.read_rows(f, np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="read_rows: parameter rows holds ids outside"):
        ops.read_rows(f, np.array([2], np.int32))
    with pytest.raises(ValueError, match="pick: parameter width"):
        ops.pick(np.zeros((1, 40), np.float32), np.array([100]), 8, 4, 20)
    with pytest.raises(ValueError, match="pick: parameter scores has 10 pools"):
        ops.pick(np.zeros((1, 10), np.float32), np.array([100]), 8, 4, 35)
    with pytest.raises(ValueError, match="pick: parameter positions must be integers"):
        ops.pick(np.zeros((1, 40), np.float32), np.array([1.0]), 8, 4, 35)
    tok, cnt = ops.pick(np.zeros((2, 0), np.float32), np.array([0, 9]), 8, 4, 35)   # all dense
    assert cnt.tolist() == [1, 10] and tok[1, :11].tolist() == list(range(10)) + [-1]
