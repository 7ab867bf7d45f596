// gemv_swiglu.cu -- the decode/verify form of gemm_swiglu.cu: out[m, n] = bf16(swiglu(bf16(g), bf16(u))) with
// g = sum_k x[m, k] * wg[e, n, k], u = sum_k x[m, k] * wu[e, n, k] in the decode order, e = group[m] (the MoE's
// experts, gemv_grouped_swiglu_lane16) or 0 (a dense MLP, gemv_swiglu_lane16), for a call's decode/verify rows.
// Both weights stream once per call for every GEMV_ROWS rows (gemv_tc.cuh with NW = 2: the tensor core's order of
// backend/tc_order.py); the roundings and the swiglu.cuh epilogue are gemm_swiglu.cu's.
//
// Launch: block (16, GEMV_OUTS); dense grid (ceil(N / GEMV_OUTS), ceil(rows / GEMV_ROWS)); grouped grid
// (ceil(N / GEMV_OUTS), M), one block per run of equal expert ids as in gemv.cu; an id outside [0, E) gets NaN
// and is counted into the guard slot, as in gemv.cu.
#include "common.cuh"
#include "gemv_tc.cuh"
#include "swiglu.cuh"

static __device__ __forceinline__ float gemv_swiglu_out(const float v[2], int has_limit, float limit) {
  return swiglu_f32(bf16_round(v[0]), bf16_round(v[1]), has_limit, limit);
}

extern "C" __global__ void __launch_bounds__(256) gemv_swiglu_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const __nv_bfloat16* __restrict__ wg,   // [N, K] bf16 gate_proj
    const __nv_bfloat16* __restrict__ wu,   // [N, K] bf16 up_proj
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16: rows [0, rows) written
    int M, int N, int K, int rows, int has_limit, float limit) {
  __shared__ __align__(16) GemvTcShared<2> sh;
  const int n0 = blockIdx.x * GEMV_OUTS, m0 = blockIdx.y * GEMV_ROWS;
  GemvSrc<2> src;
  src.w[0] = wg + (long long)n0 * K;
  src.w[1] = wu + (long long)n0 * K;
  src.x = x + (long long)m0 * K;
  src.ncols = min(GEMV_OUTS, N - n0);
  src.nrows = min(GEMV_ROWS, rows - m0);
  src.K = K;
  src.vec = gemv_aligned(x, wg, K) && gemv_aligned(wu, wu, K);
  float v[2];
  gemv_tc_rows(sh, src, v);
  const int lane = threadIdx.x, o = threadIdx.y, n = n0 + o;
  if (n < N && lane < src.nrows) y[(long long)(m0 + lane) * N + n] = to_bf16(gemv_swiglu_out(v, has_limit, limit));
}

extern "C" __global__ void __launch_bounds__(256) gemv_grouped_swiglu_lane16(
    const __nv_bfloat16* __restrict__ x,    // [M, K] bf16
    const __nv_bfloat16* __restrict__ wg,   // [E, N, K] bf16 experts' gate_proj
    const __nv_bfloat16* __restrict__ wu,   // [E, N, K] bf16 experts' up_proj
    const int* __restrict__ group,          // [M] int32 expert id of each row (sorted: each slice read once)
    __nv_bfloat16* __restrict__ y,          // [M, N] bf16
    int M, int N, int K, int E, int has_limit, float limit,
    unsigned int* __restrict__ flags,       // [slots, 2] u32 guard flags
    int slot) {                             // the slot of "group holds expert ids outside [0, E)", or -1
  __shared__ __align__(16) GemvTcShared<2> sh;
  const int m = blockIdx.y;
  const int g = group[m];
  if (m > 0 && group[m - 1] == g) return;          // not the start of a run: the whole block leaves together
  int end = m + 1;
  while (end < M && group[end] == g) ++end;
  const bool valid = g >= 0 && g < E;
  if (!valid) gemv_flag_run(flags, slot, m, end);
  const int n0 = blockIdx.x * GEMV_OUTS;
  const long long at = ((long long)(valid ? g : 0) * N + n0) * K;
  GemvSrc<2> src;
  src.w[0] = wg + at;
  src.w[1] = wu + at;
  src.ncols = valid ? min(GEMV_OUTS, N - n0) : 0;
  src.K = valid ? K : 0;
  src.vec = gemv_aligned(x, wg, K) && gemv_aligned(wu, wu, K);
  const int lane = threadIdx.x, o = threadIdx.y, n = n0 + o;
  for (int m0 = m; m0 < end; m0 += GEMV_ROWS) {
    const int nrows = min(GEMV_ROWS, end - m0);
    src.x = x + (long long)m0 * K;
    src.nrows = valid ? nrows : 0;
    float v[2];
    gemv_tc_rows(sh, src, v);
    if (n < N && lane < nrows)
      y[(long long)(m0 + lane) * N + n] = to_bf16(valid ? gemv_swiglu_out(v, has_limit, limit) : NAN);
  }
}
