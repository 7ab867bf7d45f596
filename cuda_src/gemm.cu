// gemm.cu -- the row-invariant GEMM (DESIGN §1): y[h, m, n] = sum_k x[h, m, k] * w[h, n, k] in lane-16 order
// (gemm_lane16), and its grouped form for MoE experts, y[m, n] = sum_k x[m, k] * w[group[m], n, k]
// (gemm_grouped_lane16, at the end of the file).
//
// Lane-16 order (cupyglm/backend/lanes.py): term k goes to lane k % 16; each lane adds its terms in
// increasing k from +0.0; the 16 lanes fold lane i += lane i+8, then +4, +2, +1.  The order depends only
// on K: how many rows share the call (M), how many rows a block takes (rows_per_block) and which block a
// row lands in change no bit of a row's result.
//
// Storage: x and w are bf16; y is fp32 (gemm_lane16) or bf16 rounded in the epilogue (gemm_lane16_bf16, the
// same fp32 sum rounded once to nearest even, as the reference's bf16(gemm(x, w))).  The _fp8_ / _nvfp4_ kernels
// (at the end) read quantised weights through dequant.cuh: the same body, the weight dequantised in registers.
//
// Launch: block (16, GEMM_OUTS): threadIdx.x = lane, threadIdx.y = output column within the block;
// grid (ceil(M / rows_per_block), ceil(N / GEMM_OUTS), H): the rows on grid.x (up to 2^31 - 1 blocks), so
// the token count never meets grid.y's 65,535 limit.  Thread (lane, o) sums lane `lane` of output
// column n = blockIdx.y * GEMM_OUTS + o for up to GEMM_ROWS rows m0.. (each w element loaded once and used
// for every row of the block); lane partials go to shared memory and one thread per (row, column) folds
// them in the butterfly order.  One __syncthreads, no warp operations.
#include "common.cuh"
#include "gemm_tile.cuh"
#include "dequant.cuh"

// The epilogue: fp32 as summed, or rounded once to bf16.
static __device__ __forceinline__ void gemm_store(float* y, long long i, float v) { y[i] = v; }
static __device__ __forceinline__ void gemm_store(__nv_bfloat16* y, long long i, float v) { y[i] = to_bf16(v); }

template <typename Out, typename W>
static __device__ __forceinline__ void gemm_body(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const W& w,                            // [H, N, K] weights: WBf16, DqFp8 or DqNvfp4 (H = 1 for those)
    Out* __restrict__ y,                   // [H, M, N] fp32 or bf16
    int M, int N, int K, int rows_per_block,
    float (*part)[GEMM_ROWS][GEMM_LANES + 1]) {
  const int lane = threadIdx.x;
  const int o = threadIdx.y;
  const int n = blockIdx.y * GEMM_OUTS + o;
  const int m0 = blockIdx.x * rows_per_block;
  const long long h = blockIdx.z;
  const __nv_bfloat16* xh = x + h * (long long)M * K;
  Out* yh = y + h * (long long)M * N;
  const int nrows = min(rows_per_block, M - m0);

  float acc[GEMM_ROWS];
#pragma unroll
  for (int r = 0; r < GEMM_ROWS; ++r) acc[r] = 0.0f;
  if (n < N) {
    const __nv_bfloat16* xr = xh + (long long)m0 * K;
    for (int k = lane; k < K; k += GEMM_LANES) {
      const float wv = w.at(h, n, k);
#pragma unroll
      for (int r = 0; r < GEMM_ROWS; ++r) {
        if (r < nrows) {
          const float p = ld_bf16(xr, (long long)r * K + k) * wv;
          acc[r] = acc[r] + p;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < GEMM_ROWS; ++r) part[o][r][lane] = acc[r];
  __syncthreads();
  if (n < N && lane < nrows) gemm_store(yh, (long long)(m0 + lane) * N + n, gemm_fold16(part[o][lane]));
}

extern "C" __global__ void __launch_bounds__(256) gemm_lane16(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    float* __restrict__ y,                 // [H, M, N] f32
    int M, int N, int K,
    int rows_per_block) {          // 1..GEMM_ROWS rows per block (any value: the bits do not depend on it)
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_body(x, WBf16(w, N, K), y, M, N, K, rows_per_block, part);
}

extern "C" __global__ void __launch_bounds__(256) gemm_lane16_bf16(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    __nv_bfloat16* __restrict__ y,         // [H, M, N] bf16 (the fp32 sum rounded once)
    int M, int N, int K,
    int rows_per_block) {
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_body(x, WBf16(w, N, K), y, M, N, K, rows_per_block, part);
}

// Grouped expert GEMM (the MoE): y[m, n] = sum_k x[m, k] * w[group[m], n, k] in lane-16 order -- row m's bits
// are exactly gemm_lane16's for x[m] against expert group[m]'s [N, K] slice, whatever other rows (of the same
// or other experts) share the call or the block.
//
// Launch as gemm_lane16 with H = 1: block (16, GEMM_OUTS), grid (ceil(M / rows_per_block), ceil(N / GEMM_OUTS)).
// Each row of a block reads its own expert's slice; a w element is loaded once per run of consecutive rows of
// one expert (rows sorted by expert share every load, as in gemm_lane16). A row whose id is outside [0, E)
// (the launcher refuses those) reads nothing and gets NaN.
template <typename Out, typename W>
static __device__ __forceinline__ void gemm_grouped_body(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const W& w,                            // [E, N, K] weights: WBf16, DqFp8 or DqNvfp4
    const int* __restrict__ group,         // [M] int32: expert id of each row
    Out* __restrict__ y,                   // [M, N] fp32 or bf16
    int M, int N, int K, int E, int rows_per_block,
    float (*part)[GEMM_ROWS][GEMM_LANES + 1]) {
  const int lane = threadIdx.x;
  const int o = threadIdx.y;
  const int n = blockIdx.y * GEMM_OUTS + o;
  const int m0 = blockIdx.x * rows_per_block;
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
    const __nv_bfloat16* xr = x + (long long)m0 * K;
    for (int k = lane; k < K; k += GEMM_LANES) {
      int ge = -1;
      float wv = 0.0f;
#pragma unroll
      for (int r = 0; r < GEMM_ROWS; ++r) {
        if (g[r] >= 0) {
          if (g[r] != ge) {
            ge = g[r];
            wv = w.at(ge, n, k);
          }
          const float p = ld_bf16(xr, (long long)r * K + k) * wv;
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
    gemm_store(y, (long long)(m0 + lane) * N + n, (e >= 0 && e < E) ? gemm_fold16(part[o][lane]) : NAN);
  }
}

extern "C" __global__ void __launch_bounds__(256) gemm_grouped_lane16(
    const __nv_bfloat16* __restrict__ x,     // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,     // [E, N, K] bf16
    const int* __restrict__ group,           // [M] int32: expert id of each row
    float* __restrict__ y,                   // [M, N] f32
    int M, int N, int K, int E,
    int rows_per_block) {            // 1..GEMM_ROWS rows per block (any value: the bits do not depend on it)
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_grouped_body(x, WBf16(w, N, K), group, y, M, N, K, E, rows_per_block, part);
}

extern "C" __global__ void __launch_bounds__(256) gemm_grouped_lane16_bf16(
    const __nv_bfloat16* __restrict__ x,     // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,     // [E, N, K] bf16
    const int* __restrict__ group,           // [M] int32: expert id of each row
    __nv_bfloat16* __restrict__ y,           // [M, N] bf16 (the fp32 sum rounded once)
    int M, int N, int K, int E,
    int rows_per_block) {
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_grouped_body(x, WBf16(w, N, K), group, y, M, N, K, E, rows_per_block, part);
}

// Quantised weights (dequant.cuh), dequantised in registers where gemm_lane16 loads a bf16 weight: the same
// lanes, fold and epilogue, so a row's bits are those of the reference's gemm(x, dequant(w)).  FP8: wv [N, K]
// e4m3, ws [ceil(N / bn), ceil(K / bk)] fp32.  NVFP4: wv [N, K / 2] (two e2m1 a byte), ws [N, K / 16] e4m3,
// ws2 [1] fp32; K % 16 == 0.  Launch as gemm_lane16 with H = 1.
extern "C" __global__ void __launch_bounds__(256) gemm_fp8_lane16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wv, const float* __restrict__ ws,
    float* __restrict__ y, int M, int N, int K, int bn, int bk, int rows_per_block) {
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_body(x, DqFp8(wv, ws, N, K, bn, bk), y, M, N, K, rows_per_block, part);
}

extern "C" __global__ void __launch_bounds__(256) gemm_fp8_lane16_bf16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wv, const float* __restrict__ ws,
    __nv_bfloat16* __restrict__ y, int M, int N, int K, int bn, int bk, int rows_per_block) {
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_body(x, DqFp8(wv, ws, N, K, bn, bk), y, M, N, K, rows_per_block, part);
}

extern "C" __global__ void __launch_bounds__(256) gemm_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wv, const unsigned char* __restrict__ ws,
    const float* __restrict__ ws2,
    float* __restrict__ y, int M, int N, int K, int rows_per_block) {
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_body(x, DqNvfp4(wv, ws, ws2, N, K), y, M, N, K, rows_per_block, part);
}

extern "C" __global__ void __launch_bounds__(256) gemm_nvfp4_lane16_bf16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wv, const unsigned char* __restrict__ ws,
    const float* __restrict__ ws2,
    __nv_bfloat16* __restrict__ y, int M, int N, int K, int rows_per_block) {
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_body(x, DqNvfp4(wv, ws, ws2, N, K), y, M, N, K, rows_per_block, part);
}

// The grouped expert GEMM over quantised expert stacks: [E, ...] values and scales, ws2 [E] (NVFP4).
extern "C" __global__ void __launch_bounds__(256) gemm_grouped_fp8_lane16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wv, const float* __restrict__ ws,
    const int* __restrict__ group, float* __restrict__ y, int M, int N, int K, int E, int bn, int bk,
    int rows_per_block) {
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_grouped_body(x, DqFp8(wv, ws, N, K, bn, bk), group, y, M, N, K, E, rows_per_block, part);
}

extern "C" __global__ void __launch_bounds__(256) gemm_grouped_fp8_lane16_bf16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wv, const float* __restrict__ ws,
    const int* __restrict__ group, __nv_bfloat16* __restrict__ y, int M, int N, int K, int E, int bn, int bk,
    int rows_per_block) {
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_grouped_body(x, DqFp8(wv, ws, N, K, bn, bk), group, y, M, N, K, E, rows_per_block, part);
}

extern "C" __global__ void __launch_bounds__(256) gemm_grouped_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wv, const unsigned char* __restrict__ ws,
    const float* __restrict__ ws2,
    const int* __restrict__ group, float* __restrict__ y, int M, int N, int K, int E, int rows_per_block) {
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_grouped_body(x, DqNvfp4(wv, ws, ws2, N, K), group, y, M, N, K, E, rows_per_block, part);
}

extern "C" __global__ void __launch_bounds__(256) gemm_grouped_nvfp4_lane16_bf16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wv, const unsigned char* __restrict__ ws,
    const float* __restrict__ ws2,
    const int* __restrict__ group, __nv_bfloat16* __restrict__ y, int M, int N, int K, int E, int rows_per_block) {
  __shared__ float part[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  gemm_grouped_body(x, DqNvfp4(wv, ws, ws2, N, K), group, y, M, N, K, E, rows_per_block, part);
}
