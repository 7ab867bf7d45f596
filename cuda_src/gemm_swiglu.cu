// gemm_swiglu.cu -- the gate/up projections and SwiGLU in one kernel: out[m, n] = bf16(swiglu(bf16(g), bf16(u)))
// with g = sum_k x[m, k] * wg[e, n, k] and u = sum_k x[m, k] * wu[e, n, k], each in lane-16 order (gemm.cu),
// e = group[m] (the MoE's experts, gemm_grouped_swiglu_lane16) or 0 (a dense MLP, gemm_swiglu_lane16).
//
// Bit for bit the unfused reference swiglu(gemm(x, wg, out="bf16"), gemm(x, wu, out="bf16"), limit): each sum
// is gemm.cu's (same lanes, same fold, rounded once to bf16), and the epilogue is moe.cu's swiglu
// (swiglu.cuh).  Row m's bits depend on nothing but row m: as in gemm.cu, rows_per_block and the other rows
// of the call change no bit.  Saves two launches and the [M, N] bf16 gate and up round trips.
//
// Launch as gemm.cu: block (16, GEMM_OUTS), grid (ceil(M / rows_per_block), ceil(N / GEMM_OUTS)).  A row whose
// expert id is outside [0, E) (the launcher refuses those) reads nothing and gets NaN.
#include "common.cuh"
#include "gemm_tile.cuh"
#include "swiglu.cuh"
#include "dequant.cuh"


template <typename W>
static __device__ __forceinline__ void gemm_swiglu_body(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const W& wg,                            // [E, N, K] gate weights: WBf16, DqFp8 or DqNvfp4
    const W& wu,                            // [E, N, K] up weights, the same kind
    const int* __restrict__ group,          // [M] int32 expert ids, or nullptr: every row expert 0
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16
    int M, int N, int K, int E, int rows_per_block, int has_limit, float limit) {
  __shared__ float pg[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  __shared__ float pu[GEMM_OUTS][GEMM_ROWS][GEMM_LANES + 1];
  const int lane = threadIdx.x;
  const int o = threadIdx.y;
  const int n = blockIdx.y * GEMM_OUTS + o;
  const int m0 = blockIdx.x * rows_per_block;
  const int nrows = min(rows_per_block, M - m0);

  int g[GEMM_ROWS];
#pragma unroll
  for (int r = 0; r < GEMM_ROWS; ++r) {
    const int e = r < nrows ? (group ? group[m0 + r] : 0) : -1;
    g[r] = (e >= 0 && e < E) ? e : -1;
  }
  float ag[GEMM_ROWS], au[GEMM_ROWS];
#pragma unroll
  for (int r = 0; r < GEMM_ROWS; ++r) ag[r] = au[r] = 0.0f;
  if (n < N) {
    const __nv_bfloat16* xr = x + (long long)m0 * K;
    for (int k = lane; k < K; k += GEMM_LANES) {
      int ge = -1;
      float wgv = 0.0f, wuv = 0.0f;
#pragma unroll
      for (int r = 0; r < GEMM_ROWS; ++r) {
        if (g[r] >= 0) {
          if (g[r] != ge) {                    // one load per run of rows of one expert
            ge = g[r];
            wgv = wg.at(ge, n, k);
            wuv = wu.at(ge, n, k);
          }
          const float xv = ld_bf16(xr, (long long)r * K + k);
          const float pgv = xv * wgv, puv = xv * wuv;
          ag[r] = ag[r] + pgv;
          au[r] = au[r] + puv;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < GEMM_ROWS; ++r) {
    pg[o][r][lane] = ag[r];
    pu[o][r][lane] = au[r];
  }
  __syncthreads();
  if (n < N && lane < nrows) {
    const int e = group ? group[m0 + lane] : 0;
    const float v = (e >= 0 && e < E)
        ? swiglu_f32(bf16_round(gemm_fold16(pg[o][lane])), bf16_round(gemm_fold16(pu[o][lane])), has_limit, limit)
        : NAN;
    y[(long long)(m0 + lane) * N + n] = to_bf16(v);
  }
}

extern "C" __global__ void __launch_bounds__(256) gemm_swiglu_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const __nv_bfloat16* __restrict__ wg,   // [N, K] bf16 gate_proj
    const __nv_bfloat16* __restrict__ wu,   // [N, K] bf16 up_proj
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16
    int M, int N, int K, int rows_per_block, int has_limit, float limit) {
  gemm_swiglu_body(x, WBf16(wg, N, K), WBf16(wu, N, K), nullptr, y, M, N, K, 1, rows_per_block, has_limit, limit);
}

extern "C" __global__ void __launch_bounds__(256) gemm_grouped_swiglu_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const __nv_bfloat16* __restrict__ wg,   // [E, N, K] bf16 experts' gate_proj
    const __nv_bfloat16* __restrict__ wu,   // [E, N, K] bf16 experts' up_proj
    const int* __restrict__ group,          // [M] int32 expert id of each row
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16
    int M, int N, int K, int E, int rows_per_block, int has_limit, float limit) {
  gemm_swiglu_body(x, WBf16(wg, N, K), WBf16(wu, N, K), group, y, M, N, K, E, rows_per_block, has_limit, limit);
}

// Quantised gate/up weights (dequant.cuh; layouts as in gemm.cu's quantised kernels), dequantised in registers.
extern "C" __global__ void __launch_bounds__(256) gemm_swiglu_fp8_lane16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wgv, const float* __restrict__ wgs,
    const unsigned char* __restrict__ wuv, const float* __restrict__ wus,
    __nv_bfloat16* __restrict__ y, int M, int N, int K, int bn, int bk, int rows_per_block,
    int has_limit, float limit) {
  gemm_swiglu_body(x, DqFp8(wgv, wgs, N, K, bn, bk), DqFp8(wuv, wus, N, K, bn, bk), nullptr, y, M, N, K, 1,
      rows_per_block, has_limit, limit);
}

extern "C" __global__ void __launch_bounds__(256) gemm_swiglu_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wgv,
    const unsigned char* __restrict__ wgs, const float* __restrict__ wgs2,
    const unsigned char* __restrict__ wuv, const unsigned char* __restrict__ wus, const float* __restrict__ wus2,
    __nv_bfloat16* __restrict__ y, int M, int N, int K, int rows_per_block,
    int has_limit, float limit) {
  gemm_swiglu_body(x, DqNvfp4(wgv, wgs, wgs2, N, K), DqNvfp4(wuv, wus, wus2, N, K), nullptr, y, M, N, K, 1,
      rows_per_block, has_limit, limit);
}

extern "C" __global__ void __launch_bounds__(256) gemm_grouped_swiglu_fp8_lane16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wgv, const float* __restrict__ wgs,
    const unsigned char* __restrict__ wuv, const float* __restrict__ wus,
    const int* __restrict__ group, __nv_bfloat16* __restrict__ y, int M, int N, int K, int E, int bn, int bk,
    int rows_per_block,
    int has_limit, float limit) {
  gemm_swiglu_body(x, DqFp8(wgv, wgs, N, K, bn, bk), DqFp8(wuv, wus, N, K, bn, bk), group, y, M, N, K, E,
      rows_per_block, has_limit, limit);
}

extern "C" __global__ void __launch_bounds__(256) gemm_grouped_swiglu_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ x, const unsigned char* __restrict__ wgv,
    const unsigned char* __restrict__ wgs, const float* __restrict__ wgs2,
    const unsigned char* __restrict__ wuv, const unsigned char* __restrict__ wus, const float* __restrict__ wus2,
    const int* __restrict__ group, __nv_bfloat16* __restrict__ y, int M, int N, int K, int E, int rows_per_block,
    int has_limit, float limit) {
  gemm_swiglu_body(x, DqNvfp4(wgv, wgs, wgs2, N, K), DqNvfp4(wuv, wus, wus2, N, K), group, y, M, N, K, E,
      rows_per_block, has_limit, limit);
}
