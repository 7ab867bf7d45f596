"""Every `extern "C" __global__` kernel in cuda_src/*.cu (selftest.cu aside: the emulator's own tests cover
it) is exercised by a registered contract Case, and every kernel a Case names exists."""
from __future__ import annotations

import pytest

from cupyglm.contract import registry
from cupyglm.kernels import CUDA_SRC, kernel_names

# The framework's kernels (this file's owner); they must be covered now, whatever else is in progress.
FRAMEWORK = {
    "gemm_tc.cu": {"gemm_tc"},
    "norm.cu": {"rmsnorm_rows", "layernorm_rows"},
    "kv.cu": {"kv_write_rows", "kv_read_rows"},
    "pick.cu": {"dsa_pick", "dsa_pick_merge"},
}


def _source_kernels() -> dict[str, str]:
    out = {}
    for path in sorted(CUDA_SRC.glob("*.cu")):
        if path.name == "selftest.cu":
            continue
        for name in kernel_names(path):
            assert name not in out, f"kernel {name} defined in both {out.get(name)} and {path.name}"
            out[name] = path.name
    return out


def _registered() -> set[str]:
    return {k for c in registry.load_all() for k in c.kernels}


def test_framework_kernels_exist_and_are_registered():
    src = _source_kernels()
    reg = _registered()
    for fname, names in FRAMEWORK.items():
        for n in names:
            assert src.get(n) == fname, f"{n} is not a kernel of cuda_src/{fname}"
            assert n in reg, f"{fname}: kernel {n} has no contract case"


def test_every_kernel_in_cuda_src_is_registered():
    src = _source_kernels()
    missing = sorted(f"{f}:{n}" for n, f in src.items() if n not in _registered())
    assert not missing, "kernels with no contract case (register them in cupyglm/contract/cases_*.py): " + \
        ", ".join(missing)


def test_every_registered_kernel_exists():
    src = _source_kernels()
    unknown = sorted(_registered() - set(src))
    assert not unknown, f"contract cases name kernels that cuda_src/ does not define: {unknown}"


@pytest.mark.parametrize("c", registry.load_all(), ids=lambda c: c.name)
def test_case_is_well_formed(c):
    assert c.kernels, f"{c.name}: names no kernel"
    assert c.ulps == 0 or c.why_ulps, f"{c.name}: {c.ulps} ulps allowed without a reason"


def test_kernels_declared_with_launch_bounds_are_found_by_name():
    """`extern "C" __global__ void __launch_bounds__(N) name(...)`: discovery takes the name, not the qualifier."""
    from cupyglm.kernels import CUDA_SRC, kernel_names

    names = {n for f in CUDA_SRC.glob("*.cu") for n in kernel_names(f)}
    assert {"gemm_tc", "gemm_tc_grouped", "sample_rows"} <= names
    assert "__launch_bounds__" not in names
