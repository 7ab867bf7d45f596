"""Self-tests of the CPU emulator (sim backend): the errors it reports (races, deadlocks, warp misuse, argument
and launch checks, crashes isolated from the next launch) and its build step, on cuda_src/selftest.cu and
fixtures/."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cupyglm.kernels import CUDA_SRC, kernel_names, load_module
from cupyglm.kernels.sim import SimModule
from cupyglm.kernels.sim_build import SimCompileError
from cupyglm.kernels.sim_errors import SimCrash, SimDeadlock, SimKernelError, SimLaunchError, SimTimeout
from cupyglm.kernels.sim_order import get_thread_order, set_thread_order

FIXTURES = Path(__file__).parent / "fixtures"
i32, u32, f32 = np.int32, np.uint32, np.float32


@pytest.fixture(scope="module")
def st():
    return load_module("sim", CUDA_SRC / "selftest.cu")


@pytest.fixture(scope="module")
def crash_mod():
    return load_module("sim", FIXTURES / "crash.cu")


@pytest.fixture(scope="module")
def dead_mod():
    return load_module("sim", FIXTURES / "deadlock.cu")


# ---------------------------------------------------------------------------
# races, deadlocks, misuse
# ---------------------------------------------------------------------------
def test_missing_syncthreads_detected_by_thread_order():
    mod = load_module("sim", FIXTURES / "racy.cu")
    x = np.arange(64, dtype=f32)
    outs = {}
    for order in ("forward", "reverse"):
        y = np.zeros(64, f32)
        mod.get_function("missing_sync")(1, 64, (x, y), order=order)
        outs[order] = y
    assert not np.array_equal(outs["forward"], outs["reverse"], equal_nan=True)
    # the unsynchronised read sees the 0xFF poison in forward order
    assert outs["forward"][:63].view(np.uint32).tolist() == [0xFFFFFFFF] * 63


@pytest.mark.timeout(60)
def test_threads_exiting_before_barrier_is_a_deadlock(dead_mod):
    with pytest.raises(SimDeadlock, match=r"exit_before_barrier, block \(0,0,0\).*exited.*__syncthreads"):
        dead_mod.get_function("exit_before_barrier")(1, 64, (np.zeros(64, f32),))


@pytest.mark.timeout(60)
def test_divergent_barrier_sites_are_a_deadlock(dead_mod):
    with pytest.raises(SimDeadlock, match=r"divergent_sites.*divergent barriers.*deadlock\.cu:1[46]\).*deadlock\.cu:1[46]\)"):
        dead_mod.get_function("divergent_sites")(2, 64, (np.zeros(64, f32),))


@pytest.mark.timeout(60)
def test_partial_warp_shuffle_is_a_deadlock(dead_mod):
    with pytest.raises(SimDeadlock, match=r"warp_partial.*__shfl_xor_sync.*lane 16.*exited"):
        dead_mod.get_function("warp_partial")(1, 32, (np.zeros(32, f32),))


def test_warp_mask_misuse_reported(dead_mod):
    with pytest.raises(SimKernelError, match=r"does not include its own lane"):
        dead_mod.get_function("lane_not_in_mask")(1, 32, (np.zeros(32, f32),))
    with pytest.raises(SimKernelError, match=r"reads lane 1\d, which is not in the mask 0x0000ffff"):
        dead_mod.get_function("read_outside_mask")(1, 32, (np.zeros(32, f32),))
    # the module still works afterwards
    with pytest.raises(SimDeadlock):
        dead_mod.get_function("exit_before_barrier")(1, 64, (np.zeros(64, f32),))


# ---------------------------------------------------------------------------
# argument checking
# ---------------------------------------------------------------------------
def test_wrong_argument_types_refused_with_parameter_name(st):
    fn = st.get_function("block_reduce_sum")
    x, out = np.zeros(256, f32), np.zeros(1, f32)
    with pytest.raises(ValueError, match=r"kernel block_reduce_sum parameter 2 'n' expects int \(np\.int32\), got int$"):
        fn(1, 256, (x, out, 256))
    with pytest.raises(ValueError, match=r"parameter 2 'n' expects int \(np\.int32\), got np\.int64"):
        fn(1, 256, (x, out, np.int64(256)))
    with pytest.raises(ValueError, match=r"parameter 2 'n' expects int \(np\.int32\), got numpy\.ndarray"):
        fn(1, 256, (x, out, np.array(256, i32)))
    with pytest.raises(ValueError, match=r"parameter 0 'x' expects a pointer \(const float\*\).*got np\.float32"):
        fn(1, 256, (f32(1), out, i32(256)))
    with pytest.raises(ValueError, match=r"parameter 1 'out'.*C-contiguous"):
        fn(1, 256, (x, np.zeros(4, f32)[::2], i32(256)))
    with pytest.raises(ValueError, match=r"takes 3 arguments \(const float\* x, float\* out, int n\), got 2"):
        fn(1, 256, (x, out))
    g = st.get_function("two_barrier_scale")
    with pytest.raises(ValueError, match=r"parameter 2 'alpha' expects float \(np\.float32\), got float$"):
        g(1, 256, (x, x.copy(), 2.0))
    with pytest.raises(ValueError, match=r"parameter 2 'alpha' expects float \(np\.float32\), got np\.float64"):
        g(1, 256, (x, x.copy(), np.float64(2.0)))


def test_scalar_parameter_abi(st):
    out = np.zeros(6, np.int64)
    fout = np.zeros(2, f32)
    st.get_function("scalar_kinds")(
        1, 1, (out, fout, i32(-7), u32(4_000_000_000), np.int64(-(2**40)), np.uint64(2**41), f32(1.5), np.float64(2.25))
    )
    assert out[:4].tolist() == [-7, 4_000_000_000, -(2**40), 2**41]
    assert fout.tolist() == [1.5, 2.25]


def test_launch_config_errors(st):
    x, out = np.zeros(2048, f32), np.zeros(2, f32)
    fn = st.get_function("block_reduce_sum")
    with pytest.raises(SimLaunchError, match="exceeds CUDA limits"):
        fn(1, 2048, (x, out, i32(2048)))
    with pytest.raises(SimLaunchError, match="max_dynamic_shared_size_bytes"):
        fn(1, 256, (x, out, i32(256)), shared_mem=64 * 1024)
    with pytest.raises(ValueError, match="order must be one of"):
        fn(1, 256, (x, out, i32(256)), order="sideways")
    with pytest.raises(KeyError, match="not found"):
        st.get_function("no_such_kernel")


def test_module_level_thread_order(st):
    saved = get_thread_order()
    try:
        set_thread_order("reverse")
        counter, slots = np.zeros(1, i32), np.zeros(64, i32)
        st.get_function("atomic_slots")(2, 32, (counter, slots, i32(64)))
        np.testing.assert_array_equal(slots, np.arange(64)[::-1])
    finally:
        set_thread_order(*saved)


def test_in_place_aliasing(st):
    x = np.arange(512, dtype=f32)
    expect = (x.reshape(2, 256)[:, ::-1] * 3.0 * 2).reshape(-1)
    st.get_function("two_barrier_scale")(2, 256, (x, x, f32(3.0)))
    np.testing.assert_array_equal(x, expect)


# ---------------------------------------------------------------------------
# crashes
# ---------------------------------------------------------------------------
def _ok_after(mod):
    p = np.zeros(1, i32)
    mod.get_function("trap_kernel")(1, 8, (p,))
    assert p[0] == 1


@pytest.mark.timeout(120)
def test_crashes_are_reported_and_isolated(crash_mod):
    mod = crash_mod
    x = np.zeros(1024, f32)
    with pytest.raises(SimCrash, match=r"oob_write crashed with SIGSEGV in block \(0,0,0\) thread \(0,0,0\).*"
                                       r"12 bytes past the end of parameter 0 'x'"):
        mod.get_function("oob_write")(1, 32, (x, i32(1024)))
    _ok_after(mod)
    with pytest.raises(SimCrash, match=r"past the end of parameter 0 'x'"):
        mod.get_function("oob_read")(1, 1, (x, np.zeros(1, f32), i32(1024)))
    with pytest.raises(SimCrash, match=r"null_deref crashed with SIGSEGV .*thread \(5,0,0\).*null pointer"):
        mod.get_function("null_deref")(1, 32, (np.zeros(1, i32),))
    with pytest.raises(SimCrash, match=r"trap_kernel crashed with SIGILL in block \(1,0,0\) thread \(3,0,0\)") as ei:
        mod.get_function("trap_kernel")(2, 8, (np.zeros(1, i32),))
    assert ei.value.signal_name == "SIGILL" and ei.value.kernel == "trap_kernel"
    _ok_after(mod)
    with pytest.raises(SimCrash, match=r"assert_kernel crashed with SIGABRT"):
        mod.get_function("assert_kernel")(1, 1, (np.zeros(1, i32), i32(1)))
    ro = np.zeros(16, f32)
    with pytest.raises(SimCrash, match=r"read-only parameter 0 'x'"):
        mod.get_function("const_write")(1, 1, (ro,))
    assert ro[0] == 0
    with pytest.raises(SimCrash, match=r"stack overflow"):
        mod.get_function("stack_overflow")(1, 1, (np.zeros(1, i32),))
    with pytest.raises(SimCrash, match=r"dynamic shared memory"):
        mod.get_function("dyn_smem_oob")(1, 1, (np.zeros(1, f32),), shared_mem=1024)
    _ok_after(mod)


@pytest.mark.timeout(60)
def test_infinite_loop_times_out(crash_mod):
    with pytest.raises(SimTimeout, match="spin_forever did not finish"):
        crash_mod.get_function("spin_forever")(1, 1, (np.zeros(1, i32),), timeout=1.0)
    _ok_after(crash_mod)


def test_read_only_array_not_written_back(crash_mod):
    x = np.zeros(1024, f32)
    x.flags.writeable = False
    with pytest.raises(SimCrash, match="read-only parameter 0 'x'"):
        crash_mod.get_function("oob_write")(1, 1, (x, i32(1)))


# ---------------------------------------------------------------------------
# build step
# ---------------------------------------------------------------------------
def test_compile_error_names_the_cu_file():
    with pytest.raises(SimCompileError, match=r"broken\.cu:5:.*undefined_identifier_in_broken_kernel"):
        SimModule(FIXTURES / "broken.cu")


def test_unsupported_extern_shared_form_refused():
    with pytest.raises(SimCompileError, match=r"badshared\.cu:3: unsupported dynamic shared memory"):
        SimModule(FIXTURES / "badshared.cu")


def test_kernel_names_and_signatures(st):
    names = kernel_names(CUDA_SRC / "selftest.cu")
    assert names[:3] == ["block_reduce_sum", "two_barrier_scale", "warp_reduce"]
    assert st.kernel_names == names
    assert st.get_function("scalar_kinds").param_types == [
        "long long*", "float*", "int", "unsigned int", "long long", "unsigned long", "float", "double"]
    assert st.get_function("bf16_arith").param_types[0] == "const __nv_bfloat16*"


def test_rewrite_keeps_line_numbers():
    from cupyglm.kernels.sim_build import rewrite_dynamic_shared

    src = "a\nextern __shared__ __align__(16) unsigned char smem[];\nb // extern __shared__ float c[], d[];\n"
    out = rewrite_dynamic_shared(src)
    assert out.count("\n") == src.count("\n")
    assert "unsigned char* const smem = (unsigned char*)::cuemu::dynamic_smem();" in out


def test_shared_in_inline_template_and_namespace_scope(tmp_path):
    src = tmp_path / "inl.cu"
    src.write_text(
        '#include "common.cuh"\n'
        "__device__ __forceinline__ float helper(float v) {\n"
        "  __shared__ float s[32];\n"
        "  s[threadIdx.x] = v;\n"
        "  __syncthreads();\n"
        "  return s[(threadIdx.x + 1) % 32];\n"
        "}\n"
        "template <int N> __device__ float tmpl(float v) { __shared__ float t[N]; t[threadIdx.x % N] = v; return t[0]; }\n"
        "__shared__ unsigned gshared[4];\n"
        'extern "C" __global__ void k(float* y, unsigned* g) {  // [32] f32, [1] u32\n'
        "  const float v = helper(y[threadIdx.x]);\n"
        "  __syncthreads();\n"
        "  y[threadIdx.x] = v + tmpl<1>(0.0f);\n"
        "  g[0] = gshared[0];\n"
        "}\n"
    )
    y = np.arange(32, dtype=f32)
    g = np.zeros(1, u32)
    SimModule(src).get_function("k")(1, 32, (y, g))
    np.testing.assert_array_equal(y, (np.arange(32) + 1) % 32)
    assert g[0] == 0xFFFFFFFF

