// gemv_norm.cu -- decode/verify GEMVs whose input rows are rmsnorm(x), computed in the prologue (DESIGN §3b): the
// rows never go to memory, the norm launch is gone.  Each block recomputes its rows' norm scalars into shared memory
// (lane-16 sums, the norm kernel's code through its header), then streams its columns' weights through the
// gemv_tc.cuh body unchanged, a reader (gemv_norm_x.cuh) building each x chunk from the raw row, the norm weight and
// the scalar with the norm kernel's own element expression: the bits of the norm launch followed by the plain GEMV
// (gemv_multi_lane16), only the launch and the round trip of the rows saved.
//
// gemv_multi_rmsnorm_lane16: gemm_multi of rmsnorm(x) (norm_row.cuh) against up to GEMV_NORM_PARTS weights,
// each part's epilogue as gemv_multi_lane16's (gemv_part.cuh).
//
// Launch: block (16, GEMV_OUTS); grid (column blocks (over all parts), ceil(rows / GEMV_ROWS)).
// Controls (contract): CONTROL_NORM_EPS (the RMSNorm's eps left out of its scalar), CONTROL_TC_REVERSED
// (gemv_tc.cuh).
#include "common.cuh"
#include "gemv_tc.cuh"
#include "gemv_part.cuh"
#include "gemv_norm_x.cuh"

#define GEMV_NORM_PARTS 4    // gemv_multi_rmsnorm_lane16: parts at most

extern "C" __global__ void __launch_bounds__(256) gemv_multi_rmsnorm_lane16(
    const __nv_bfloat16* __restrict__ x,        // [M, K] bf16 the rows before the norm
    const __nv_bfloat16* __restrict__ norm_w,   // [K] bf16
    float eps,
    const __nv_bfloat16* __restrict__ w0,       // [n0, K] bf16
    void* __restrict__ y0,                      // [M, n0] fp32 (kind0 0) or bf16 (1, 2): rows [0, rows)
    int n0, int kind0,
    const __nv_bfloat16* __restrict__ w1,       // [n1, K] bf16
    void* __restrict__ y1,                      // [M, n1] fp32 (kind1 0) or bf16 (1, 2): rows [0, rows)
    int n1, int kind1,
    const __nv_bfloat16* __restrict__ w2,       // [n2, K] bf16
    void* __restrict__ y2,                      // [M, n2] fp32 (kind2 0) or bf16 (1, 2): rows [0, rows)
    int n2, int kind2,
    const __nv_bfloat16* __restrict__ w3,       // [n3, K] bf16
    void* __restrict__ y3,                      // [M, n3] fp32 (kind3 0) or bf16 (1, 2): rows [0, rows)
    int n3, int kind3,
    int K,
    int rows) {                                 // rows <= M: the call's leading decode/verify rows
  const GemvPart parts[GEMV_NORM_PARTS] = {{nullptr, w0, y0, n0, K, kind0}, {nullptr, w1, y1, n1, K, kind1},
                                           {nullptr, w2, y2, n2, K, kind2}, {nullptr, w3, y3, n3, K, kind3}};
  int b = blockIdx.x;
  const int p = gemv_part_of(parts, GEMV_NORM_PARTS, &b);
  if (p == GEMV_NORM_PARTS) return;
  __shared__ float scale[GEMV_ROWS];          // the block's rows' 1 / sqrt(mean(x^2) + eps)
  __shared__ __align__(16) GemvTcShared<1> sh;
  const GemvXRms xr = gnr_rows(scale, x, norm_w, K, rows, eps);
  gemv_part_block(sh, parts[p], b, blockIdx.y, rows, xr, gemv_aligned(parts[p].w, parts[p].w, K));
}
