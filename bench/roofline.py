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

# fraction of HBM bandwidth each kernel class is expected to reach once the decode-speed kernels are in
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
