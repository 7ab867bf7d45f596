// kda_out.cuh -- the KDA output's gated RMS norm per (token, head) row of V (kda.cu's kda_out), the reference's
// bits (NumpyOps.kda_out): out = bf16(w * (y * r) * sigmoid(gate)), r = 1 / sqrt(sum(y^2) / V + eps), the sum in
// lane-16 order by one aligned group of 16 threads.
#pragma once
#include "common.cuh"
#include "exp_f32.cuh"

// r of the row yr[0..V) (every lane of the group gets it); an inactive group takes part in the fold (full-mask).
static __device__ __forceinline__ float kda_out_scale(const __nv_bfloat16* __restrict__ yr, int V, int lane,
                                                      bool active, float eps) {
  const float acc = lane16_sum_squares(yr, V, lane, active);
  return 1.0f / sqrtf(acc / (float)V + eps);
}

// One element of the normed row: norm weight wv, value yv, the row's r, gate gv (all bf16 values as floats).
static __device__ __forceinline__ __nv_bfloat16 kda_out_value(float wv, float yv, float r, float gv) {
  return to_bf16(wv * (yv * r) * sigmoid_f32(gv));
}
