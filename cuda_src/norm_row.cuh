// norm_row.cuh -- one row's RMSNorm in lane-16 order, shared by norm.cu's rmsnorm_rows, hc.cu's hc_pre_norm
// (the norm fused after the streams' collapse) and gemv_norm.cu's GEMV prologue (its lane sum, scale and element),
// so all give the reference's bits (NumpyOps.rmsnorm):
// out = bf16(w * bf16(x * (1 / sqrt(sum(x*x) / D + eps)))).  Threads 0..15 each sum lane `tid` (terms tid,
// tid+16, ... in increasing order from +0.0), thread 0 folds the 16 lanes (i += i+8, +4, +2, +1); then every
// thread writes its columns.  The row is read through rd(i), a float holding a bf16 value.
// layernorm_row: one row's LayerNorm with the same lanes, shared by norm.cu's layernorm_rows and kv.cu's latent
// write (the DSA index keys normed in the same launch).
#pragma once
#include "common.cuh"

#define NORM_LANES 16

// Lane `lane` (0..15) of the row's sum of squares: terms lane, lane+16, ... in increasing order from +0.0.
template <typename Read>
static __device__ __forceinline__ float rmsnorm_lane(const Read& rd, int D, int lane) {
  float acc = 0.0f;
  for (int i = lane; i < D; i += NORM_LANES) {
    const float xv = rd(i);
    const float p = xv * xv;
    acc = acc + p;
  }
  return acc;
}

// The row's scale from its folded sum of squares (the GEMV prologue of gemv_norm.cu shares it).
static __device__ __forceinline__ float rmsnorm_scale(float sumsq, int D, float eps) {
  const float ms = sumsq / (float)D;
  return 1.0f / sqrtf(ms + eps);
}

// Element i of the normed row: bf16(w_i * bf16(x_i * r)).
static __device__ __forceinline__ __nv_bfloat16 rmsnorm_value(float xv, float wv, float r) {
  return to_bf16(wv * bf16_round(xv * r));
}

// Every thread of the block calls it (barriers inside).
template <typename Read>
static __device__ __forceinline__ void rmsnorm_row(const Read& rd, const __nv_bfloat16* __restrict__ w,
                                                   __nv_bfloat16* __restrict__ orow, int D, float eps) {
  __shared__ float lanes[NORM_LANES];
  __shared__ float scale;
  const int tid = threadIdx.x;
  if (tid < NORM_LANES) lanes[tid] = rmsnorm_lane(rd, D, tid);
  __syncthreads();
  if (tid == 0) scale = rmsnorm_scale(lane16_fold_array(lanes), D, eps);
  __syncthreads();
  const float r = scale;
  for (int i = tid; i < D; i += blockDim.x) orow[i] = rmsnorm_value(rd(i), ld_bf16(w, i), r);
}

// One row's LayerNorm (NumpyOps.layernorm): out = bf16(((x - mean) * (1 / sqrt(var + eps))) * w + b), population
// variance; the mean and the variance are lane-16 sums like the RMSNorm's.  Every thread of the block calls it.
template <typename Read>
static __device__ __forceinline__ void layernorm_row(const Read& rd, const __nv_bfloat16* __restrict__ w,
                                                     const __nv_bfloat16* __restrict__ b,
                                                     __nv_bfloat16* __restrict__ orow, int D, float eps) {
  __shared__ float lanes[NORM_LANES];
  __shared__ float mean_s, scale_s;
  const int tid = threadIdx.x;
  const float n = (float)D;
  if (tid < NORM_LANES) {
    float acc = 0.0f;
    for (int i = tid; i < D; i += NORM_LANES) acc = acc + rd(i);
    lanes[tid] = acc;
  }
  __syncthreads();
  if (tid == 0) mean_s = lane16_fold_array(lanes) / n;
  __syncthreads();
  const float mean = mean_s;
  if (tid < NORM_LANES) {
    float acc = 0.0f;
    for (int i = tid; i < D; i += NORM_LANES) {
      const float d = rd(i) - mean;
      const float p = d * d;
      acc = acc + p;
    }
    lanes[tid] = acc;
  }
  __syncthreads();
  if (tid == 0) {
    const float var = lane16_fold_array(lanes) / n;
    scale_s = 1.0f / sqrtf(var + eps);
  }
  __syncthreads();
  const float r = scale_s;
  for (int i = tid; i < D; i += blockDim.x) {
    const float d = rd(i) - mean;
    const float t = (d * r) * ld_bf16(w, i);
    orow[i] = to_bf16(t + ld_bf16(b, i));
  }
}
