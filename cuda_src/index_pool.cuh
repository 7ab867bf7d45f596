// index_pool.cuh -- one channel of one pooled index key (index_pool and index_tail_pool share it, so a pool
// completed by a decode row and one completed in a prompt chunk are the same bits).
// Reference: NumpyOps.index_pool in cupyglm/backend/numpy_ops.py.
#pragma once
#include "common.cuh"
#include "exp_f32.cuh"

#define IDX_MAX_KPOOL 8  // pool members <= 8 (the model has 4)

// k[j], g[j]: member j's index key and gate at channel d (bf16 values as float), j = 0..KP-1 in position order.
// l_j = g_j + ape[j, d]; e_j = exp(l_j - max l); s = ((e0 + e1) + e2) + e3;
// returns sum_j bf16(bf16(e_j / s) * k_j), j left to right (the caller rounds it to bf16).
static __device__ __forceinline__ float idx_pool_channel(const float* k, const float* g,
                                                         const __nv_bfloat16* __restrict__ ape, int KP, int I,
                                                         int d) {
  float l[IDX_MAX_KPOOL];
  float m = 0.0f;
  for (int j = 0; j < KP; ++j) {
    l[j] = g[j] + ld_bf16(ape, (long long)j * I + d);
    m = (j == 0 || l[j] > m) ? l[j] : m;
  }
  float s = 0.0f;
  for (int j = 0; j < KP; ++j) {
    l[j] = exp_f32(l[j] - m);
    s = (j == 0) ? l[j] : s + l[j];
  }
  float acc = 0.0f;
  for (int j = 0; j < KP; ++j) {
    const float tj = bf16_round(bf16_round(l[j] / s) * k[j]);
    acc = (j == 0) ? tj : acc + tj;
  }
  return acc;
}
