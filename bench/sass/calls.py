"""One launch of each modelled kernel at a shape: the work units, bytes (weights as cupyglm.memory stores them),
FLOPs and blocks the launcher's grid gives (cupyglm/kernels/ops_*.py)."""
from __future__ import annotations

from cupyglm.kernels import ops_gemm_tc, ops_gemm_tc_q, ops_gemv_q, ops_hc, ops_kda

from bench.sass import kernels as K
from bench.sass.model import Call, analyse, tile_l2_bytes

OUTS = 16            # GEMV_OUTS: output columns a block
ROWS = 16            # GEMV_ROWS: decode rows a block reads each weight once for


def gemv(form: str, fmt: str, n: int, k: int, rows: int, stored: float, nw: int = 1, slices: float = 1.0,
         heads: int = 1, out_bytes: int = 2, arch: str = "sm_90", collective: bool = False,
         launched: bool = True, moe: bool = False) -> Call:
    """A decode GEMV of `rows` rows against `nw` [N, K] matrices of `stored` bytes each, for `heads` heads, or
    (grouped) over `slices` experts with `rows` rows each. Weights are read once per ROWS rows; every block's
    loop counted in the bucket of min(rows, ROWS) rows (a last group of fewer rows runs a smaller bucket: an upper
    bound past ROWS rows). moe: the grouped forms run in moe_experts' fused launches (kernels.moe)."""
    groups = -(-rows // ROWS)
    units = slices * heads * n * k * nw * groups
    total_rows = rows * slices * heads
    nbytes = slices * heads * stored * nw * groups + total_rows * k * 2 + total_rows * n * out_bytes
    outs = ops_gemv_q.PAIR_OUTS if form == "swiglu" and fmt != "bf16" else OUTS
    blocks = int(-(-n // outs) * groups * heads * max(1.0, round(slices)))
    flops = 2.0 * total_rows * n * k * nw
    kernel = K.moe(form, fmt, rows) if moe else K.gemv(form, fmt, rows)
    return Call(analyse(kernel, arch), units, nbytes, flops, blocks, collective, launched=launched)


def launch_only() -> Call:
    """A launch whose work is negligible at the shapes priced (routing, sorting, a row write)."""
    return Call(None, 0.0, 0.0, 0.0, 1)


def gemm_tc(m: int, n: int, k: int, stored: float, arch: str = "sm_90") -> Call:
    """gemm_tc_bf16 over M prompt rows: 2 M N K FLOPs; each weight read from HBM once (the row blocks' re-reads
    hit L2), x and y once; one block per 128 x 256 output tile, each loading its tile's rows and columns from L2
    once (staged in shared memory for its 8 warps)."""
    flops = 2.0 * m * n * k
    tm, tn = ops_gemm_tc.DENSE_TILE_M, ops_gemm_tc.DENSE_TILE_N
    blocks = -(-m // tm) * -(-n // tn)
    return Call(analyse(K.GEMM_TC, arch), flops, stored + m * k * 2 + m * n * 2, flops, blocks,
                l2_bytes=tile_l2_bytes(n, k, tm, tn, -(-m // tm)))


def gemm_tc_grouped(m: int, n: int, k: int, stored: float, slices: float, arch: str = "sm_90") -> Call:
    """gemm_tc_grouped_bf16 over M prompt rows sorted by expert over `slices` experts: the FLOPs its tensor core
    issues (a block's 128 x 256 tile runs once per expert among its rows: ceil(M / 128) + slices - 1 row-tile
    passes at most), each used expert's weights read from HBM once, x and y once; each pass's blocks loading their
    tile's rows and columns from L2 once."""
    tm, tn = ops_gemm_tc.DENSE_TILE_M, ops_gemm_tc.DENSE_TILE_N
    passes = -(-m // tm) + max(0, round(min(slices, m)) - 1)
    flops = 2.0 * tm * passes * n * k
    blocks = -(-m // tm) * -(-n // tn)
    return Call(analyse(K.GEMM_TC_GROUPED, arch), flops, slices * stored + m * k * 2 + m * n * 2, flops, blocks,
                l2_bytes=tile_l2_bytes(n, k, tm, tn, passes))


def gemm_tc_q(fmt: str, m: int, n: int, k: int, stored: float, arch: str = "sm_90", slices: float = 0.0) -> Call:
    """gemm_tc_{fmt}_bf16 over M prompt rows (gemm_tc_q.cu): 2 M N K FLOPs, the weight's `stored` bytes (packed
    values and scales, their bytes an element in the tiles' loads) read once, x and y once; one block per TILE_M x
    TILE_N output tile (ops_gemm_tc_q). slices > 0: gemm_tc_grouped_{fmt}_bf16 over M rows sorted by expert over
    `slices` experts (`stored` bytes each), a block's TILE_M rows running their k-loop once per expert among them
    (ceil(M / TILE_M) + slices - 1 row-tile passes at most), the FLOPs its tensor core issues."""
    tm, tn = ops_gemm_tc_q.TILE_M, ops_gemm_tc_q.TILE_N
    blocks = -(-m // tm) * -(-n // tn)
    passes = -(-m // tm) + max(0, round(min(slices, m)) - 1) if slices else -(-m // tm)
    flops = 2.0 * tm * passes * n * k if slices else 2.0 * m * n * k
    nbytes = max(1.0, slices) * stored + m * k * 2 + m * n * 2
    return Call(analyse(K.gemm_tc_q(fmt, bool(slices)), arch), flops, nbytes, flops, blocks,
                l2_bytes=tile_l2_bytes(n, k, tm, tn, passes, w_bytes=stored / (n * k)))


def attention_decode(cfg, tp: int, rows: int, context: int, arch: str = "sm_90") -> list[Call]:
    """attention_split.cu for `rows` decode rows at `context`: each row's picked latent rows (min(context,
    index_topk) of kv_lora_rank bf16) scored and summed by its heads (q.k then P.v: 2 H R a picked row each);
    the rows read from HBM once (the P.V pass finds them in L2); the launcher's grids (a block per key tile and
    head group, then per chunk, head group and column slice)."""
    h, r, chunk = cfg.num_attention_heads // tp, cfg.kv_lora_rank, cfg.attn_chunk
    picked = min(context, cfg.index_topk)
    flops = 2.0 * rows * h * r * picked
    gs, gp = K.att.split_grids(rows, h, r, picked, chunk)
    ks, kp = K.attention_decode(r, chunk)
    return [Call(analyse(ks, arch), flops, rows * picked * r * 2.0, flops, gs[0] * gs[1] * gs[2]),
            Call(analyse(kp, arch), flops, rows * h * r * 2.0, flops, gp[0] * gp[1] * gp[2])]


def attention_prompt_work(cfg, tp: int, tokens: int) -> tuple[float, float]:
    """(FLOPs, bytes) a cold prompt's attention needs: query p attends min(p + 1, index_topk) picked rows (4 H R
    FLOPs each); the latent rows are read once, the queries and outputs once."""
    h, r, topk = cfg.num_attention_heads // tp, cfg.kv_lora_rank, cfg.index_topk
    full = min(tokens, topk)
    pairs = full * (full + 1) / 2 + max(0, tokens - topk) * topk
    return 4.0 * h * r * pairs, tokens * r * 2.0 + 2 * tokens * h * r * 2.0


def attention_prompt(cfg, tp: int, tokens: int, arch: str = "sm_90") -> Call:
    """attention.cu over a cold prompt: attention_prompt_work's FLOPs and bytes, one block a row and head."""
    flops, nbytes = attention_prompt_work(cfg, tp, tokens)
    h = cfg.num_attention_heads // tp
    return Call(analyse(K.attention_prompt(cfg.kv_lora_rank, cfg.attn_chunk), arch), flops, nbytes, flops, tokens * h)


def attention_tc_prompt(cfg, tp: int, tokens: int, arch: str = "sm_90") -> Call:
    """attention_tc.cu over a cold prompt: the FLOPs its tensor core issues, every 64-position block a row touches
    whole on each of its 16-row tiles (QK^T and PV, 2 x 2 x 16 x 64 x R a block and tile, plus the sum of P,
    2 x 16 x 64 x 8; a tile whose row skips a step issues nothing). Query p touches p // 64 + 1 blocks below
    index_topk; past it, at most one block a picked pool (an upper bound). A block of the kernel holds 32 (query
    row, head) pairs: heads_a_block(H) heads of 32 / hb consecutive rows, which stage each key block once for all
    of them. Latent rows read once, queries and outputs once (attention_prompt_work's bytes); from L2 each block
    loads its queries and every picked row (R bf16 and its position) of its rows: below index_topk a row's picks
    hold the earlier rows' (the block loads its last row's), past it none are taken as shared (an upper bound)."""
    h, r, topk = cfg.num_attention_heads // tp, cfg.kv_lora_rank, cfg.index_topk
    hb = K.att_tc.heads_a_block(h)
    qr = K.att_tc.TILE * K.att_tc.TILES // hb            # query rows a block
    groups, tiles = -(-h // hb), -(-h // 16)            # head blocks (grid.y); 16-row tiles a row issues
    per_block = 2 * 2 * 16 * 64 * r + 2 * 16 * 64 * 8
    blocks = sum(p // 64 + 1 if p < topk else min(p // 64 + 1, topk // cfg.index_kpool + 1) for p in range(tokens))
    flops = float(blocks * tiles * per_block)
    nbytes = tokens * r * 2.0 + 2 * tokens * h * r * 2.0
    last = (min(p, tokens - 1) for p in range(qr - 1, tokens + qr - 1, qr))     # each block's last row
    picked = sum(p + 1 if p < topk else qr * topk for p in last)             # its rows' picks, as loaded
    l2 = groups * (picked * (r * 2.0 + 8) + tokens * hb * r * 2.0)
    row_blocks = -(-tokens // qr)
    return Call(analyse(K.attention_tc_prompt(r), arch), flops, nbytes, flops, row_blocks * groups, l2_bytes=l2)


def index_decode(cfg, rows: int, context: int, arch: str = "sm_90") -> Call:
    """index_scores_rows on the tensor core: each row scores its visible pooled keys (context / index_kpool of
    index_head_dim bf16) with its index heads in 16-head tiles (2 x 16 x I FLOPs a key and tile); one block per
    row and WARP_POOLS x ROWS_WARPS pools, each key read once."""
    pools, i = context // cfg.index_kpool, cfg.index_head_dim
    heads = -(-cfg.index_n_heads // 16) * 16
    flops = 2.0 * rows * pools * heads * i
    blocks = rows * -(-pools // (K.idx.WARP_POOLS * K.idx.ROWS_WARPS))
    return Call(analyse(K.index_decode(i), arch), flops, rows * pools * i * 2.0, flops, blocks)


def index_prompt(cfg, tokens: int, arch: str = "sm_90") -> Call:
    """index_scores on the tensor core over a cold prompt: query p scores the p / index_kpool pooled keys before it
    (the blocks of pools past a row block's last query counted as skipped: half the grid). Keys and queries read
    from HBM once; from L2 each block loads its WARP_POOLS x WARPS keys and its ROWS rows' queries (16-head tiles)."""
    pools, i = tokens // cfg.index_kpool, cfg.index_head_dim
    heads = -(-cfg.index_n_heads // 16) * 16
    flops = 2.0 * heads * i * tokens * pools / 2
    nbytes = pools * i * 2.0 + tokens * cfg.index_n_heads * i * 2.0
    np_ = K.idx.WARP_POOLS * K.idx.WARPS
    blocks = -(-tokens // K.idx.ROWS) * -(-pools // np_)
    l2 = blocks / 2 * (np_ * i * 2.0 + K.idx.ROWS * cfg.index_n_heads * (i * 2.0 + 4))
    return Call(analyse(K.index_prompt(i), arch), flops, nbytes, flops, blocks, l2_bytes=l2)


def kda_decode(cfg, tp: int, rows: int, arch: str = "sm_90") -> Call:
    """kda_step: each row's [H, V, K] fp32 state read, updated and written back."""
    h, d = cfg.kda_num_heads // tp, cfg.kda_head_dim
    state = h * d * d
    return Call(analyse(K.KDA_DECODE, arch), rows * state, rows * state * 8.0, 0.0, -(-d // 16) * h)


def kda_prompt(cfg, tp: int, tokens: int, arch: str = "sm_90") -> Call:
    """kda_recurrence over a cold prompt: every token updates the whole state; q, k, g fp32 and v, y bf16 read and
    written once (each block stages its head's q, k, g; the other blocks of the head hit L2). The launcher's rows
    a group and blocks (ops_kda.rec_rows, rec_kernel)."""
    h, d = cfg.kda_num_heads // tp, cfg.kda_head_dim
    rows = ops_kda.rec_rows(h, d)
    _, block_rows = ops_kda.rec_kernel(d, rows)
    nbytes = 2 * h * d * d * 4.0 + tokens * h * d * (3 * 4 + 2 * 2)
    return Call(analyse(K.kda_prompt(d, rows), arch), tokens * h * d * d, nbytes, 0.0, -(-d // block_rows) * h)


def norm(cfg, rows: int, arch: str = "sm_90") -> Call:
    """rmsnorm_rows over `rows` rows of hidden_size (about 4 FLOPs an element)."""
    d = cfg.hidden_size
    return Call(analyse(K.NORM, arch), 4.0 * rows * d, rows * d * 4.0, 0.0, rows)


def _hc_shape(cfg) -> tuple[int, int, int, float]:
    """(streams S, hidden D, K = S * D, the bytes of one fn [NM, K] bf16)."""
    s, d = cfg.hc_mult, cfg.hidden_size
    return s, d, s * d, s * (s + 2) * s * d * 2.0


def hc_decode(cfg, tp: int, rows: int, arch: str = "sm_90") -> list[Call]:
    """A sublayer's hc_post_pre_norm on `rows` decode rows, hc_split.cu's two launches: hc_post_split (an
    elementwise pass over the streams and the ranks' partials, its bytes alone) and hc_mix_norm (NM + 1 dots of K
    terms a row in lane-16 chains, ceil((NM + 1) / SPLIT_OUTS) blocks a row; fn from HBM once, every row's blocks
    load it, and the tail's streams)."""
    s, d, k, fn = _hc_shape(cfg)
    nm = s * (s + 2)
    post = Call(None, 0.0, rows * (2.0 * k * 2 + tp * d * 4), 0.0, rows)
    blocks = rows * -(-(nm + 1) // ops_hc.SPLIT_OUTS)
    mix = Call(analyse(K.hc_mix(d), arch), 2.0 * (nm + 1) * k * rows, fn + rows * (k * 2 + 2 * d * 2), 0.0, blocks,
               l2_bytes=rows * (fn + blocks / rows * k * 2))
    return [post, mix]


def hc_prompt(cfg, tp: int, tokens: int, arch: str = "sm_90") -> list[Call]:
    """A sublayer's hc_post_pre_norm on `tokens` prompt rows: hc_decode's launches up to ops_hc.SPLIT_ROWS rows,
    else hc.cu's one block a row (each block loads all of fn)."""
    if tokens <= ops_hc.SPLIT_ROWS:
        return hc_decode(cfg, tp, tokens, arch)
    s, d, k, fn = _hc_shape(cfg)
    nm = s * (s + 2)
    nbytes = fn + tokens * (2.0 * k * 2 + tp * d * 4 + 2 * d * 2)
    return [Call(analyse(K.HC_ROW, arch), 2.0 * (nm + 1) * k * tokens, nbytes, 0.0, tokens,
                 l2_bytes=tokens * (fn + k * 2))]
