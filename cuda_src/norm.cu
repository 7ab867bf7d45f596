// norm.cu -- row norms in lane-16 order (cupyglm/backend/numpy_ops.py: rmsnorm, layernorm).
//
// One block per row (grid = rows), NORM_THREADS threads.  Sums over D: threads 0..15 each sum lane
// `tid` (terms tid, tid+16, ... in increasing order from +0.0) into shared memory; thread 0 folds the 16
// lanes (i += i+8, +4, +2, +1) and computes the row's scalar; then every thread writes its columns.
// 1 / sqrtf (not rsqrtf) as the reference does 1 / sqrt; bf16 rounding exactly where the reference
// rounds.  No FMA contraction (--fmad=false / -ffp-contract=off), so the bits equal NumPy's.
#include "common.cuh"

#define NORM_LANES 16

// out = bf16(w * bf16(x * (1 / sqrt(sum(x*x) / D + eps)))), per row.
extern "C" __global__ void rmsnorm_rows(const float* __restrict__ x,   // [rows, D] f32 (bf16 values)
                                        const float* __restrict__ w,   // [D] f32 (bf16 values)
                                        float* __restrict__ out,       // [rows, D] f32 (bf16 values)
                                        int D, float eps) {
  __shared__ float lanes[NORM_LANES];
  __shared__ float scale;
  const int tid = threadIdx.x;
  const float* xr = x + (long long)blockIdx.x * D;
  float* orow = out + (long long)blockIdx.x * D;
  if (tid < NORM_LANES) {
    float acc = 0.0f;
    for (int i = tid; i < D; i += NORM_LANES) {
      const float p = xr[i] * xr[i];
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
  for (int i = tid; i < D; i += blockDim.x) orow[i] = bf16_round(w[i] * bf16_round(xr[i] * r));
}

// out = bf16(((x - mean) * (1 / sqrt(var + eps))) * w + b), population variance, per row.
extern "C" __global__ void layernorm_rows(const float* __restrict__ x,   // [rows, D] f32 (bf16 values)
                                          const float* __restrict__ w,   // [D] f32 (bf16 values)
                                          const float* __restrict__ b,   // [D] f32 (bf16 values)
                                          float* __restrict__ out,       // [rows, D] f32 (bf16 values)
                                          int D, float eps) {
  __shared__ float lanes[NORM_LANES];
  __shared__ float mean_s, scale_s;
  const int tid = threadIdx.x;
  const float* xr = x + (long long)blockIdx.x * D;
  float* orow = out + (long long)blockIdx.x * D;
  const float n = (float)D;
  if (tid < NORM_LANES) {
    float acc = 0.0f;
    for (int i = tid; i < D; i += NORM_LANES) acc = acc + xr[i];
    lanes[tid] = acc;
  }
  __syncthreads();
  if (tid == 0) mean_s = lane16_fold_array(lanes) / n;
  __syncthreads();
  const float mean = mean_s;
  if (tid < NORM_LANES) {
    float acc = 0.0f;
    for (int i = tid; i < D; i += NORM_LANES) {
      const float d = xr[i] - mean;
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
    const float d = xr[i] - mean;
    const float t = (d * r) * w[i];
    orow[i] = bf16_round(t + b[i]);
  }
}
