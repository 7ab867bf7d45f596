// moe_route.cuh -- one token's routing (NumpyOps.moe_route): sigmoid scores + correction bias, top-k with ties
// to the lower id, weights renormalised in pick order; shared by moe.cu's moe_route and moe_sort.cu's
// moe_route_sort, so both give the same bits.
#pragma once
#include "common.cuh"
#include "exp_f32.cuh"

#define MOE_MAX_K 32  // moe_route: experts per token <= 32 (the model has 8)

// Total order of the pick: larger value first, NaN after every number, ties to the lower id; id < 0 is
// "nothing yet".  The same order as numpy's stable argsort of -(score + bias).
static __device__ __forceinline__ bool moe_better(float a, int ia, float b, int ib) {
  if (ia < 0) return false;
  if (ib < 0) return true;
  const bool na = a != a, nb = b != b;
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// Token t by one whole warp (lane = its lane); score: 2 * E floats of shared memory of this warp.
static __device__ __forceinline__ void moe_route_token(const float* __restrict__ logits, const float* __restrict__ bias,
                                                       int* ids, float* weights, int t, int E, int k, float scale,
                                                       float* score, int lane) {
  float* sel = score + E;
  for (int e = lane; e < E; e += 32) {
    const float s = sigmoid_f32(logits[(long long)t * E + e]);
    score[e] = s;
    sel[e] = s + bias[e];
  }
  __syncwarp();
  int pick[MOE_MAX_K];
  for (int r = 0; r < k; ++r) {
    float bv = 0.0f;
    int bi = -1;
    for (int e = lane; e < E; e += 32) {
      bool taken = false;
      for (int q = 0; q < r; ++q) taken = taken || pick[q] == e;
      if (!taken && moe_better(sel[e], e, bv, bi)) { bv = sel[e]; bi = e; }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(FULL_MASK, bv, off);
      const int oi = __shfl_xor_sync(FULL_MASK, bi, off);
      if (moe_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    pick[r] = bi;
  }
  if (lane == 0) {
    float total = 0.0f;
    for (int r = 0; r < k; ++r) total = (r == 0) ? score[pick[r]] : total + score[pick[r]];
    total = total + 1e-20f;
    for (int r = 0; r < k; ++r) {
      ids[(long long)t * k + r] = pick[r];
      weights[(long long)t * k + r] = score[pick[r]] / total * scale;
    }
  }
  __syncwarp();                     // the warp's scores are read before its next token overwrites them
}
