// moe_combine.cuh -- one output of the MoE's weighted combine (NumpyOps.moe_combine): out[t, d] = (sum_j
// w[t, j] * y[row(t, j), d], j in slot order from 0.0) + shared[t, d], fp32, where row(t, j) is t * k + j, or
// pos[t * k + j] when the experts' outputs are in expert-sorted order (moe_sort's pos).  A row outside
// [0, T * k) reads nothing and makes the output NaN.  Shared by moe.cu's combines and moe_decode.cu's down
// kernel, so both give the same bits; Y is a const float pointer, volatile where other blocks wrote y.
#pragma once
#include "common.cuh"

template <typename Y>
static __device__ __forceinline__ float moe_combine_at(Y y,                // [T * k, D] f32
                                                       const int* pos,     // [T * k] i32, or nullptr
                                                       const float* w,     // [T, k] f32
                                                       Y shared,           // [T, D] f32
                                                       int T, int k, int D, int t, int d) {
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) {
    const long long slot = (long long)t * k + j;
    const long long r = pos ? pos[slot] : slot;
    acc = (r >= 0 && r < (long long)T * k) ? acc + w[slot] * y[r * D + d] : NAN;
  }
  return acc + shared[(long long)t * D + d];
}
