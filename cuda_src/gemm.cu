// gemm.cu -- the row-invariant GEMM (DESIGN §1): y[h, m, n] = sum_k x[h, m, k] * w[h, n, k] in lane-16 order.
//
// Lane-16 order (cupyglm/backend/lanes.py): term k goes to lane k % 16; each lane adds its terms in
// increasing k from +0.0; the 16 lanes fold lane i += lane i+8, then +4, +2, +1.  The order depends only
// on K: how many rows share the call (M), how many rows a block takes (rows_per_block) and which block a
// row lands in change no bit of a row's result.
//
// Launch: block (16, GEMM_OUTS): threadIdx.x = lane, threadIdx.y = output column within the block;
// grid (ceil(N / GEMM_OUTS), ceil(M / rows_per_block), H).  Thread (lane, o) sums lane `lane` of output
// column n = blockIdx.x * GEMM_OUTS + o for up to GEMM_ROWS rows m0.. (each w element loaded once and used
// for every row of the block); lane partials go to shared memory and one thread per (row, column) folds
// them in the butterfly order.  One __syncthreads, no warp operations.
#include "common.cuh"

#define GEMM_LANES 16
#define GEMM_OUTS 16
#define GEMM_ROWS 8

extern "C" __global__ void __launch_bounds__(256) gemm_lane16(
    const float* __restrict__ x,   // [H, M, K] f32 (bf16 values)
    const float* __restrict__ w,   // [H, N, K] f32 (bf16 values)
    float* __restrict__ y,         // [H, M, N] f32
    int M, int N, int K,
    int rows_per_block) {          // 1..GEMM_ROWS rows per block (any value: the bits do not depend on it)
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  const int lane = threadIdx.x;
  const int o = threadIdx.y;
  const int n = blockIdx.x * GEMM_OUTS + o;
  const int m0 = blockIdx.y * rows_per_block;
  const long long h = blockIdx.z;
  const float* xh = x + h * (long long)M * K;
  const float* wh = w + h * (long long)N * K;
  float* yh = y + h * (long long)M * N;
  const int nrows = min(rows_per_block, M - m0);

  float acc[GEMM_ROWS];
#pragma unroll
  for (int r = 0; r < GEMM_ROWS; ++r) acc[r] = 0.0f;
  if (n < N) {
    const float* wr = wh + (long long)n * K;
    const float* xr = xh + (long long)m0 * K;
    for (int k = lane; k < K; k += GEMM_LANES) {
      const float wv = wr[k];
#pragma unroll
      for (int r = 0; r < GEMM_ROWS; ++r) {
        if (r < nrows) {
          const float p = xr[(long long)r * K + k] * wv;
          acc[r] = acc[r] + p;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < GEMM_ROWS; ++r) part[o][r][lane] = acc[r];
  __syncthreads();
  if (n < N && lane < nrows) {
    float t[GEMM_LANES];
#pragma unroll
    for (int i = 0; i < GEMM_LANES; ++i) t[i] = part[o][lane][i];
#ifdef CONTROL_WRONG_ORDER
    // Planted control (contract): fold 1, 2, 4, 8 instead of 8, 4, 2, 1.
#pragma unroll
    for (int s = 1; s < GEMM_LANES; s <<= 1)
      for (int i = 0; i < GEMM_LANES; i += 2 * s) t[i] = t[i] + t[i + s];
#else
#pragma unroll
    for (int width = GEMM_LANES / 2; width > 0; width >>= 1)
#pragma unroll
      for (int i = 0; i < width; ++i) t[i] = t[i] + t[i + width];
#endif
    yh[(long long)(m0 + lane) * N + n] = t[0];
  }
}
