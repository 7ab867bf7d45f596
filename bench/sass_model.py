"""The speed model read from the compiled kernels: every decode / prompt kernel compiled as the cuda backend
compiles it (NVRTC, sm_90 unless --arch), its hot loop counted from the SASS (cuobjdump), and its time at the
model's shapes on one H200: max(issue, memory, L2, tensor bound) + launch (bench/sass/model.py states the rules).

    python bench/sass_model.py [--config glm-5.3-flash] [--tp 2] [--rows 1 16] [--m 2048] [--context 4096]
                               [--arch sm_90] [--json]
    python bench/sass_model.py --gemm M N K [--arch sm_90] [--json]

--json prints a list, one object per kernel and shape (kernel, role, rows, dtype, instr_per_unit,
tensor_instr_per_unit, issue_bound_us, memory_bound_us, l2_bound_us, tensor_bound_us, predicted_us, bound,
tensor_peak_pct (the call's FLOPs at the predicted time against the dense bf16 tensor peak), and the counts
behind them); without it a table. --gemm prints only the dense bf16 prompt GEMM at that shape on the tensor
core (gemm_tc.cu). Units: a weight for the decode GEMVs, a FLOP for GEMMs, attention and
the indexer, a state element for KDA. Disassemblies are cached by cubin hash under the cupyglm cache directory.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cupyglm.config import preset  # noqa: E402

from bench.sass.table import gemm_rows, kernel_rows  # noqa: E402


def print_table(rows: list[dict]) -> None:
    print(f"{'kernel':<34} {'role':<6} {'rows':>5} {'dtype':<5} {'form':<15} {'unit':<6} {'instr/u':>8} "
          f"{'fp/u':>7} {'lds/u':>7} {'reg':>4} {'blk/SM':>6} {'issue us':>10} {'mem us':>9} {'l2 us':>9} "
          f"{'pred us':>10} {'%peak':>6} bound")
    for r in rows:
        print(f"{r['kernel']:<34} {r['role']:<6} {r['rows']:>5} {r['dtype']:<5} {r['form']:<15} {r['unit']:<6} "
              f"{r['instr_per_unit']:>8.4f} {r['fp_per_unit']:>7.4f} {r['shared_loads_per_unit']:>7.4f} "
              f"{r['registers']:>4} {r['blocks_per_sm']:>6} {r['issue_bound_us']:>10.1f} "
              f"{r['memory_bound_us']:>9.1f} {r['l2_bound_us']:>9.1f} {r['predicted_us']:>10.1f} "
              f"{r['tensor_peak_pct']:>6.1f} {r['bound']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="glm-5.3-flash")
    ap.add_argument("--tp", type=int, default=2, help="the TP degree whose shard shapes are used")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16], help="decode rows of the decode kernels")
    ap.add_argument("--m", type=int, default=2048, help="prompt rows (tokens) of the prompt kernels")
    ap.add_argument("--context", type=int, default=4096, help="context of the decode attention / indexer")
    ap.add_argument("--arch", default="sm_90", help="the architecture compiled for (sm_90, sm_120); timed with "
                    "the H200 figures of bench/sass/hw.py")
    ap.add_argument("--gemm", type=int, nargs=3, metavar=("M", "N", "K"), default=None,
                    help="only the dense bf16 prompt GEMM at this shape, on the tensor core")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.gemm:
        rows = gemm_rows(*a.gemm, a.arch)
    else:
        rows = kernel_rows(preset(a.config), a.tp, tuple(a.rows), a.m, a.context, a.arch)
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
