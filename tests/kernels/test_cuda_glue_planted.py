"""Glue bugs the CuPy double must catch on the cuda path (each planted, each must raise as on a GPU): a host
array passed to a launcher, a Python int kernel argument, a transposed (non-contiguous) view, a 2,048-thread
block, too much shared memory, and weights/KV allocated at 4 bytes a value while the plan counts 2."""
from __future__ import annotations

import numpy as np
import pytest

from cupy_double.fixtures import cuda_double  # noqa: F401
from cupyglm.backend.lanes import bf16, to_bits
from cupyglm.kernels import ops_gemm, ops_gemm_tc, ops_norm, ops_sample
from cupyglm.memory import BF16_STORAGE
from cupyglm.kernels.ops import Kernels

FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures"


@pytest.fixture
def k(cuda_double):
    import cupy

    return Kernels("cuda", cupy)


def _gemm_inputs(cp):
    """x [3, 32] and w [16, 32] in cuda's bf16 storage (uint16 bit patterns)."""
    rng = np.random.default_rng(0)
    return (cp.asarray(to_bits(bf16(rng.standard_normal((3, 32), np.float32)))),
            cp.asarray(to_bits(bf16(rng.standard_normal((16, 32), np.float32)))))


def test_the_unplanted_launch_runs(k):
    x, w = _gemm_inputs(k.xp)
    assert np.isfinite(ops_gemm.gemm(k, x, w).get()).all()


def test_host_array_to_a_launcher(k):
    x, w = _gemm_inputs(k.xp)
    with pytest.raises(TypeError, match="host array"):
        ops_gemm.gemm(k, x.get(), w)                   # check() takes it (shape, dtype, contiguous): the launch not
    with pytest.raises(TypeError, match="host array"):
        ops_norm.rmsnorm(k, x, w[0].get(), 1e-6)


def test_python_int_kernel_argument(k, monkeypatch):
    x, w = _gemm_inputs(k.xp)
    monkeypatch.setattr(ops_gemm_tc, "i32", int)       # the launcher forgets np.int32
    with pytest.raises(TypeError, match="Python int"):
        ops_gemm.gemm(k, x, w)


def test_transposed_view(k, monkeypatch):
    x, w = _gemm_inputs(k.xp)
    xt = k.xp.ascontiguousarray(x.T).T                  # x's values, a non-contiguous view
    for m in (ops_gemm, ops_gemm_tc):                   # the launchers skip their checks
        monkeypatch.setattr(m, "check", lambda kernel, param, a, *rest: a)
    with pytest.raises(ValueError, match="non-contiguous"):
        ops_gemm.gemm(k, xt, w)


def test_array_of_another_dtype_than_the_pointer(k, monkeypatch):
    x, w = _gemm_inputs(k.xp)
    for m in (ops_gemm, ops_gemm_tc):
        monkeypatch.setattr(m, "check", lambda kernel, param, a, *rest: a)
    with pytest.raises(TypeError, match=r"\(const __nv_bfloat16\*\): a float32 array; the kernel reads uint16"):
        ops_gemm.gemm(k, k.xp.zeros((3, 32), k.xp.float32), w)   # fp32 values handed to a bf16 parameter


def test_block_over_1024_threads(k, monkeypatch):
    xp = k.xp
    monkeypatch.setattr(ops_sample, "THREADS", 2048)
    r, v = 2, 64
    args = [xp.zeros((r, v), xp.float32), xp.zeros(r, xp.float32), xp.zeros(r, xp.int32), xp.ones(r, xp.float32),
            xp.zeros(r, xp.float32), xp.zeros(r, xp.uint64), xp.zeros(r, xp.int32)]
    from cupy_double.raw import CUDADriverError

    with pytest.raises(CUDADriverError, match="over 1024 threads"):
        ops_sample.sample(k, *args)


def test_static_plus_dynamic_shared_memory_over_48k(k):
    xp = k.xp
    from cupy_double.raw import CUDADriverError
    from cupyglm.kernels.cuda import CudaModule

    fn = CudaModule(FIXTURES / "static_shared.cu").get_function("static_40k")
    assert fn.static_shared == 40 * 1024                 # read from the cubin's .nv.shared section
    y = xp.zeros(1, xp.float32)
    fn((1,), (32,), (y,), shared_mem=4096)               # 44 KiB: fits
    assert y.get()[0] == 31.0
    with pytest.raises(CUDADriverError, match="shared memory over 49152"):
        fn((1,), (32,), (y,), shared_mem=16 * 1024)


# ---- the plan counts 2 bytes a value; the device must not be asked for 4 ---------------------------------------
BUDGET = 64 * 2**20


def _plan(cfg, budget):
    from cupyglm.engine.plan import plan_memory

    return plan_memory(cfg, tp=1, budget_bytes=budget, parallel=4, reserve_gib=0.0, chunk_rows=64,
                       storage=BF16_STORAGE)


@pytest.mark.parametrize("dtype, fits", [(np.uint16, True), (np.float32, False)])
def test_a_plan_sized_device_refuses_fp32_kv(cuda_double, tiny_ckpt, dtype, fits):
    """The KV pool of the plan's pages (each layer's latent rows and pooled keys), allocated on a device of
    exactly the plan's KV bytes: bf16 bits (uint16) fit, float32 (the planted bug) runs out of memory."""
    import cupy

    cfg = tiny_ckpt.config
    plan = _plan(cfg, BUDGET)
    rows = plan.num_pages * plan.page_tokens
    cuda_double.set_budget(cuda_double.in_use() + plan.kv_bytes)
    held = []

    def allocate():
        for _ in cfg.kv_layers:
            held.append(cupy.empty((rows, cfg.kv_lora_rank), dtype))
            held.append(cupy.empty((rows // cfg.index_kpool, cfg.index_head_dim), dtype))
    if fits:
        allocate()
    else:
        with pytest.raises(cupy.cuda.memory.OutOfMemoryError):
            allocate()


def test_cuda_engine_fits_its_plan_on_a_device_of_that_size(cuda_double):
    """cupyglm-serve's startup on a 64 MiB device: the plan fills it with KV pages, the engine allocates them
    and serves. With fp32 storage the pool alone is twice the plan and the device runs out of memory."""
    from cupyglm.engine.llm import LLM
    from cupyglm.engine.sampling import SamplingParams
    from cupyglm.settings import Settings

    cuda_double.set_budget(cuda_double.in_use() + BUDGET)
    llm = LLM(settings=Settings(backend="cuda", memory_reserve_gib=0.0, parallel=4), log=False)
    try:
        out = llm.generate([[5, 17, 300, 42]], SamplingParams(temperature=0, max_tokens=4))
        assert len(out[0].token_ids) == 4
    finally:
        llm.close()
