"""A cold prefill's prompt GEMMs, all on the tensor core: gemm_tc for bf16 weights (dense on its staged tile,
per head, grouped experts), gemm_tc_q for NVFP4 / FP8 weights (dense and grouped, cuda_src/gemm_tc_q.cu). SwiGLU
is two GEMMs and the elementwise swiglu kernel (moe.cu: gate and up read, the product written, at HBM bandwidth).

Every GEMM call: one block per TILE_M x TILE_N output tile (cupyglm/kernels/ops_gemm_tc.py, ops_gemm_tc_q.py),
the tensor core issuing whole tiles (2 x blocks x TILE_M x TILE_N x K FLOPs); HBM bytes the weights once (per
head / expert), x and y once; L2 bytes model.tile_l2_bytes. Grouped rows sorted by expert: a row tile straddling
two experts runs once per expert (ceil(M / TILE_M) + experts - 1 row-tile passes)."""
from __future__ import annotations

from cupyglm.kernels import ops_gemm_tc as G
from cupyglm.kernels import ops_gemm_tc_q as GQ

from bench.sass import kernels as K
from bench.sass.model import Call, Kernel, analyse, tile_l2_bytes


def quant_note(fmt: str) -> str:
    """How this path prices fmt's weights, for the printout."""
    return "bf16 weights on gemm_tc" if fmt == "bf16" else f"{fmt} weights on gemm_tc_q (gemm_tc_q.cu)"


def _kernel(fmt: str, grouped: bool) -> tuple[Kernel, tuple[int, int]]:
    """The kernel of a GEMM and its output tile (rows, columns)."""
    if fmt != "bf16":
        return K.gemm_tc_q(fmt, grouped), (GQ.TILE_M, GQ.TILE_N)
    return (K.GEMM_TC_GROUPED if grouped else K.GEMM_TC), (G.DENSE_TILE_M, G.DENSE_TILE_N)


def memory(nbytes: float) -> Call:
    """A pass priced by its HBM bytes alone (plus its launch)."""
    return Call(None, 0.0, nbytes, 0.0, 1)


def gemm(fmt: str, m: int, n: int, k: int, stored: float, heads: int = 1, experts: float = 0.0,
         arch: str = "sm_90") -> list[tuple[str, Call]]:
    """One matrix [N, K] (`stored` bytes a head / expert) against M prompt rows: per head (`heads`), or grouped
    over `experts` experts (M the routed rows, sorted by expert)."""
    kernel, (tm, tn) = _kernel(fmt, bool(experts))
    copies = max(heads, round(experts))                       # weight matrices read
    tiles = -(-m // tm) + max(0, round(experts) - 1) if experts else heads * -(-m // tm)
    w_bytes = stored / (n * k)                                # values and scales, as the tiles load them
    flops = 2.0 * tiles * tm * -(-n // tn) * tn * k
    nbytes = copies * stored + heads * m * (k + n) * 2.0
    return [("gemm", Call(analyse(kernel, arch), flops, nbytes, flops, tiles * -(-n // tn),
                          l2_bytes=tile_l2_bytes(n, k, tm, tn, tiles, w_bytes=w_bytes)))]


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
