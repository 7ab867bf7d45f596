// swiglu.cuh -- SwiGLU of one (gate, up) pair, shared by moe.cu's swiglu and the fused decode GEMVs' epilogue so all
// compute the same bits: bf16(silu(min(g, L))) * clip(u, -L, L) in fp32 (the caller rounds it to bf16).
#pragma once
#include "common.cuh"
#include "exp_f32.cuh"

static __device__ __forceinline__ float swiglu_f32(float g, float u, int has_limit, float limit) {
  if (has_limit) {  // comparisons written so that NaN passes through, as np.minimum / np.clip do
    g = (g > limit) ? limit : g;
    u = (u < -limit) ? -limit : u;
    u = (u > limit) ? limit : u;
  }
  return bf16_round(g * sigmoid_f32(g)) * u;
}
