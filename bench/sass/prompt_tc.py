"""A cold prefill's prompt GEMMs on the tensor core (the "after" path of bench/roofline.py): gemm_tc for bf16
weights (dense, per head, grouped experts), gemm_tc_q for NVFP4 / FP8 weights where cuda_src/gemm_tc_q.cu exists,
else a dequantisation pass to bf16 (stored bytes read, 2 N K written, at HBM bandwidth) before gemm_tc. SwiGLU is
two GEMMs and the elementwise swiglu kernel (moe.cu: gate and up read, the product written, at HBM bandwidth).

Every GEMM call: one block per TILE_M x TILE_N output tile (cupyglm/kernels/ops_gemm_tc.py), the tensor core
issuing whole tiles (2 x blocks x TILE_M x TILE_N x K FLOPs); HBM bytes the weights once (per head / expert), x
and y once; L2 bytes model.tile_l2_bytes. Grouped rows sorted by expert: a row tile straddling two experts runs
once per expert (ceil(M / TILE_M) + experts - 1 row-tile passes)."""
from __future__ import annotations

from pathlib import Path

from cupyglm.kernels import ops_gemm_tc as G

from bench.sass import kernels as K
from bench.sass.model import Call, Kernel, analyse, tile_l2_bytes

Q_SRC = Path(__file__).resolve().parents[2] / "cuda_src" / "gemm_tc_q.cu"


def fused_q() -> bool:
    """Whether the quantised tensor-core GEMMs (gemm_tc_q.cu) are in this tree."""
    return Q_SRC.exists()


def quant_note(fmt: str) -> str:
    """How this path prices fmt's weights, for the printout."""
    if fmt == "bf16":
        return "bf16 weights on gemm_tc"
    if fused_q():
        return f"{fmt} weights on gemm_tc_q ({Q_SRC.name})"
    return (f"{fmt} weights: no gemm_tc_q.cu in this tree, priced as a dequantisation pass to bf16 at HBM "
            f"bandwidth + gemm_tc")


def _kernel(fmt: str, grouped: bool) -> Kernel:
    if fmt == "bf16" or not fused_q():
        return getattr(K, "GEMM_TC_GROUPED", K.GEMM_TC) if grouped else K.GEMM_TC
    return Kernel(f"gemm_tc{'_grouped' if grouped else ''}_{fmt}_bf16", Q_SRC.name, "prompt", "flop", 128, fmt)


def memory(nbytes: float) -> Call:
    """A pass priced by its HBM bytes alone (plus its launch)."""
    return Call(None, 0.0, nbytes, 0.0, 1)


def gemm(fmt: str, m: int, n: int, k: int, stored: float, heads: int = 1, experts: float = 0.0,
         arch: str = "sm_90") -> list[tuple[str, Call]]:
    """One matrix [N, K] (`stored` bytes a head / expert) against M prompt rows: per head (`heads`), or grouped
    over `experts` experts (M the routed rows, sorted by expert). ("dequant", Call) first where fmt's weights
    are made bf16 by a pass of their own."""
    dense = not experts and (fmt == "bf16" or not fused_q())   # gemm_tc's staged tile; the rest the direct one
    tm, tn = (G.DENSE_TILE_M, G.DENSE_TILE_N) if dense else (G.TILE_M, G.TILE_N)
    copies = max(heads, round(experts))                       # weight matrices read
    tiles = -(-m // tm) + max(0, round(experts) - 1) if experts else heads * -(-m // tm)
    fused = fmt != "bf16" and fused_q()
    w_bytes = stored / (n * k) if fused else 2.0
    out = []
    if fmt != "bf16" and not fused:
        out.append(("dequant", memory(copies * (stored + 2.0 * n * k))))
    flops = 2.0 * tiles * tm * -(-n // tn) * tn * k
    nbytes = copies * n * k * w_bytes + heads * m * (k + n) * 2.0
    a = analyse(_kernel(fmt, bool(experts)), arch)
    out.append(("gemm", Call(a, flops, nbytes, flops, tiles * -(-n // tn),
                             l2_bytes=tile_l2_bytes(n, k, tm, tn, tiles, w_bytes=w_bytes))))
    return out


def swiglu(fmt: str, m: int, n: int, k: int, stored: float, experts: float = 0.0,
           arch: str = "sm_90") -> list[tuple[str, Call]]:
    """gate and up [N, K] as two GEMMs, then the elementwise swiglu over their M x N bf16 outputs."""
    out = gemm(fmt, m, n, k, stored, experts=experts, arch=arch)
    out += gemm(fmt, m, n, k, stored, experts=experts, arch=arch)
    return out + [("swiglu", memory(3 * 2.0 * m * n))]


def per_head_absorb(cfg, tp: int, m: int, arch: str = "sm_90") -> list[tuple[str, Call]]:
    """kv_b_proj as the absorbed MLA's two per-head GEMMs (model/dsa.py): q_nope [H, M, nope] by w_k_t [H, R, nope]
    into the latent space, the attention's latent output [H, M, R] by w_v [H, V, R] out of it."""
    h, r, nope, v = cfg.num_attention_heads // tp, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim
    return (gemm("bf16", m, r, nope, 2.0 * r * nope, heads=h, arch=arch)
            + gemm("bf16", m, v, r, 2.0 * v * r, heads=h, arch=arch))
