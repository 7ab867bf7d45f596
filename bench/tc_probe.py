"""The tensor core against its CPU model: random and adversarial inputs (cancellation, wide exponent spread,
subnormals, ties on the truncation boundary) through cuda_src/mma_probe.cu (the real mma.m16n8k16 on cuda, the
emulator on sim; A's fragments from global memory and through ldmatrix, each counted) and through
backend/tensor_core.py, bit for bit; then the PTX fragment layouts (identity tiles),
row invariance (each 16-row slice alone equals its rows of the whole) and determinism (a second run).

    python bench/tc_probe.py [--backend cuda|sim] [--arch sm_90] [--m 64] [--n 64] [--k 256] [--seed 0]

The model is the device's architecture on cuda (--arch overrides), the emulator's on sim. Prints one line per
input set, then `RESULT tc_probe ok|FAIL <backend> <arch>: <mismatches>/<elements> bits differ ...`; exit 0 only
when ok. Where no model exists for the device, the line says so and only layout, invariance and determinism count.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from cupyglm.backend import tensor_core as tc
from cupyglm.backend.lanes import bf16, to_bits
from cupyglm.contract.cases_mma import adversarial
from cupyglm.kernels import mma_probe
from cupyglm.kernels.ops import Kernels


def input_sets(rng, m: int, n: int, k: int) -> dict:
    """name -> (a [m,k] bf16, b [k,n] bf16, c [m,n] f32)."""
    def norm(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    sets = {"random": (bf16(norm(m, k)), bf16(norm(k, n)), norm(m, n))}
    sets["cancellation"] = adversarial(rng, m, n, k)
    spread = np.exp2(rng.integers(-60, 60, (m, k))).astype(np.float32)
    sets["spread"] = (bf16(norm(m, k) * spread), bf16(norm(k, n)), norm(m, n) * np.float32(2.0 ** 40))
    sub = np.exp2(rng.integers(-133, -120, (m, k))).astype(np.float32) * rng.choice([-1, 1], (m, k)).astype(np.float32)
    sets["subnormal"] = (bf16(sub), bf16(norm(k, n)), (norm(m, n) * np.float32(2.0 ** -135)).astype(np.float32))
    # products 1, 2^-24, 1.5 * 2^-24 and 2^-25 beside accumulators of 1: sums on and beside the cut and on fp32 ties
    ta = rng.choice(np.array([1.0, 2.0 ** -12, -(2.0 ** -12), 1.5 * 2.0 ** -12], np.float32), (m, k))
    tb = rng.choice(np.array([1.0, 2.0 ** -12, 2.0 ** -13], np.float32), (k, n))
    sets["ties"] = (bf16(ta), bf16(tb), np.ones((m, n), np.float32))
    return sets


class Probe:
    def __init__(self, backend: str):
        self.backend = backend
        if backend == "cuda":
            import cupy
            self.xp = cupy
        else:
            self.xp = np
        self.k = Kernels(backend, self.xp)

    def run(self, a, b, c, ldm: bool = False) -> np.ndarray:
        xp = self.xp
        if xp is np:
            return np.asarray(mma_probe.mma_chain(self.k, a, b, c, ldmatrix=ldm))
        d = mma_probe.mma_chain(self.k, xp.asarray(to_bits(a)), xp.asarray(to_bits(b)), xp.asarray(c), ldmatrix=ldm)
        return xp.asnumpy(d)


def bits(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def layout_ok(p: Probe, ldm: bool) -> bool:
    """Identity tiles: A = I gives B, B = [I; 0] / [0; I] give A's halves, A = 0 gives C (A through ldmatrix
    when ldm)."""
    vals = bf16(np.arange(1, 129, dtype=np.float32).reshape(16, 8))
    a = bf16(np.arange(256, dtype=np.float32).reshape(16, 16))
    eye = np.eye(8, dtype=np.float32)
    zero8 = np.zeros((8, 8), np.float32)
    z = np.zeros((16, 8), np.float32)
    c = np.arange(128, dtype=np.float32).reshape(16, 8) - 60.5
    checks = [(p.run(bf16(np.eye(16, dtype=np.float32)), vals, z, ldm), vals.astype(np.float32)),
              (p.run(a, bf16(np.vstack([eye, zero8])), z, ldm), a[:, :8].astype(np.float32)),
              (p.run(a, bf16(np.vstack([zero8, eye])), z, ldm), a[:, 8:].astype(np.float32)),
              (p.run(bf16(np.zeros((16, 16), np.float32)), vals, c, ldm), c)]
    return all(np.array_equal(bits(got), bits(want)) for got, want in checks)


def rows_ok(p: Probe, a, b, c, whole: np.ndarray) -> bool:
    """Each 16-row slice alone gives its rows of the whole call, and a second whole run gives the same bits."""
    for r0 in range(0, a.shape[0], 16):
        part = p.run(np.ascontiguousarray(a[r0:r0 + 16]), b, np.ascontiguousarray(c[r0:r0 + 16]))
        if not np.array_equal(bits(part), bits(whole[r0:r0 + 16])):
            return False
    return np.array_equal(bits(p.run(a, b, c)), bits(whole))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    ap.add_argument("--arch", help="the model to compare with (default: the device's on cuda, the emulator's on sim)")
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.m % 16 or a.n % 8 or a.k % 16:
        ap.error("--m, --n and --k must be multiples of 16, 8 and 16")
    from cupyglm.backend.arithmetic import tc_arch
    from cupyglm.kernels.sim_build import TC_ARCH
    arch = a.arch or (tc_arch("cuda") if a.backend == "cuda" else TC_ARCH)
    model = tc.model_for(arch)
    p = Probe(a.backend)
    bad = total = 0
    rows = True
    for name, (x, y, c) in input_sets(np.random.default_rng(a.seed), a.m, a.n, a.k).items():
        got = p.run(x, y, c)
        rows = rows_ok(p, x, y, c, got) and rows
        if model is None:
            print(f"{name:>13}: no model for {arch}; rows {'ok' if rows else 'DIFFER'}")
            continue
        want = tc.mma_chain(x, y, c, arch=arch)
        miss = int((bits(got) != bits(want)).sum()) + int((bits(p.run(x, y, c, ldm=True)) != bits(want)).sum())
        ieee = int((bits(got) != bits((x.astype(np.float64) @ y.astype(np.float64) + c).astype(np.float32))).sum())
        bad, total = bad + miss, total + 2 * got.size
        print(f"{name:>13}: {miss}/{2 * got.size} bits differ from the {arch} model ({ieee} from an fp64 sum rounded to fp32)")
    layout = layout_ok(p, False) and layout_ok(p, True)
    ok = bad == 0 and layout and rows
    seen = f"{bad}/{total} bits differ" if model is not None else f"no model for {arch}"
    print(f"RESULT tc_probe {'ok' if ok else 'FAIL'} {a.backend} {arch}: {seen}; layout {'ok' if layout else 'WRONG'}; "
          f"row invariance and determinism {'ok' if rows else 'BROKEN'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
