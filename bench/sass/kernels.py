"""The kernels of the decode and prompt paths the speed model reads, with their launchers' block sizes
(cupyglm/kernels/ops_*.py). Decode GEMVs are named by (form, dtype); every prompt GEMM runs on the tensor core
(gemm_tc.cu, gemm_tc_q.cu)."""
from __future__ import annotations

from cupyglm.kernels import ops_attention as att
from cupyglm.kernels import ops_attention_tc as att_tc
from cupyglm.kernels import ops_gemm_tc, ops_gemm_tc_q, ops_hc
from cupyglm.kernels import ops_indexer as idx
from cupyglm.kernels import ops_kda as kda

from bench.sass.model import Kernel, bucket

FORMATS = ("bf16", "fp8", "nvfp4")


def _q(name: str, fmt: str) -> str:
    """gemv_lane16 -> gemv_fp8_lane16 etc.: the quantised kernel of a bf16 name."""
    return name if fmt == "bf16" else name.replace("_lane16", f"_{fmt}_lane16")


def gemv(form: str, fmt: str = "bf16", rows: int = 16) -> Kernel:
    """The decode GEMV of a form: dense (also per-head, grid z), grouped (experts), swiglu, grouped swiglu,
    multi, multi swiglu, multi rmsnorm (a norm in its prologue); bf16 only for multi and multi swiglu (their
    quantised parts are priced as the dense body). Counted in the row bucket a block of `rows` rows runs in."""
    files = {"dense": ("gemv_lane16", "gemv.cu"), "grouped": ("gemv_grouped_lane16", "gemv.cu"),
             "swiglu": ("gemv_swiglu_lane16", "gemv_swiglu.cu"),
             "grouped swiglu": ("gemv_grouped_swiglu_lane16", "gemv_swiglu.cu"),
             "multi": ("gemv_multi_lane16", "gemv_multi.cu"),
             "multi swiglu": ("gemv_multi_swiglu_lane16", "gemv_multi.cu"),
             "multi rmsnorm": ("gemv_multi_rmsnorm_lane16", "gemv_norm.cu")}
    name, file = files[form]
    if fmt != "bf16" and form == "multi rmsnorm":             # its quantised parts' loop: x normed chunk by chunk
        return Kernel(_q(name, fmt), "gemv_q_norm.cu", "decode", "weight", 256, fmt, bucket=bucket(rows))
    if fmt != "bf16":
        if form.startswith("multi"):
            raise ValueError(f"gemv form {form!r} has no {fmt} kernel")
        name, file = _q(name, fmt), "gemv_q.cu"
    return Kernel(name, file, "decode", "weight", 256, fmt, bucket=bucket(rows))


def moe(form: str, fmt: str = "bf16", rows: int = 16) -> Kernel:
    """A decode launch of op moe_experts (moe_decode.cu), counted as the GEMV whose body it runs: "grouped swiglu"
    the routing and the experts' gate/up SwiGLU (moe_route_swiglu), "grouped" the experts' and the shared expert's
    down projections and the combine (moe_down_combine); fp8 / nvfp4 their quantised forms."""
    name = {"grouped swiglu": "moe_route_swiglu_lane16", "grouped": "moe_down_combine_lane16"}[form]
    return Kernel(_q(name, fmt), "moe_decode.cu", "decode", "weight", 256, fmt, bucket=bucket(rows))


# the prompt GEMM on the tensor core (gemm_tc.cu): 256 threads, 128 x 256 output tiles staged through shared memory
GEMM_TC = Kernel("gemm_tc_bf16", "gemm_tc.cu", "prompt", "flop", ops_gemm_tc.DENSE_THREADS[0],
                 dyn_shared=ops_gemm_tc.DENSE_SHARED)
# its grouped-experts form: the same tile, run once per distinct expert among a block's rows
GEMM_TC_GROUPED = Kernel("gemm_tc_grouped_bf16", "gemm_tc.cu", "prompt", "flop", ops_gemm_tc.DENSE_THREADS[0],
                         dyn_shared=ops_gemm_tc.DENSE_SHARED)


def gemm_tc_q(fmt: str, grouped: bool = False) -> Kernel:
    """The quantised prompt GEMM on the tensor core (gemm_tc_q.cu, bf16 out), dense or over grouped experts (rows
    sorted by expert): 256 threads, TILE_M x TILE_N output tiles staged through shared memory (ops_gemm_tc_q)."""
    return Kernel(f"gemm_tc{'_grouped' if grouped else ''}_{fmt}_bf16", "gemm_tc_q.cu", "prompt", "flop",
                  ops_gemm_tc_q.THREADS[0], fmt, dyn_shared=ops_gemm_tc_q.SHARED[fmt])


def attention_decode(r: int, chunk: int) -> tuple[Kernel, Kernel]:
    """attention_split.cu's two kernels (scores: static shared memory only; then P.V), with the launcher's
    dynamic shared memory."""
    return (Kernel("attention_chunk_scores", "attention_split.cu", "decode", "flop", 256),
            Kernel("attention_chunk_pv", "attention_split.cu", "decode", "flop", 256, dyn_shared=att.pv_shared(chunk)))


def attention_prompt(r: int, chunk: int) -> Kernel:
    return Kernel("attention", "attention.cu", "prompt", "flop", 128 if r <= 1024 else 256,
                  dyn_shared=(2 * chunk + 1) * 4)


def attention_tc_prompt(r: int) -> Kernel:
    """attention_tc.cu (prompt rows): a block of 8 warps per two 16-row tiles of (query row, head) pairs, the
    launcher's shared memory."""
    return Kernel("attention_tc", "attention_tc.cu", "prompt", "flop", att_tc.THREADS,
                  dyn_shared=att_tc.shared_bytes(r))




def index_decode(i: int) -> Kernel:
    """index_scores_rows on the tensor core: ROWS_WARPS warps of WARP_POOLS pools, the launcher's shared memory."""
    w = idx.ROWS_WARPS
    return Kernel("index_scores_rows", "indexer.cu", "decode", "flop", 32 * w, dyn_shared=idx.shared_bytes(i, w))


def index_prompt(i: int) -> Kernel:
    """index_scores on the tensor core: WARPS warps of WARP_POOLS pools, the launcher's shared memory."""
    return Kernel("index_scores", "indexer.cu", "prompt", "flop", 32 * idx.WARPS,
                  dyn_shared=idx.shared_bytes(i, idx.WARPS))


# kda_step's hot loop is one of its per-token loops over the lane's key columns (one element a thread)
KDA_DECODE = Kernel("kda_step", "kda_step.cu", "decode", "state", 256, per_thread=1)
NORM = Kernel("rmsnorm_rows", "norm.cu", "decode", "flop", 128)
# hc.cu's hc_post_pre_norm (prompt rows, one block a row): its hot loop the mix dots' (two loads a product)
HC_ROW = Kernel("hc_post_pre_norm", "hc.cu", "prompt", "flop", 128, hot="dot")


def hc_mix(d: int) -> Kernel:
    """hc_split.cu's hc_mix_norm (decode rows): one warp a block sums the dots, its hot loop; the block's other warps
    only stage the next chunk, so the warp is what issues (threads 32). Shared memory: the stage and the row."""
    return Kernel("hc_mix_norm", "hc_split.cu", "decode", "flop", 32, dyn_shared=ops_hc.SPLIT_STAGE + 4 * d)


def kda_prompt(head_dim: int, rows: int = 1) -> Kernel:
    """kda_recurrence's staged form (ops_kda.rec_kernel): 16 threads a group of `rows` value rows, each holding
    head_dim / 16 key columns of every row; its hot loop is one token of a chunk staged in shared memory."""
    name, _ = kda.rec_kernel(head_dim, rows)
    per_thread = head_dim / 16 * (rows if name != "kda_recurrence" else 1)
    return Kernel(name, "kda.cu", "prompt", "state", kda.REC_THREADS, per_thread=per_thread)
