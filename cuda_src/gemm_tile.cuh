// gemm_tile.cuh -- what the lane-16 GEMV kernels share (gemv_tile.cuh): the block shape and the fold of
// one (row, column)'s 16 lane partials in the reference's butterfly (common.cuh), or, in the planted control variant
// of the contract, in the wrong order (1, 2, 4, 8 instead of 8, 4, 2, 1).
#pragma once
#include "common.cuh"

#define GEMM_LANES 16
#define GEMM_OUTS 16
#define GEMM_ROWS 8

static __device__ __forceinline__ float gemm_fold16(const float* p) {
#ifdef CONTROL_WRONG_ORDER
  float t[GEMM_LANES];
#pragma unroll
  for (int i = 0; i < GEMM_LANES; ++i) t[i] = p[i];
#pragma unroll
  for (int s = 1; s < GEMM_LANES; s <<= 1)
    for (int i = 0; i < GEMM_LANES; i += 2 * s) t[i] = t[i] + t[i + s];
  return t[0];
#else
  return lane16_fold_array(p);
#endif
}

// A bf16 weight read as the quantised readers of dequant.cuh are: at(e, n, k) = w[e, n, k] (E experts or heads).
struct WBf16 {
  const __nv_bfloat16* __restrict__ w;   // [E, N, K] bf16
  int N, K;
  __device__ WBf16(const __nv_bfloat16* w_, int N_, int K_) : w(w_), N(N_), K(K_) {}
  __device__ __forceinline__ float at(long long e, int n, int k) const {
    return ld_bf16(w, (e * N + n) * (long long)K + k);
  }
};
