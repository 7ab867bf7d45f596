// gemv_grouped.cuh -- the grouped (MoE) decode GEMV's block, shared by gemv.cu's gemv_grouped_lane16(_bf16),
// gemv_multi.cu's gemv_grouped_dense_lane16 and moe_decode.cu's moe_down_combine_lane16: y[m, n] = sum_k x[m, k] *
// w[group[m], n, k] in the decode order (gemv_tc.cuh) for block y = m when row m starts a run of equal expert ids
// (the run taken GEMV_ROWS rows at a time; an expert's slice read once per run); an id outside [0, E) reads
// nothing, gets NaN and is counted into guard slot `slot`.  gemv_dense_group: one row group of a plain GEMV (fp32)
// by the same body.
#pragma once
#include "common.cuh"
#include "gemv_tc.cuh"

static __device__ __forceinline__ void gemv_store(float* y, long long i, float v) { y[i] = v; }
static __device__ __forceinline__ void gemv_store(__nv_bfloat16* y, long long i, float v) { y[i] = to_bf16(v); }

// Rows [m, end) of x against this block's GEMV_OUTS columns, whose weight rows src.w[0] points at (src.ncols,
// src.K, src.vec set by the caller); y[row, n0 + o], or NaN (nothing read: src.K = 0) when !valid.
template <typename Out>
static __device__ __forceinline__ void gemv_run_rows(GemvTcShared<1>& sh, GemvSrc<1>& src, const __nv_bfloat16* x,
                                                     Out* y, int m, int end, int N, int n0, bool valid) {
  const int lane = threadIdx.x, o = threadIdx.y, n = n0 + o;
  for (int m0 = m; m0 < end; m0 += GEMV_ROWS) {
    const int nrows = min(GEMV_ROWS, end - m0);
    src.x = x + (long long)m0 * src.K;
    src.nrows = valid ? nrows : 0;
    float v[1];
    gemv_tc_rows(sh, src, v);
    if (n < N && lane < nrows) gemv_store(y, (long long)(m0 + lane) * N + n, valid ? v[0] : NAN);
  }
}

// sh: the caller's shared memory (a kernel with several block forms shares one).
template <typename Out>
static __device__ __forceinline__ void gemv_grouped_run(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [E, N, K] bf16
    const int* __restrict__ group,         // [M] int32: expert id of each row
    Out* __restrict__ y,                   // [M, N] fp32 or bf16
    int M, int N, int K, int E, unsigned int* flags, int slot, GemvTcShared<1>& sh) {
  const int m = blockIdx.y;
  const int g = group[m];
  if (m > 0 && group[m - 1] == g) return;          // not the start of a run: the whole block leaves together
  int end = m + 1;
  while (end < M && group[end] == g) ++end;
  const bool valid = g >= 0 && g < E;
  if (!valid) gemv_flag_run(flags, slot, m, end);
  const int n0 = blockIdx.x * GEMV_OUTS;
  GemvSrc<1> src;
  src.w[0] = w + ((long long)(valid ? g : 0) * N + n0) * K;
  src.ncols = valid ? min(GEMV_OUTS, N - n0) : 0;
  src.K = valid ? K : 0;
  src.vec = gemv_aligned(x, w, K);
  gemv_run_rows(sh, src, x, y, m, end, N, n0, valid);
}

// Row group g (rows [g * GEMV_ROWS, ...) of M) of the plain GEMV y[m, n] = sum_k x[m, k] * w[n, k], fp32, for the
// column block blockIdx.x: the bits of gemv.cu's gemv_lane16.
static __device__ __forceinline__ void gemv_dense_group(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [N, K] bf16
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K, int g, GemvTcShared<1>& sh) {
  const int n0 = blockIdx.x * GEMV_OUTS;
  GemvSrc<1> src;
  src.w[0] = w + (long long)n0 * K;
  src.ncols = min(GEMV_OUTS, N - n0);
  src.K = K;
  src.vec = gemv_aligned(x, w, K);
  gemv_run_rows(sh, src, x, y, g * GEMV_ROWS, min(M, (g + 1) * GEMV_ROWS), N, n0, true);
}
