"""Decode tok/s and cold prefill time of the full model on the H200, predicted from the compiled kernels
(bench/sass_model.py: each call's max(issue, memory, tensor bound) + launch + collective), beside the byte
roofline and the original system's figures.

    python bench/roofline.py [--config glm-5.3-flash] [--tp 2 8] [--batch 1 4 16] [--context 4096 131072]
                             [--prefill 32768 131072] [--quant ...] [--arch sm_90] [--parts]

TP=2 runs NVFP4 (the only format whose weights fit two 96 GB cards), TP=8 bf16 and fp8, unless --quant names the
formats. Per rank and step:
  byte roofline  every byte the step reads (step_bytes below) / HBM bandwidth (bench/sass/hw.py)
  predicted      the sum of the step's calls (bench/sass/step.py: every projection as a GEMV of its form and
                 format, the touched experts grouped, attention + indexer on the DSA layers, the KDA state, two
                 norms a layer; all-reduces after o_proj and the MoE) from their SASS hot-loop counts
A cold prefill is one pass of all its tokens through the prompt kernels (lm_head on the last row), predicted on
the tensor core: the GEMMs of bench/sass/prompt_tc.py (gemm_tc dense / per-head / grouped, gemm_tc_q dense /
grouped for NVFP4 / FP8, SwiGLU as two GEMMs and the elementwise kernel), attention_tc, the indexer and the KDA
recurrence, each call the largest of its issue / HBM / L2 / tensor bounds (bench/sass/model.py). Its roofline is
the larger of the bytes it needs at HBM bandwidth and the FLOPs it needs at the tensor peak (step.prefill_need:
the model's work, not the tiles a kernel pads to). --parts adds the largest parts and the largest calls with the
bound that limits them.
Bytes per decode step of B sequences at context L on one rank (step_bytes): the rank's weights once (the
routed experts: the expected distinct experts of B tokens' top-k, E (1 - (1 - k/E)^B) of E; the embedding B
rows); per DSA layer and row the scored pooled keys (L / kpool rows of I bf16) and the picked latent rows
(min(L, index_topk) of R bf16); per KDA layer and row its fp32 state read and written and its conv window.
"""
from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cupyglm.checkpoint.quant import layout_for  # noqa: E402
from cupyglm.config import preset  # noqa: E402
from cupyglm.memory import Storage, weight_arrays  # noqa: E402

from bench.sass import hw, prompt_tc, step  # noqa: E402
from bench.sass.model import bounds  # noqa: E402

# the original system, at TP=2 on two RTX PRO 6000 cards
ORIGINAL = {"decode tok/s": "262 / 145", "cold 32K TTFT s": 7.85}
DEFAULT_FORMATS = {2: ("nvfp4",), 8: ("bf16", "fp8")}


@functools.lru_cache(maxsize=None)
def _arrays(cfg, tp: int, quant: str | None) -> tuple:
    """The rank's weight arrays (cupyglm.memory) in a format; quant None: bf16."""
    return tuple(weight_arrays(cfg, tp, quant=layout_for(cfg, quant) if quant else None))


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


def _stored(cfg, tp: int, fmt: str) -> dict[str, int]:
    """Stored bytes of each rank's projection (values + scales) in the format, by its .weight name."""
    storage = Storage(np.dtype(np.uint16))
    out: dict[str, int] = {}
    for a in _arrays(cfg, tp, None if fmt == "bf16" else fmt):
        base = re.sub(r"\.weight_scale(_inv|_2)?$", ".weight", a.name)
        out[base] = out.get(base, 0) + a.nbytes(storage)
    return out


def step_bytes(cfg, tp: int, batch: int, context: int, quant: str | None = None) -> dict[str, float]:
    """Bytes one decode step reads per rank, by class; quant: "fp8" | "nvfp4" | None (bf16)."""
    storage = Storage(np.dtype(np.uint16))                   # bf16 in 2 bytes (the cuda backend)
    out: dict[str, float] = {}
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    distinct = e * (1 - (1 - k / e) ** batch) / e             # expected fraction of experts a step touches
    for a in _arrays(cfg, tp, quant):
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


def decode(cfg, tp: int, fmt: str, batch: int, context: int, arch: str = "sm_90") -> dict:
    """The byte roofline and the predicted step of one rank: times (ms), tok/s, the predicted time by part."""
    nbytes = sum(step_bytes(cfg, tp, batch, context, None if fmt == "bf16" else fmt).values())
    calls, small = step.decode_calls(cfg, tp, fmt, batch, context, arch)
    us, parts = step.total_us(calls, small)
    roof_ms = nbytes / hw.HBM_BYTES_S * 1e3
    return {"bytes": nbytes, "roofline_ms": roof_ms, "roofline_tok_s": batch / roof_ms * 1e3,
            "predicted_ms": us / 1e3, "predicted_tok_s": batch / us * 1e6,
            "parts_ms": {k: v / 1e3 for k, v in parts.items()}}


def prefill(cfg, tp: int, fmt: str, tokens: int, arch: str = "sm_90") -> dict:
    """A cold prefill of `tokens` on one rank: predicted and roofline seconds, the FLOPs it needs, the predicted
    time by part and by call kind (label, kernel, bound)."""
    calls, small = step.prefill_calls(cfg, tp, fmt, tokens, arch)
    us, parts = step.total_us(calls, small)
    nbytes, flops = step.prefill_need(cfg, tp, fmt, tokens, arch)
    roof = max(nbytes / hw.HBM_BYTES_S, flops / hw.TENSOR_BF16_FLOPS)
    kinds: dict[tuple, float] = {}
    for label, c in calls:
        b = bounds(c)
        key = (label, c.analysis.kernel.name if c.analysis else "(HBM bytes)", b["bound"])
        kinds[key] = kinds.get(key, 0.0) + b["predicted_us"] / 1e6
    return {"predicted_s": us / 1e6, "roofline_s": roof, "flops": flops,
            "parts_s": {k: v / 1e6 for k, v in parts.items()}, "calls_s": kinds}


def print_prefill(cfg, tp: int, fmt: str, tokens: int, arch: str, parts: bool) -> None:
    """One prompt length: the predicted prefill on the tensor core, the roofline, and the KDA recurrence's share."""
    p = prefill(cfg, tp, fmt, tokens, arch)
    kda = p["parts_s"].get("kda state", 0.0)
    print(f"{tp:>3} {fmt:<6} cold prefill {tokens:>7,} tokens: predicted (tensor core) {p['predicted_s']:6.2f} s, "
          f"roofline {p['roofline_s']:6.3f} s ({p['flops'] / 1e15:.1f} PFLOP a rank); KDA recurrence {kda:.2f} s "
          f"({kda / p['predicted_s']:.0%})")
    if parts:
        print(f"{'':>10} {_top(p['parts_s'], ' s', 5)}; {prompt_tc.quant_note(fmt)}")
        for (label, kernel, bound), t in sorted(p["calls_s"].items(), key=lambda kv: -kv[1])[:8]:
            print(f"{'':>12} {label:<30} {kernel:<26} {t:7.3f} s  {bound}-bound")


def _top(parts: dict[str, float], unit: str, n: int = 3) -> str:
    return ", ".join(f"{k} {v:.2f}{unit}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])[:n])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="glm-5.3-flash")
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--context", type=int, nargs="+", default=[4096, 131072])
    ap.add_argument("--prefill", type=int, nargs="*", default=[32768, 131072],
                    help="cold prompt lengths (none: decode only)")
    ap.add_argument("--quant", nargs="+", choices=("bf16", "fp8", "nvfp4"),
                    help="weight formats (default: nvfp4 at TP=2, bf16 and fp8 at TP=8, bf16 otherwise)")
    ap.add_argument("--arch", default="sm_90", help="the architecture the kernels are compiled for")
    ap.add_argument("--parts", action="store_true", help="print the three largest parts of each prediction")
    a = ap.parse_args(argv)
    cfg = preset(a.config)
    print(f"{a.config} on H200 ({hw.SMS} SMs, HBM {hw.HBM_BYTES_S / 1e12:.1f} TB/s, launch {hw.LAUNCH_US} us, "
          f"all-reduce {hw.COLLECTIVE_US} us); original system, TP=2 on two RTX PRO 6000: decode "
          f"{ORIGINAL['decode tok/s']} tok/s, cold 32K TTFT {ORIGINAL['cold 32K TTFT s']} s")
    print(f"{'TP':>3} {'format':<6} {'batch':>5} {'context':>8} {'GB/step':>8} {'roofline tok/s':>15} "
          f"{'predicted ms':>13} {'predicted tok/s':>16} {'of roofline':>11}")
    for tp in a.tp:
        for fmt in a.quant or DEFAULT_FORMATS.get(tp, ("bf16",)):
            for b in a.batch:
                for ctx in a.context:
                    d = decode(cfg, tp, fmt, b, ctx, a.arch)
                    print(f"{tp:>3} {fmt:<6} {b:>5} {ctx:>8,} {d['bytes'] / 1e9:>8.3f} {d['roofline_tok_s']:>15,.0f} "
                          f"{d['predicted_ms']:>13.2f} {d['predicted_tok_s']:>16,.1f} "
                          f"{d['roofline_ms'] / d['predicted_ms']:>11.1%}")
                    if a.parts:
                        print(f"{'':>10} {_top(d['parts_ms'], ' ms')}")
            for n in a.prefill:
                print_prefill(cfg, tp, fmt, n, a.arch, a.parts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
