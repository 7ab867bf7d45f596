// gemv_norm.cu -- decode/verify GEMVs whose input rows are a norm of the rows given, computed in the prologue
// (DESIGN §3b): the rows never go to memory, the norm launch is gone.  Each block recomputes its rows' norm
// scalars into shared memory (lane-16 sums, the norm kernel's code through its header), then streams its columns'
// weights through the gemv_tc.cuh body unchanged, a reader building each x chunk from the raw row, the norm
// weight and the scalar with the norm kernel's own element expression: the bits of the norm launch followed by
// the plain GEMV (gemv_lane16 / gemv_multi_lane16), only the launch and the round trip of the rows saved.
//
// gemv_kda_out_lane16: o_proj(kda_out(y, o_norm, gate)) (kda_out.cuh), fp32 out.
// gemv_multi_rmsnorm_lane16: gemm_multi of rmsnorm(x) (norm_row.cuh) against up to GEMV_NORM_PARTS weights,
// each part's epilogue as gemv_multi_lane16's (gemv_part.cuh).
//
// Launch: block (16, GEMV_OUTS); grid (column blocks (over all parts), ceil(rows / GEMV_ROWS)).
// Controls (contract): CONTROL_NORM_HEAD (a KDA row's element normed by the next head's scalar), CONTROL_NORM_EPS
// (the RMSNorm's eps left out of its scalar), CONTROL_TC_REVERSED (gemv_tc.cuh).
#include "common.cuh"
#include "exp_f32.cuh"
#include "gemv_tc.cuh"
#include "gemv_part.cuh"
#include "kda_out.cuh"
#include "gemv_norm_x.cuh"

#define GEMV_NORM_HEADS 64   // gemv_kda_out_lane16: heads (H) per row at most (the scalars of a block's rows)
#define GEMV_NORM_PARTS 4    // gemv_multi_rmsnorm_lane16: parts at most

// x chunk of KDA's normed output: row c of the block, k = head * V + j.  scale: [GEMV_ROWS][H] shared scalars.
struct GemvXKdaOut {
  const __nv_bfloat16* y;      // the block's first row of y [.., H * V] bf16
  const __nv_bfloat16* gate;   // the block's first row of gate [.., H * V] bf16
  const __nv_bfloat16* w;      // [V] bf16 o_norm
  const float* scale;
  int K, H, V;
  bool vec;
  __device__ __forceinline__ uint4 load8(int c, int kk, int valid) const {
    const long long at = (long long)c * K + kk;
    unsigned short yb[8], gb[8], h[8];
    gemv_unpack8(gemv_load8(y + at, valid, vec), yb);
    gemv_unpack8(gemv_load8(gate + at, valid, vec), gb);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      h[i] = 0;
      if (i < valid) {
        const int hd = (kk + i) / V, j = kk + i - hd * V;
#ifdef CONTROL_NORM_HEAD
        const float r = scale[c * H + (hd + 1) % H];
#else
        const float r = scale[c * H + hd];
#endif
        h[i] = __bfloat16_as_ushort(kda_out_value(ld_bf16(w, j), gemv_bf(yb[i]), r, gemv_bf(gb[i])));
      }
    }
    return gemv_pack8(h);
  }
};

extern "C" __global__ void __launch_bounds__(256) gemv_kda_out_lane16(
    const __nv_bfloat16* __restrict__ y,        // [M, H, V] bf16 the recurrence's output
    const __nv_bfloat16* __restrict__ norm_w,   // [V] bf16 o_norm
    const __nv_bfloat16* __restrict__ gate,     // [M, H, V] bf16
    const __nv_bfloat16* __restrict__ w,        // [N, H * V] bf16 o_proj
    float* __restrict__ out,                    // [M, N] f32: rows [0, rows)
    int N, int H, int V, int rows, float eps) { // H <= GEMV_NORM_HEADS; rows: the call's leading decode rows
  __shared__ float scale[GEMV_ROWS * GEMV_NORM_HEADS];   // [row of the block, head] the rows' r
  __shared__ __align__(16) GemvTcShared<1> sh;
  const int K = H * V, m0 = blockIdx.y * GEMV_ROWS, nrows = min(GEMV_ROWS, rows - m0);
  const long long base = (long long)m0 * K;
  const int pairs = nrows * H;
  for (int j0 = 0; j0 < pairs; j0 += GEMV_OUTS) {        // group threadIdx.y takes (row, head) pair j0 + y
    const int j = j0 + threadIdx.y;
    const bool active = j < pairs;
    const float r = kda_out_scale(y + base + (long long)(active ? j : 0) * V, V, threadIdx.x, active, eps);
    if (active && threadIdx.x == 0) scale[j] = r;
  }
  __syncthreads();
  const GemvXKdaOut xr = {y + base, gate + base, norm_w, scale, K, H, V, gemv_aligned(y, gate, K)};
  const GemvPart p = {nullptr, w, out, N, K, 0};
  gemv_part_block(sh, p, blockIdx.x, blockIdx.y, rows, xr, gemv_aligned(w, w, K));
}

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
