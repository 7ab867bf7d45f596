"""KV rows in host memory on the cuda path (the strict CuPy double): the host rows and the flag words are
pinned host memory mapped into the device (cudaHostAlloc with cudaHostAllocMapped, a cupy array over the
device pointer), the gather runs the .cu kernels through RawKernel launches, and the logits equal the numpy
device-resident run bit for bit; the slot guard's flag is read from host memory after the step."""
from __future__ import annotations

import numpy as np
import pytest

from cupy_double.fixtures import cuda_double_module  # noqa: F401
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.distributed.comm import LocalComm
from cupyglm.engine.runner import ModelRunner
from cupyglm.model.glm import SeqInput


@pytest.fixture(scope="module")
def cuda_ops(cuda_double_module):
    from cupyglm.backend.cuda_ops import CudaOps

    return CudaOps()


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_host_rows_on_cuda_equal_numpy(tiny_ckpt, cuda_ops):
    import cupy

    prompt = np.random.default_rng(4).integers(3, 480, 45).astype(np.int32)
    ref = ModelRunner(tiny_ckpt, NumpyOps(), LocalComm(), 8, 16, poison=True)
    dev = ModelRunner(tiny_ckpt, cuda_ops, LocalComm(), 8, 16, poison=True, host_slots=64)
    host = dev.kv.host
    assert isinstance(host.latent[3], cupy.ndarray) and isinstance(host.flags, cupy.ndarray)
    rs, ds = ref.new_state(), dev.new_state()
    feed = prompt
    for step in range(3):
        lr = ref.forward([SeqInput(feed, rs)])[0].logits[-1]
        ld = cuda_ops.asnumpy_checked(dev.forward([SeqInput(feed, ds)], check=False)[0].logits[-1])
        assert host.take_refused() == []
        assert np.array_equal(bits(lr), bits(ld)), f"step {step}"
        feed = np.array([int(np.argmax(lr))], np.int32)
    assert host.take_stats()["hits"] > 0


def test_slot_guard_flag_in_mapped_memory(tiny_ckpt, cuda_ops):
    dev = ModelRunner(tiny_ckpt, cuda_ops, LocalComm(), 8, 16, poison=True, host_slots=20)
    st = dev.new_state()
    dev.forward([SeqInput(np.arange(3, 53, dtype=np.int32), st)], check=False)
    assert dev.kv.host.take_refused() == [0]
    assert dev.kv.host.take_refused() == []                              # cleared
    assert (cuda_ops.asnumpy(dev.kv.host.marks) == -1).all()             # no row left marked
