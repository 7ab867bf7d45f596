// gemv_multi.cu -- several decode/verify GEMVs in one launch (DESIGN §3b): part p computes
// y_p[m, n] = sum_k x_p[m, k] * w_p[n, k] for the leading `rows` rows, exactly as its own gemv_lane16(_bf16)
// launch would (the same gemv_tc.cuh body per block: the tensor core's decode order, one rounding).  The parts of a
// layer that read the same row (KDA q/k/v, f_a, g_a, b; DSA q_a, kv_a, the indexer's wk, gate, weights) or
// follow each other (f_b, g_b) cost one launch instead of one each; gemv_multi_swiglu_lane16 pairs one such part
// with a SwiGLU part (the MoE router and the shared expert's gate/up), gemv_grouped_dense_lane16 the experts'
// grouped down projection with the shared expert's dense one.
//
// Epilogue of part p (kind_p): gemv_part.cuh.
//
// Launch: block (16, GEMV_OUTS); grid (sum_p ceil(n_p / GEMV_OUTS), ceil(rows / GEMV_ROWS)): column block b
// belongs to the first part whose blocks cover it (parts in order).  Unused parts have n_p = 0 (no blocks).
#include "common.cuh"
#include "exp_f32.cuh"
#include "gemv_tc.cuh"
#include "gemv_part.cuh"
#include "gemv_grouped.cuh"
#include "swiglu.cuh"

#define GEMV_MULTI_PARTS 6

// 2 blocks an SM (<= 128 registers), as gemv_lane16.
extern "C" __global__ void __launch_bounds__(256, 2) gemv_multi_lane16(
    const __nv_bfloat16* __restrict__ x0,   // [M, k0] bf16
    const __nv_bfloat16* __restrict__ w0,   // [n0, k0] bf16
    void* __restrict__ y0,                  // [M, n0] fp32 (kind0 0) or bf16 (1, 2): rows [0, rows)
    int n0, int k0, int kind0,
    const __nv_bfloat16* __restrict__ x1,   // [M, k1] bf16
    const __nv_bfloat16* __restrict__ w1,   // [n1, k1] bf16
    void* __restrict__ y1,                  // [M, n1] fp32 (kind1 0) or bf16 (1, 2): rows [0, rows)
    int n1, int k1, int kind1,
    const __nv_bfloat16* __restrict__ x2,   // [M, k2] bf16
    const __nv_bfloat16* __restrict__ w2,   // [n2, k2] bf16
    void* __restrict__ y2,                  // [M, n2] fp32 (kind2 0) or bf16 (1, 2): rows [0, rows)
    int n2, int k2, int kind2,
    const __nv_bfloat16* __restrict__ x3,   // [M, k3] bf16
    const __nv_bfloat16* __restrict__ w3,   // [n3, k3] bf16
    void* __restrict__ y3,                  // [M, n3] fp32 (kind3 0) or bf16 (1, 2): rows [0, rows)
    int n3, int k3, int kind3,
    const __nv_bfloat16* __restrict__ x4,   // [M, k4] bf16
    const __nv_bfloat16* __restrict__ w4,   // [n4, k4] bf16
    void* __restrict__ y4,                  // [M, n4] fp32 (kind4 0) or bf16 (1, 2): rows [0, rows)
    int n4, int k4, int kind4,
    const __nv_bfloat16* __restrict__ x5,   // [M, k5] bf16
    const __nv_bfloat16* __restrict__ w5,   // [n5, k5] bf16
    void* __restrict__ y5,                  // [M, n5] fp32 (kind5 0) or bf16 (1, 2): rows [0, rows)
    int n5, int k5, int kind5,
    int M,          // rows of every x_p and y_p
    int rows) {     // rows <= M: the call's leading decode/verify rows
  const GemvPart parts[GEMV_MULTI_PARTS] = {{x0, w0, y0, n0, k0, kind0}, {x1, w1, y1, n1, k1, kind1},
                                            {x2, w2, y2, n2, k2, kind2}, {x3, w3, y3, n3, k3, kind3},
                                            {x4, w4, y4, n4, k4, kind4}, {x5, w5, y5, n5, k5, kind5}};
  int b = blockIdx.x, p = 0;
  for (; p < GEMV_MULTI_PARTS; ++p) {        // uniform over the block: every thread takes the same part
    const int nb = (parts[p].n + GEMV_OUTS - 1) / GEMV_OUTS;
    if (b < nb) break;
    b -= nb;
  }
  if (p == GEMV_MULTI_PARTS) return;
  __shared__ __align__(16) GemvTcShared<1> sh;
  gemv_multi_one(sh, parts[p], b, blockIdx.y, rows);
}

union GemvSharedBoth {           // a block of either form (one weight, or gate and up)
  GemvTcShared<1> one;
  GemvTcShared<2> two;
};

// One plain part (kind as above) and one SwiGLU part (gemv_swiglu.cu's gemv_swiglu_lane16: gate and up summed in
// the decode order, each rounded to bf16, swiglu.cuh) of the same rows x in one launch: the MoE's router and its
// shared expert's gate/up.  Blocks [0, ceil(n_a / GEMV_OUTS)) take part a, the rest the SwiGLU part.
// Launch: block (16, GEMV_OUTS); grid (ceil(n_a / GEMV_OUTS) + ceil(n_s / GEMV_OUTS), ceil(rows / GEMV_ROWS)).
extern "C" __global__ void __launch_bounds__(256) gemv_multi_swiglu_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const __nv_bfloat16* __restrict__ wa,   // [n_a, K] bf16
    void* __restrict__ ya,                  // [M, n_a] fp32 (kind_a 0) or bf16 (1, 2): rows [0, rows)
    int n_a, int kind_a,
    const __nv_bfloat16* __restrict__ wg,   // [n_s, K] bf16 gate_proj
    const __nv_bfloat16* __restrict__ wu,   // [n_s, K] bf16 up_proj
    __nv_bfloat16* __restrict__ ys,         // [M, n_s] bf16: rows [0, rows)
    int n_s, int M, int K, int rows, int has_limit, float limit) {
  __shared__ __align__(16) GemvSharedBoth sh;
  const int nba = (n_a + GEMV_OUTS - 1) / GEMV_OUTS;
  const int m0 = blockIdx.y * GEMV_ROWS;
  const int lane = threadIdx.x, o = threadIdx.y;
  if ((int)blockIdx.x < nba) {
    const GemvPart p = {x, wa, ya, n_a, K, kind_a};
    gemv_multi_one(sh.one, p, blockIdx.x, blockIdx.y, rows);
    return;
  }
  const int n0 = (blockIdx.x - nba) * GEMV_OUTS, n = n0 + o;
  GemvSrc<2> src;
  src.w[0] = wg + (long long)n0 * K;
  src.w[1] = wu + (long long)n0 * K;
  src.x = x + (long long)m0 * K;
  src.ncols = min(GEMV_OUTS, n_s - n0);
  src.nrows = min(GEMV_ROWS, rows - m0);
  src.K = K;
  src.vec = gemv_aligned(x, wg, K) && gemv_aligned(wu, wu, K);
  float v[2];
  gemv_tc_rows(sh.two, src, v);
  if (n < n_s && lane < src.nrows) {
    const float g = bf16_round(v[0]);
    const float u = bf16_round(v[1]);
    ys[(long long)(m0 + lane) * n_s + n] = to_bf16(swiglu_f32(g, u, has_limit, limit));
  }
}

// The MoE's two down projections in one launch: the routed experts' grouped GEMV (gemv_grouped.cuh, gemv.cu's
// gemv_grouped_lane16) over the expert-sorted pairs, and the shared expert's dense GEMV (gemv_lane16) of its rows.
// Launch: block (16, GEMV_OUTS); grid (ceil(N / GEMV_OUTS), M + ceil(M2 / GEMV_ROWS)): block y < M is pair y's
// run (as gemv_grouped_lane16), the rest the dense part's row groups.
extern "C" __global__ void __launch_bounds__(256) gemv_grouped_dense_lane16(
    const __nv_bfloat16* __restrict__ x,     // [M, K] bf16 the pairs' rows
    const __nv_bfloat16* __restrict__ w,     // [E, N, K] bf16
    const int* __restrict__ group,           // [M] int32: expert id of each pair (sorted)
    float* __restrict__ y,                   // [M, N] f32
    int M, int N, int K, int E,
    unsigned int* __restrict__ flags,        // [slots, 2] u32 guard flags
    int slot,                                // the slot of "group holds expert ids outside [0, E)", or -1
    const __nv_bfloat16* __restrict__ x2,    // [M2, K2] bf16 the dense part's rows
    const __nv_bfloat16* __restrict__ w2,    // [N, K2] bf16
    float* __restrict__ y2,                  // [M2, N] f32
    int M2, int K2) {
  __shared__ __align__(16) GemvTcShared<1> sh;
  if ((int)blockIdx.y < M) {
    gemv_grouped_run(x, w, group, y, M, N, K, E, flags, slot, sh);
    return;
  }
  const GemvPart p = {x2, w2, y2, N, K2, 0};
  gemv_multi_one(sh, p, blockIdx.x, blockIdx.y - M, M2);
}
