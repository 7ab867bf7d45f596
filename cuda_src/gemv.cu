// gemv.cu -- the decode/verify GEMM (DESIGN §3b): y[h, m, n] = sum_k x[h, m, k] * w[h, n, k] for the leading
// `rows` rows of a call, the rows whose role is decode or verify, streaming each bf16 weight from memory once per
// call for every GEMV_ROWS of them (gemv_tc.cuh: 16-byte loads straight into mma fragments, the tensor core's
// decode order of backend/tc_order.py, not gemm.cu's lane-16 order).  gemv_grouped_lane16 is the MoE form:
// y[m, n] = sum_k x[m, k] * w[group[m], n, k], an expert's slice read once per run of rows of that expert.
// Outputs fp32, or (_bf16) rounded once to bf16.
//
// Launch: block (16, GEMV_OUTS); grid (ceil(N / GEMV_OUTS), ceil(rows / GEMV_ROWS), H).
// Grouped: grid (ceil(N / GEMV_OUTS), M): block y = m works only if row m starts a run of equal expert ids
// (m = 0 or group[m - 1] != group[m]) and takes the run GEMV_ROWS rows at a time; an id outside [0, E) reads
// nothing, gets NaN and is counted into the guard slot `slot` of `flags` (guards.py: no separate check launch).
#include "common.cuh"
#include "gemv_tc.cuh"
#include "gemv_grouped.cuh"

template <typename Out>
static __device__ __forceinline__ void gemv_body(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    Out* __restrict__ y,                   // [H, M, N] fp32 or bf16
    int M, int N, int K, int rows) {
  __shared__ __align__(16) GemvTcShared<1> sh;
  const int n0 = blockIdx.x * GEMV_OUTS, m0 = blockIdx.y * GEMV_ROWS;
  const long long h = blockIdx.z;
  GemvSrc<1> src;
  src.w[0] = w + (h * N + n0) * (long long)K;
  src.x = x + (h * M + m0) * (long long)K;
  src.ncols = min(GEMV_OUTS, N - n0);
  src.nrows = min(GEMV_ROWS, rows - m0);
  src.K = K;
  src.vec = gemv_aligned(x, w, K);
  float v[1];
  gemv_tc_rows(sh, src, v);
  const int lane = threadIdx.x, o = threadIdx.y, n = n0 + o;
  if (n < N && lane < src.nrows) gemv_store(y, (h * M + m0 + lane) * (long long)N + n, v[0]);
}

// 2 blocks an SM (<= 128 registers): the 32-blocks of loads in flight take registers, never spills.
extern "C" __global__ void __launch_bounds__(256, 2) gemv_lane16(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    float* __restrict__ y,                 // [H, M, N] f32: rows [0, rows) of each head written
    int M, int N, int K, int rows) {       // rows <= M: the call's leading decode/verify rows
  gemv_body(x, w, y, M, N, K, rows);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_lane16_bf16(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    __nv_bfloat16* __restrict__ y,         // [H, M, N] bf16 (the fp32 sum rounded once): rows [0, rows)
    int M, int N, int K, int rows) {
  gemv_body(x, w, y, M, N, K, rows);
}

template <typename Out>
static __device__ __forceinline__ void gemv_grouped_body(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [E, N, K] bf16
    const int* __restrict__ group,         // [M] int32: expert id of each row
    Out* __restrict__ y,                   // [M, N] fp32 or bf16
    int M, int N, int K, int E, unsigned int* flags, int slot) {
  __shared__ __align__(16) GemvTcShared<1> sh;
  gemv_grouped_run(x, w, group, y, M, N, K, E, flags, slot, sh);
}

extern "C" __global__ void __launch_bounds__(256) gemv_grouped_lane16(
    const __nv_bfloat16* __restrict__ x,     // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,     // [E, N, K] bf16
    const int* __restrict__ group,           // [M] int32: expert id of each row (sorted: each slice read once)
    float* __restrict__ y,                   // [M, N] f32
    int M, int N, int K, int E,
    unsigned int* __restrict__ flags,        // [slots, 2] u32 guard flags
    int slot) {                              // the slot of "group holds expert ids outside [0, E)", or -1
  gemv_grouped_body(x, w, group, y, M, N, K, E, flags, slot);
}

extern "C" __global__ void __launch_bounds__(256) gemv_grouped_lane16_bf16(
    const __nv_bfloat16* __restrict__ x,     // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,     // [E, N, K] bf16
    const int* __restrict__ group,           // [M] int32
    __nv_bfloat16* __restrict__ y,           // [M, N] bf16 (the fp32 sum rounded once)
    int M, int N, int K, int E,
    unsigned int* __restrict__ flags,        // [slots, 2] u32 guard flags
    int slot) {
  gemv_grouped_body(x, w, group, y, M, N, K, E, flags, slot);
}
