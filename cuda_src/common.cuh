// common.cuh -- helpers shared by every kernel file (#include "common.cuh").
//
// Compiles under NVRTC (no host headers: cuda_bf16.h is found through -I
// <site-packages>/nvidia/cuda_runtime/include) and under the CPU emulator
// (cuda_src/sim/cuemu.h is force-included and defines __CUEMU__).
#pragma once

#ifndef __CUEMU__
#include <cuda_bf16.h>
#endif

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

#define FULL_MASK 0xffffffffu

// Load element i of a bf16 array as float (exact).
static __device__ __forceinline__ float ld_bf16(const __nv_bfloat16* __restrict__ p, long long i) {
  return __bfloat162float(p[i]);
}

// float -> bf16, round to nearest even (NaN -> 0x7FFF), same bits on GPU and CPU.
static __device__ __forceinline__ __nv_bfloat16 to_bf16(float x) { return __float2bfloat16_rn(x); }

// float -> bf16 (RN) -> float: the NumPy reference's bf16().
static __device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(to_bf16(x)); }

// Lane-16 fold inside each aligned group of 16 threads: lane i += lane i^8, ^4, ^2, ^1. Lane i < 8 gets
// lane i + lane i+8 exactly as the reference's fold (backend/lanes.py), and IEEE addition is commutative,
// so every lane of the group ends with the reference's bits. Full-mask: all 32 lanes of the warp must call it.
static __device__ __forceinline__ float lane16_fold(float v) {
  v += __shfl_xor_sync(FULL_MASK, v, 8, 16);
  v += __shfl_xor_sync(FULL_MASK, v, 4, 16);
  v += __shfl_xor_sync(FULL_MASK, v, 2, 16);
  v += __shfl_xor_sync(FULL_MASK, v, 1, 16);
  return v;
}

// The 16 lane partials p[0..15] folded in the reference's butterfly (lane i += lane i+8, +4, +2, +1), by one
// thread: the same bits as lane16_fold, for partials gathered in shared memory.
static __device__ __forceinline__ float lane16_fold_array(const float* p) {
  float t[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) t[i] = p[i];
#pragma unroll
  for (int width = 8; width > 0; width >>= 1)
#pragma unroll
    for (int i = 0; i < width; ++i) t[i] = t[i] + t[i + width];
  return t[0];
}

// Sum of squares of the bf16 values xr[0..n) in lane-16 order by one aligned group of 16 threads (lane = thread & 15), folded.
// Inactive groups pass active=false and still take part in the fold (full-mask).
static __device__ __forceinline__ float lane16_sum_squares(const __nv_bfloat16* xr, int n, int lane,
                                                           bool active) {
  float acc = 0.0f;
  if (active)
    for (int k = lane; k < n; k += 16) {
      const float v = ld_bf16(xr, k);
      acc += v * v;
    }
  return lane16_fold(acc);
}

// Sum over the 32 lanes of a warp with a fixed butterfly order (offsets 16, 8,
// 4, 2, 1).  Every lane gets the same, order-deterministic result.  Must be
// called by all 32 lanes (full-mask, convergent).
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
  return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
  return v;
}

// Integer ceil-div for launch-shape arithmetic inside kernels.
static __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }
