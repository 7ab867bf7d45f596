// norm_row.cuh -- one row's RMSNorm in lane-16 order, shared by norm.cu's rmsnorm_rows and hc.cu's hc_pre_norm
// (the norm fused after the streams' collapse), so both give the reference's bits (NumpyOps.rmsnorm):
// out = bf16(w * bf16(x * (1 / sqrt(sum(x*x) / D + eps)))).  Threads 0..15 each sum lane `tid` (terms tid,
// tid+16, ... in increasing order from +0.0), thread 0 folds the 16 lanes (i += i+8, +4, +2, +1); then every
// thread writes its columns.  The row is read through rd(i), a float holding a bf16 value.
#pragma once
#include "common.cuh"

#define NORM_LANES 16

// Every thread of the block calls it (barriers inside).
template <typename Read>
static __device__ __forceinline__ void rmsnorm_row(const Read& rd, const __nv_bfloat16* __restrict__ w,
                                                   __nv_bfloat16* __restrict__ orow, int D, float eps) {
  __shared__ float lanes[NORM_LANES];
  __shared__ float scale;
  const int tid = threadIdx.x;
  if (tid < NORM_LANES) {
    float acc = 0.0f;
    for (int i = tid; i < D; i += NORM_LANES) {
      const float xv = rd(i);
      const float p = xv * xv;
      acc = acc + p;
    }
    lanes[tid] = acc;
  }
  __syncthreads();
  if (tid == 0) {
    const float ms = lane16_fold_array(lanes) / (float)D;
    scale = 1.0f / sqrtf(ms + eps);
  }
  __syncthreads();
  const float r = scale;
  for (int i = tid; i < D; i += blockDim.x) orow[i] = to_bf16(ld_bf16(w, i) * bf16_round(rd(i) * r));
}
