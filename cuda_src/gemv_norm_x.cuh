// gemv_norm_x.cuh -- the x reader of a decode GEMV whose rows are rmsnorm(x), the norm computed in the prologue:
// gnr_rows puts the block's rows' scalars in shared memory (lane-16 sums, norm_row.cuh's code), GemvXRms builds each
// x chunk from the raw row, the norm weight and the scalar with the norm kernel's own element expression, so a GEMV
// through it has the bits of the norm launch followed by the plain GEMV (gemv_norm.cu, gemv_q_norm.cu).
// CONTROL_NORM_EPS (planted): the RMSNorm's eps left out of its scalar.
#pragma once
#include "common.cuh"
#include "gemv_tc.cuh"
#include "norm_row.cuh"

// x chunk of rmsnorm(x): row c of the block.  scale: [GEMV_ROWS] shared scalars.
struct GemvXRms {
  const __nv_bfloat16* x;      // the block's first row of x [.., K] bf16
  const __nv_bfloat16* w;      // [K] bf16 norm weight
  const float* scale;
  int K;
  bool vec;
  __device__ __forceinline__ uint4 load8(int c, int kk, int valid) const {
    unsigned short xb[8], wb[8], h[8];
    gemv_unpack8(gemv_load8(x + (long long)c * K + kk, valid, vec), xb);
    gemv_unpack8(gemv_load8(w + kk, valid, vec), wb);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      h[i] = i < valid ? __bfloat16_as_ushort(rmsnorm_value(gemv_bf(xb[i]), gemv_bf(wb[i]), scale[c])) : 0;
    return gemv_pack8(h);
  }
};

// Two floats rounded to a bf16 pair in one conversion (each the to_bf16 of its own value), lo in the low half.
static __device__ __forceinline__ unsigned gnr_pack(float lo, float hi) {
#ifdef __CUEMU__
  return (unsigned)__bfloat16_as_ushort(to_bf16(lo)) | ((unsigned)__bfloat16_as_ushort(to_bf16(hi)) << 16);
#else
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#endif
}

// GemvXRms's chunk of a whole aligned chunk (gemv_tc.cuh's WHOLE loop): rmsnorm_value's two roundings a pair at a
// time, the row's scalar read once; every element is inside the row, so no mask.
static __device__ __forceinline__ uint4 gtc_x_whole(const GemvXRms& xr, int c, int kk) {
  const uint4 xv = *reinterpret_cast<const uint4*>(xr.x + (long long)c * xr.K + kk);
  const uint4 wv = *reinterpret_cast<const uint4*>(xr.w + kk);
  const float r = xr.scale[c];
  const unsigned xs[4] = {xv.x, xv.y, xv.z, xv.w}, ws[4] = {wv.x, wv.y, wv.z, wv.w};
  unsigned o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned a = gnr_pack(gtc_lo(xs[i]) * r, gtc_hi(xs[i]) * r);
    o[i] = gnr_pack(gtc_lo(ws[i]) * gtc_lo(a), gtc_hi(ws[i]) * gtc_hi(a));
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

struct NormRowAt {            // norm_row.cuh's row reader over bf16 memory
  const __nv_bfloat16* xr;
  __device__ float operator()(int i) const { return ld_bf16(xr, i); }
};

// The block's rows [m0, m0 + GEMV_ROWS) of x [M, K] (those below rows): their scalars into scale [GEMV_ROWS] (group
// threadIdx.y sums row threadIdx.y), then the reader of their normed rows.  Every thread calls it (one barrier).
static __device__ __forceinline__ GemvXRms gnr_rows(float* scale, const __nv_bfloat16* x, const __nv_bfloat16* w,
                                                    int K, int rows, float eps) {
  const int m0 = blockIdx.y * GEMV_ROWS, c = threadIdx.y;
  const bool active = c < min(GEMV_ROWS, rows - m0);
  const NormRowAt rd = {x + (long long)(m0 + (active ? c : 0)) * K};
  const float sum = lane16_fold(active ? rmsnorm_lane(rd, K, threadIdx.x) : 0.0f);
#ifdef CONTROL_NORM_EPS
  if (active && threadIdx.x == 0) scale[c] = rmsnorm_scale(sum, K, 0.0f);
#else
  if (active && threadIdx.x == 0) scale[c] = rmsnorm_scale(sum, K, eps);
#endif
  __syncthreads();
  const GemvXRms xr = {x + (long long)m0 * K, w, scale, K, gemv_aligned(x, w, K)};
  return xr;
}
