"""What one decode step must read from HBM, per rank, and the time that takes at the HBM roofline.

    python bench/roofline.py [--config glm-5.3-flash] [--tp 2 8] [--batch 1 16] [--context 4096 32768]
                             [--hbm-gbs 4800] [--quant fp8 nvfp4]

Bytes per decode step of B sequences at context L on one rank of TP (weights are read once per step for all
rows; everything else once per row):
  weights   every tensor of the rank's shard (cupyglm.memory.weight_arrays) except: the embedding (B rows),
            the routed experts (the expected distinct experts of B tokens' top-k: E (1 - (1 - k/E)^B) of E)
  dsa kv    per DSA layer and row: the visible pooled keys the indexer scores (L / kpool rows of I bf16) and the
            picked latent rows attention reads (min(L, index_topk) rows of R bf16)
  kda state per KDA layer and row: the recurrent state read and written back (fp32), the conv window
With --quant the quantised projections (those of the FP8 release) count their stored bytes, packed values +
scales (cupyglm.memory.weight_arrays with the format's layout); `bf16` is the unquantised model.
The roofline time is bytes / HBM bandwidth. `predicted` divides each class by the fraction of the bandwidth the
design expects that kernel class to reach (DESIGN: streaming GEMV with 16-byte loads and several rows per
weight read; attention/indexer reading each row once for all heads) -- a prediction to check on a GPU
(launch/gpu-check prints the achieved figures), not a measurement.
"""
from __future__ import annotations

import argparse
import re

import numpy as np

from cupyglm.checkpoint.quant import layout_for
from cupyglm.config import preset
from cupyglm.memory import Storage, weight_arrays

# fraction of HBM bandwidth each kernel class is expected to reach once the decode-speed kernels are in; the
# gemv classes are cuda_src/gemv.cu / gemv_swiglu.cu (see gemv_call below for the bytes one call moves)
EXPECTED = {"gemv (dense)": 0.80, "gemv (experts)": 0.70, "lm_head": 0.85, "dsa kv": 0.60, "kda state": 0.70,
            "small (norms, hc, router)": 0.30}
LAUNCH_US = 2.5           # the per-launch floor of a captured (graph) step, per kernel
LAUNCHES_PER_LAYER = 10   # issue 15's target

def _class(name: str) -> str:
    name = re.sub(r"\.weight_scale(_inv|_2)?$", ".weight", name)          # a scale reads with its projection
    if "embed_tokens" in name:
        return "embed"
    if ".experts." in name:
        return "gemv (experts)"
    if name.startswith("lm_head"):
        return "lm_head"
    if re.search(r"(norm|hc_|\.gate\.|_bias|A_log|dt_bias|convNd|ape)", name):
        return "small (norms, hc, router)"
    return "gemv (dense)"


# cuda_src/gemv_tile.cuh's block: 16 columns x up to 16 rows, 256 threads, 1 KiB of each column's weights per
# stage (4 x 16-byte weight loads in flight per thread, 16 KiB a block); the quantised forms (gemv_q_tile.cuh)
# stage 2x (FP8) or 4x (NVFP4) the k values with the same loads, so a block keeps 16 KiB in flight too.  A block
# count fills the machine up to what its registers let an SM hold; the bytes in flight then set the expected
# fraction: GEMV_FRACTION once they reach GEMV_NEEDED (3 bf16 dense blocks an SM: H200, 132 SMs, ~6.5 MB, i.e.
# 4.8 TB/s x ~1.35 us of loaded latency), proportionally less below.  Split along N only (never K): the lane-16
# contract allows nothing else.
GEMV_OUTS, GEMV_ROWS, SMS = 16, 16, 132
GEMV_FRACTION = 0.80      # a full machine of streaming 16-byte loads (the "gemv (dense)" class)
GEMV_NEEDED = SMS * 3 * 16384
# (registers a thread, weight bytes in flight a block) of each gemv kernel form: ptxas -v at sm_90 (NVRTC 12.9)
GEMV_KERNELS = {
    ("dense", "bf16"): (80, 16384), ("grouped", "bf16"): (125, 16384), ("grouped swiglu", "bf16"): (98, 16384),
    ("dense", "fp8"): (80, 16384), ("grouped", "fp8"): (107, 16384), ("grouped swiglu", "fp8"): (111, 16384),
    ("dense", "nvfp4"): (80, 16384), ("grouped", "nvfp4"): (116, 16384), ("grouped swiglu", "nvfp4"): (128, 16384),
}


def blocks_per_sm(registers: int) -> int:
    """256-thread blocks an SM holds: 64 K registers (allocated in 8s a thread), at most 2,048 threads."""
    return min(8, 65536 // (256 * (-(-registers // 8) * 8)))


def gemv_call(n: int, k: int, rows: int, weights: int = 1, out_bytes: int = 4, slices: float = 1.0,
              stored: float | None = None, form: str = "dense", fmt: str = "bf16") -> dict:
    """Bytes one gemv call moves for `rows` decode/verify rows per weight slice against `weights` [N, K]
    matrices (2: the fused gate/up), over `slices` slices (the experts a grouped call touches): HBM weight reads
    (`stored` bytes a matrix, values + scales; bf16 2 N K; once per 16 rows), x rows re-read by each 16-column
    block (L2-resident), y written; and the HBM fraction expected from the bytes the resident blocks keep in
    flight."""
    groups = -(-rows // GEMV_ROWS)
    cols = -(-n // GEMV_OUTS)
    blocks = cols * groups * slices
    regs, inflight = GEMV_KERNELS[(form, fmt)]
    resident = min(blocks, SMS * blocks_per_sm(regs))
    per_matrix = n * k * 2 if stored is None else stored
    return {"weights (HBM)": slices * weights * per_matrix * groups, "x (L2)": slices * cols * rows * k * 2,
            "y": slices * rows * n * out_bytes, "blocks": blocks, "resident": resident,
            "fraction": GEMV_FRACTION * min(1.0, resident * inflight / GEMV_NEEDED)}


def _stored(cfg, tp: int, fmt: str) -> dict[str, int]:
    """Stored bytes of each rank's projection (values + scales) in the format, by its .weight name."""
    storage = Storage(np.dtype(np.uint16))
    out: dict[str, int] = {}
    for a in weight_arrays(cfg, tp, quant=layout_for(cfg, fmt) if fmt != "bf16" else None):
        base = re.sub(r"\.weight_scale(_inv|_2)?$", ".weight", a.name)
        out[base] = out.get(base, 0) + a.nbytes(storage)
    return out


def _gemv_shapes(cfg, tp: int) -> dict[str, tuple[str, int, int, int, int, str]]:
    """(name, N, K, weights, out bytes, form) of the rank's decode GEMMs that dominate the bytes: the largest
    dense projection of a layer, the experts' gate/up (fused) and down, the lm_head slice."""
    arrays = {a.name: a for a in weight_arrays(cfg, tp)}
    out = {}
    dense = [a for name, a in arrays.items() if _class(name) == "gemv (dense)" and len(a.shape) == 2
             and not name.startswith("lm_head")]
    if dense:
        big = max(dense, key=lambda a: a.shape[0] * a.shape[1])
        out[f"dense {big.name.split('.layers.')[-1].replace('.weight', '')}"] = (big.name, *big.shape, 1, 2, "dense")
    gate = next((a for name, a in arrays.items() if name.endswith("experts.0.gate_proj.weight")), None)
    down = next((a for name, a in arrays.items() if name.endswith("experts.0.down_proj.weight")), None)
    if gate is not None:
        out["experts gate+up (fused, grouped)"] = (gate.name, *gate.shape, 2, 2, "grouped swiglu")
    if down is not None:
        out["experts down (grouped)"] = (down.name, *down.shape, 1, 4, "grouped")
    head = arrays.get("lm_head.weight")
    if head is not None:
        out["lm_head"] = (head.name, *head.shape, 1, 4, "dense")
    return out


def print_gemv_table(cfg, tp: int, batch: list[int], bw: float, fmts: list[str] = ("bf16",)) -> None:
    """The gemv kernels' traffic per call for the decode GEMMs that carry the bytes, at each batch (decode rows)
    and weight format (a projection the format leaves unquantised reads bf16 through gemv.cu)."""
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    stored = {f: _stored(cfg, tp, f) for f in fmts}
    bf16 = _stored(cfg, tp, "bf16")
    print(f"  gemv per call, TP={tp} (grouped: the experts a step touches, their rows each; fp8 / nvfp4: "
          f"gemv_q.cu, packed values + scales):")
    for label, (name, n, kk, nw, ob, form) in _gemv_shapes(cfg, tp).items():
        for b in batch:
            slices = e * (1 - (1 - k / e) ** b) if form != "dense" else 1.0
            rows = max(1, round(b * k / slices)) if form != "dense" else b
            for f in fmts:
                fq = f if stored[f][name] != bf16[name] else "bf16"
                g = gemv_call(n, kk, rows, nw, ob, slices, stored[f][name], form, fq)
                t = g["weights (HBM)"] / (g["fraction"] * bw) * 1e6
                shown = f if fq == f else f"{f}: bf16"
                print(f"    {label:<34} {shown:<11} N {n:>5} K {kk:>5} rows {b:>2}: weights "
                      f"{g['weights (HBM)'] / 1e6:7.2f} MB HBM, x {g['x (L2)'] / 1e6:6.2f} MB L2, "
                      f"y {g['y'] / 1e3:6.1f} KB; {g['blocks']:>6.0f} blocks ({g['resident']:>4.0f} resident), "
                      f"expected {g['fraction']:.0%} of HBM -> {t:6.1f} us")


def print_gemv_token(cfg, tp: int, bw: float, fmts: list[str]) -> None:
    """Bytes one decode token (batch 1) reads through the gemv kernels (dense projections, the touched experts,
    the lm_head), per format, and the time at the roofline."""
    for f in fmts:
        parts = step_bytes(cfg, tp, 1, 4096, None if f == "bf16" else f)
        n = sum(v for c, v in parts.items() if c in ("gemv (dense)", "gemv (experts)", "lm_head"))
        print(f"  gemv weights a decode token reads, TP={tp} {f:<5}: {n / 1e9:.3f} GB, roofline "
              f"{n / bw * 1e3:.3f} ms")


def step_bytes(cfg, tp: int, batch: int, context: int, quant: str | None = None) -> dict[str, float]:
    """Bytes one decode step reads per rank, by class; quant: "fp8" | "nvfp4" | None (bf16)."""
    storage = Storage(np.dtype(np.uint16))                   # bf16 in 2 bytes (the cuda backend)
    out: dict[str, float] = {}
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    distinct = e * (1 - (1 - k / e) ** batch) / e             # expected fraction of experts a step touches
    for a in weight_arrays(cfg, tp, quant=layout_for(cfg, quant) if quant else None):
        cls = _class(a.name)
        n = a.nbytes(storage)
        if cls == "embed":
            n = batch * a.shape[-1] * 2
            cls = "small (norms, hc, router)"
        elif cls == "gemv (experts)":
            n *= distinct
        out[cls] = out.get(cls, 0.0) + n
    pools = context // cfg.index_kpool
    dsa_row = pools * cfg.index_head_dim * 2 + min(context, cfg.index_topk) * cfg.kv_lora_rank * 2
    out["dsa kv"] = batch * len(cfg.dsa_layers) * dsa_row
    h, kd = cfg.kda_num_heads // tp, cfg.kda_head_dim
    kda_row = 2 * h * kd * kd * 4 + (cfg.kda_conv_size - 1) * 3 * h * kd * 2
    out["kda state"] = batch * len(cfg.kda_layers) * kda_row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="glm-5.3-flash")
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--context", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--hbm-gbs", type=float, default=4800.0, help="HBM bandwidth, GB/s (H200: 4,800)")
    ap.add_argument("--quant", nargs="+", choices=("bf16", "fp8", "nvfp4"), default=["bf16"],
                    help="weight formats to compare (default bf16)")
    a = ap.parse_args(argv)
    cfg = preset(a.config)
    bw = a.hbm_gbs * 1e9
    launch_ms = LAUNCH_US * LAUNCHES_PER_LAYER * cfg.num_hidden_layers / 1e3
    for tp, fmt in ((tp, fmt) for tp in a.tp for fmt in a.quant):
        for b in a.batch:
            for ctx in a.context:
                parts = step_bytes(cfg, tp, b, ctx, None if fmt == "bf16" else fmt)
                total = sum(parts.values())
                roof_ms = total / bw * 1e3
                pred = {c: n / (EXPECTED[c] * bw) * 1e3 for c, n in parts.items()}
                pred_ms = sum(pred.values()) + launch_ms
                print(f"{a.config} {fmt} TP={tp} batch {b} context {ctx:,}: {total / 1e9:.3f} GB a step per rank, "
                      f"roofline {roof_ms:.2f} ms ({b / roof_ms * 1e3:,.0f} tok/s); predicted {pred_ms:.2f} ms "
                      f"({b / pred_ms * 1e3:,.0f} tok/s, {roof_ms / pred_ms:.0%} of the roofline)")
                for c in sorted(parts, key=lambda c: -parts[c]):
                    print(f"    {c:<26} {parts[c] / 1e6:>10.1f} MB  roofline {parts[c] / bw * 1e3:7.3f} ms  "
                          f"predicted {pred[c]:7.3f} ms at {EXPECTED[c]:.0%}")
                print(f"    {'launch floor':<26} {'':>10}     {LAUNCHES_PER_LAYER} launches/layer x "
                      f"{LAUNCH_US} us = {launch_ms:.3f} ms")
    for tp in a.tp:
        print_gemv_token(cfg, tp, bw, a.quant)
        print_gemv_table(cfg, tp, a.batch, bw, a.quant)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
