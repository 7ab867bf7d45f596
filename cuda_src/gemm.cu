// gemm.cu -- the row-invariant GEMM (DESIGN §1): y[h, m, n] = sum_k x[h, m, k] * w[h, n, k] in lane-16 order
// (gemm_lane16), and its grouped form for MoE experts, y[m, n] = sum_k x[m, k] * w[group[m], n, k]
// (gemm_grouped_lane16, at the end of the file).
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

// The 16 lane partials of one (row, column) folded as the reference does (common.cuh), or, in the planted
// control variant of the contract, in the wrong order (1, 2, 4, 8 instead of 8, 4, 2, 1).
static __device__ __forceinline__ float gemm_fold16(const float* p) {
#ifdef CONTROL_WRONG_ORDER
  float t[GEMM_LANES];
#pragma unroll
  for (int i = 0; i < GEMM_LANES; ++i) t[i] = p[i];
#pragma unroll
  for (int s = 1; s < GEMM_LANES; s <<= 1)
    for (int i = 0; i < GEMM_LANES; i += 2 * s) t[i] = t[i] + t[i + s];
  return t[0];
#else
  return lane16_fold_array(p);
#endif
}

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
    yh[(long long)(m0 + lane) * N + n] = gemm_fold16(part[o][lane]);
  }
}

// Grouped expert GEMM (the MoE): y[m, n] = sum_k x[m, k] * w[group[m], n, k] in lane-16 order -- row m's bits
// are exactly gemm_lane16's for x[m] against expert group[m]'s [N, K] slice, whatever other rows (of the same
// or other experts) share the call or the block.
//
// Launch as gemm_lane16 with H = 1: block (16, GEMM_OUTS), grid (ceil(N / GEMM_OUTS), ceil(M / rows_per_block)).
// Each row of a block reads its own expert's slice; a w element is loaded once per run of consecutive rows of
// one expert (rows sorted by expert share every load, as in gemm_lane16). A row whose id is outside [0, E)
// (the launcher refuses those) reads nothing and gets NaN.
extern "C" __global__ void __launch_bounds__(256) gemm_grouped_lane16(
    const float* __restrict__ x,     // [M, K] f32 (bf16 values)
    const float* __restrict__ w,     // [E, N, K] f32 (bf16 values): expert e's slice at w + e * N * K
    const int* __restrict__ group,   // [M] int32: expert id of each row
    float* __restrict__ y,           // [M, N] f32
    int M, int N, int K, int E,
    int rows_per_block) {            // 1..GEMM_ROWS rows per block (any value: the bits do not depend on it)
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  const int lane = threadIdx.x;
  const int o = threadIdx.y;
  const int n = blockIdx.x * GEMM_OUTS + o;
  const int m0 = blockIdx.y * rows_per_block;
  const int nrows = min(rows_per_block, M - m0);

  int g[GEMM_ROWS];
#pragma unroll
  for (int r = 0; r < GEMM_ROWS; ++r) {
    const int e = r < nrows ? group[m0 + r] : -1;
    g[r] = (e >= 0 && e < E) ? e : -1;
  }
  float acc[GEMM_ROWS];
#pragma unroll
  for (int r = 0; r < GEMM_ROWS; ++r) acc[r] = 0.0f;
  if (n < N) {
    const float* xr = x + (long long)m0 * K;
    for (int k = lane; k < K; k += GEMM_LANES) {
      int ge = -1;
      float wv = 0.0f;
#pragma unroll
      for (int r = 0; r < GEMM_ROWS; ++r) {
        if (g[r] >= 0) {
          if (g[r] != ge) {
            ge = g[r];
            wv = w[((long long)ge * N + n) * K + k];
          }
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
    const int e = group[m0 + lane];
    y[(long long)(m0 + lane) * N + n] = (e >= 0 && e < E) ? gemm_fold16(part[o][lane]) : NAN;
  }
}
