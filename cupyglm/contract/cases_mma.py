"""Contract cases of cuda_src/mma_probe.cu: the tensor-core primitive (cuda_src/mma.cuh) against the CPU model
(backend/tensor_core.py, the architecture the emulator is built for). A tile product (K = 16) and k-chains; the
inputs mix wide exponent spreads, cancelling pairs and bf16 subnormals so the model's cut and truncation show.
One case loads A's fragments through shared memory with ldmatrix.x4.

Controls: -DCONTROL_TRANSPOSED_FRAGMENT (A's fragment loaded from the transposed tile), -DCONTROL_CHAIN_REVERSED
(the k blocks in descending order), -DCONTROL_IEEE_SUM (an fp32 IEEE sum in place of the mma).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend import tensor_core as tc
from cupyglm.backend.lanes import bf16
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import mma_probe
from cupyglm.kernels.sim_build import TC_ARCH

KERNELS = ("mma_probe_chain",)


def adversarial(rng, m: int, n: int, k: int):
    """(a [m,k] bf16, b [k,n] bf16, c [m,n] f32): spread exponents, cancelling column pairs, subnormal rows."""
    a = rng.standard_normal((m, k)).astype(np.float32) * np.exp2(rng.integers(-12, 12, (m, k))).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a[:, 1::2] = a[:, 0::2]                          # each pair of k ...
    b[1::2, : n // 2] = -b[0::2, : n // 2]           # ... cancels in the left half of the columns
    a[m - 2:] = np.exp2(rng.integers(-133, -118, (2, k))).astype(np.float32)
    c = (rng.standard_normal((m, n)) * np.exp2(rng.integers(-20, 20, (m, n)))).astype(np.float32)
    c[::3] = 0
    return bf16(a), bf16(b), c


def _case(label: str, m: int, n: int, k: int, control: str, ldm: bool = False) -> Case:
    def make(rng):
        a, b, c = adversarial(rng, m, n, k)
        return {"a": a, "b": b, "c": c}

    def launch(kn, dd):
        return {"d": mma_probe.mma_chain(kn, dd["a"], dd["b"], dd["c"], ldmatrix=ldm)}

    def replay(dd):
        return {"d": tc.mma_chain(dd["a"], dd["b"], dd["c"], arch=TC_ARCH)}

    return case(Case(f"mma_probe[{label}]", KERNELS, make, launch, replay,
                     lambda kn, dd: launch(kn.variant(control), dd)))


#      label        M   N    K  control                        ldmatrix
_case("tile",      16,  8,  16, "CONTROL_TRANSPOSED_FRAGMENT")
_case("chain",     32, 16,  64, "CONTROL_CHAIN_REVERSED")
_case("ieee",      16, 24, 128, "CONTROL_IEEE_SUM")
_case("ldmatrix",  32, 16,  48, "CONTROL_CHAIN_REVERSED",       True)
