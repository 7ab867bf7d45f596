"""cupyglm-contract: run the kernel contract (every registered kernel case, its replay, its planted control).

    cupyglm-contract --backend sim|cuda [--kernels PATTERN] [--order forward|reverse|shuffled|all]

Prints one line per case and a SUMMARY line; exits 1 on any failure or missed control, 2 on bad usage.
"""
from __future__ import annotations

import argparse
import sys

from cupyglm.contract.check import ORDERS, run_contract


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cupyglm-contract", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("sim", "cuda"), default="sim")
    p.add_argument("--kernels", default=None, metavar="PATTERN",
                   help="cases whose name or kernel matches (glob, or substring; comma-separated; !PATTERN leaves "
                        "those out)")
    p.add_argument("--order", choices=(*ORDERS, "all"), default="forward",
                   help="emulator thread order (sim); all = each of forward, reverse, shuffled, and identical "
                        "outputs across them")
    a = p.parse_args(argv)
    orders = ORDERS if a.order == "all" else (a.order,)
    if a.backend == "cuda":
        from cupyglm.backend import cuda_available
        if not cuda_available():
            print("cupyglm-contract: --backend cuda: no CUDA device (cupy missing or no GPU)", file=sys.stderr)
            return 2
        if a.order != "forward":
            print("note: thread orders apply to the sim backend only; cuda runs each case once per order",
                  file=sys.stderr)
    rep = run_contract(a.backend, a.kernels, orders, out=lambda s: print(s, flush=True))
    if not rep.results:
        print(f"cupyglm-contract: no case matches {a.kernels!r}", file=sys.stderr)
        return 1
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
