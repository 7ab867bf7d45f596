// gemm_tc.cu -- the prompt-row GEMM on the tensor core (DESIGN §3b): y[h, m, n] = sum_k x[h, m, k] * w[h, n, k]
// by mma.m16n8k16 (mma.cuh), fp32 out (gemm_tc) or rounded once to bf16 in the epilogue (gemm_tc_bf16).
//
// Order: the decode GEMV's (cupyglm/backend/tc_order.py, gemv_tc.cuh), fixed by K alone.  K is cut into slices of
// GTC_SLICE; a slice is one chain of mma steps from +0.0 over its 32-blocks in ascending k, a block's two steps the
// decode GEMV's (gtc_block, so the same planted controls reach both); the slices' fp32 results are added in slice
// order.  An mma output element depends on its own row of A (x) and column of B (w) only, so a prompt row's bits
// are the decode row's: x and w swap the A / B roles of the GEMV, not the products or their k positions.
//
// Launch (every kernel here): GTS_THREADS threads (8 warps), GTS_STAGES * sizeof(GtsStage) + sizeof(GtsAcc) bytes
// of dynamic shared memory; grid (ceil(M / GTS_M), ceil(N / GTS_N), H): the rows on grid.x.  A block holds a
// 128-row by 256-column tile (-DGTS_SMALL: 64 x 128), its k-tiles staged through shared memory (gemm_tc_stage.cuh);
// warp w takes rows GTS_M / 2 (w % 2) .. + GTS_M / 2, columns GTS_N / 4 (w / 2) .. + GTS_N / 4.  Blocks split M, N and
// H, never K.  The grouped experts
// (gemm_tc_grouped, at the end) run the same tile once per expert among the block's rows, H = 1.
#include "common.cuh"
#include "mma.cuh"
#include "gemv_tc.cuh"
#include "gemm_tc_stage.cuh"

// The epilogue: fp32 as summed, or rounded once to bf16.
static __device__ __forceinline__ void gemm_tc_store(float* y, long long i, float v) { y[i] = v; }
static __device__ __forceinline__ void gemm_tc_store(__nv_bfloat16* y, long long i, float v) { y[i] = to_bf16(v); }

#define GTC_NO_EXPERT 0x7fffffff

// Row m's expert id, GTC_NO_EXPERT for a row past M or an id outside [0, E).
static __device__ __forceinline__ int gtc_expert(const int* group, int m, int M, int E) {
  const int e = m < M ? group[m] : -1;
  return e >= 0 && e < E ? e : GTC_NO_EXPERT;
}

// This warp's outputs of the block's tile (rows from m0, columns from n0) into y [M, N]: the rows below M,
// or (group) the rows whose expert is ex.
template <typename Out>
static __device__ __forceinline__ void gemm_tc_put(Out* y, float (*acc)[GTS_NT][4], int m0, int n0, int M,
                                                   int N, const int* group, int E, int ex) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < GTS_RT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + 16 * i + g + 8 * h;
      if (m >= M || (group && gtc_expert(group, m, M, E) != ex)) continue;
#pragma unroll
      for (int j = 0; j < GTS_NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {    // d[2h + e] = D[row g + 8h][column 2t + e] of tile (i, j)
          const int n = n0 + 8 * j + 2 * t + e;
          if (n < N) gemm_tc_store(y, (long long)m * N + n, acc[i][j][2 * h + e]);
        }
    }
}

// The dense tile (gemm_tc_stage.cuh): this warp's outputs of the block's GTS_M x GTS_N.
template <bool VEC, typename Out>
static __device__ __forceinline__ void gemm_tc_rows(
    unsigned char* sh,                     // [GTS_STAGES] GtsStage, then GtsAcc (shared)
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    Out* __restrict__ y,                   // [H, M, N] fp32 or bf16
    int M, int N, int K) {
  const int warp = threadIdx.x >> 5;
  const long long h = blockIdx.z;
  const int bm = blockIdx.x * GTS_M, bn = blockIdx.y * GTS_N;
  GtsSrc s = gts_src(x + h * M * (long long)K, w + h * N * (long long)K, bm, bn, M, N, K);
  float acc[GTS_RT][GTS_NT][4];
  gts_sum<VEC>(acc, reinterpret_cast<GtsStage*>(sh), *reinterpret_cast<GtsAcc*>(sh + GTS_STAGES * sizeof(GtsStage)),
               s);
  gemm_tc_put(y + h * M * (long long)N, acc, bm + 16 * GTS_RT * (warp & 1), bn + 8 * GTS_NT * (warp >> 1), M, N,
              nullptr, 0, 0);
}

// 16-byte copies where x, w and K allow them (block-uniform), else element loads: the same values either way.
template <typename Out>
static __device__ __forceinline__ void gemm_tc_body(unsigned char* sh, const __nv_bfloat16* __restrict__ x,
                                                    const __nv_bfloat16* __restrict__ w, Out* __restrict__ y, int M,
                                                    int N, int K) {
  if (gemv_aligned(x, w, K))
    gemm_tc_rows<true>(sh, x, w, y, M, N, K);
  else
    gemm_tc_rows<false>(sh, x, w, y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(GTS_THREADS, 1) gemm_tc(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    float* __restrict__ y,                 // [H, M, N] f32
    int M, int N, int K) {
  extern __shared__ __align__(16) unsigned char gtc_sh[];   // [GTS_STAGES] GtsStage, GtsAcc
  gemm_tc_body(gtc_sh, x, w, y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(GTS_THREADS, 1) gemm_tc_bf16(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    __nv_bfloat16* __restrict__ y,         // [H, M, N] bf16 (the fp32 sum rounded once)
    int M, int N, int K) {
  extern __shared__ __align__(16) unsigned char gtc_bf16_sh[];   // [GTS_STAGES] GtsStage, GtsAcc
  gemm_tc_body(gtc_bf16_sh, x, w, y, M, N, K);
}

// Grouped experts (the MoE's prompt rows): y[m, n] = sum_k x[m, k] * w[group[m], n, k], row m's bits those of
// gemm_tc(x[m:m+1], w[group[m]]) whatever rows share the call, sorted by expert or not.  Launch as gemm_tc with
// H = 1.  A block takes the distinct experts among its GTS_M rows in ascending id, runs the whole dense tile
// against that expert's columns and stores the rows of that id only (an mma output depends on its own row and
// column, so a row's bits do not depend on the other rows' experts).  A row whose id is outside [0, E) (the
// launcher refuses those) reads nothing and gets NaN.

// The block's smallest expert id above cur among its rows (block-uniform; GTC_NO_EXPERT when none).  Every
// thread takes part (barriers: the stages' last readers are done before the next expert's copies).
static __device__ __forceinline__ int gtc_next_expert(int* red, const int* group, int bm, int M, int E, int cur) {
  const int e = threadIdx.x < GTS_M ? gtc_expert(group, bm + threadIdx.x, M, E) : GTC_NO_EXPERT;
  int v = e > cur ? e : GTC_NO_EXPERT;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(FULL_MASK, v, off));
  __syncthreads();                         // red's last readers done
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < GTS_THREADS / 32; ++i) v = min(v, red[i]);
  return v;
}

template <bool VEC, typename Out>
static __device__ __forceinline__ void gemm_tc_grouped_rows(
    unsigned char* sh,                     // [GTS_STAGES] GtsStage, then GtsAcc (shared)
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [E, N, K] bf16
    const int* __restrict__ group,         // [M] int32: expert id of each row
    Out* __restrict__ y,                   // [M, N] fp32 or bf16
    int M, int N, int K, int E) {
  __shared__ int red[GTS_THREADS / 32];    // the warps' smallest ids
  const int warp = threadIdx.x >> 5, bm = blockIdx.x * GTS_M, bn = blockIdx.y * GTS_N;
  const int m0 = bm + 16 * GTS_RT * (warp & 1), n0 = bn + 8 * GTS_NT * (warp >> 1);
  float acc[GTS_RT][GTS_NT][4];
  for (int ex = gtc_next_expert(red, group, bm, M, E, -1); ex != GTC_NO_EXPERT;
       ex = gtc_next_expert(red, group, bm, M, E, ex)) {
    GtsSrc s = gts_src(x, w + (long long)ex * N * K, bm, bn, M, N, K);
    gts_sum<VEC>(acc, reinterpret_cast<GtsStage*>(sh),
                 *reinterpret_cast<GtsAcc*>(sh + GTS_STAGES * sizeof(GtsStage)), s);
    gemm_tc_put(y, acc, m0, n0, M, N, group, E, ex);
  }
#pragma unroll
  for (int i = 0; i < GTS_RT; ++i)
#pragma unroll
    for (int j = 0; j < GTS_NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = NAN;
  gemm_tc_put(y, acc, m0, n0, M, N, group, E, GTC_NO_EXPERT);
}

template <typename Out>
static __device__ __forceinline__ void gemm_tc_grouped_body(unsigned char* sh, const __nv_bfloat16* __restrict__ x,
                                                            const __nv_bfloat16* __restrict__ w,
                                                            const int* __restrict__ group, Out* __restrict__ y,
                                                            int M, int N, int K, int E) {
  if (gemv_aligned(x, w, K))             // K % 8 == 0: every expert's slice starts 16-byte aligned too
    gemm_tc_grouped_rows<true>(sh, x, w, group, y, M, N, K, E);
  else
    gemm_tc_grouped_rows<false>(sh, x, w, group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(GTS_THREADS, 1) gemm_tc_grouped(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [E, N, K] bf16
    const int* __restrict__ group,         // [M] int32: expert id of each row
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K, int E) {
  extern __shared__ __align__(16) unsigned char gtc_grouped_sh[];   // [GTS_STAGES] GtsStage, GtsAcc
  gemm_tc_grouped_body(gtc_grouped_sh, x, w, group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(GTS_THREADS, 1) gemm_tc_grouped_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [E, N, K] bf16
    const int* __restrict__ group,         // [M] int32: expert id of each row
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 sum rounded once)
    int M, int N, int K, int E) {
  extern __shared__ __align__(16) unsigned char gtc_grouped_bf16_sh[];   // [GTS_STAGES] GtsStage, GtsAcc
  gemm_tc_grouped_body(gtc_grouped_bf16_sh, x, w, group, y, M, N, K, E);
}
