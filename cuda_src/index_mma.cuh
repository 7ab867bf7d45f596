// index_mma.cuh -- the DSA indexer's scores on the tensor core: one warp scores one row against 16 pooled keys
// staged in shared memory. Reference: cupyglm/backend/tc_index.py (the exact model) and NumpyOps.index_scores.
//   dots: the row's heads as A (16-head tiles, heads past Hi zero), the keys as B (two tiles of 8 pools), a chain
//         over I from +0.0 in ascending k steps of 16 (I zero-padded to a multiple of 16); inside a step, position
//         p holds k = 4 ((p % 8) / 2) + p % 2 + 2 (p / 8), so a lane's A row g (a[0], a[2]) and its B pool g
//         (b[0], b[1]) are the 4 consecutive k 4t .. 4t + 3 of one 8-byte load (mma.cuh's layout, t = lane % 4).
//   epilogue (fp32): z = dot * qscale, relu, times hw[h] * hscale, added into head h's lane h % 16 in ascending
//         head tiles; the mma output gives a lane heads g and g + 8 (g = lane / 4) of each tile, so the lane-16 fold
//         (8, 4, 2, 1) is an in-thread add, then shuffles across g (lane xor 16, 8, 4).
// Heads past Hi add nothing (a lane's sum starts at +0 and never becomes -0, so a +0 term would not change it).
// Planted controls: CONTROL_IDX_REVERSED (the k steps descending), CONTROL_IDX_FOLD (the lanes folded 1, 2, 4, 8
// after the in-thread 8), CONTROL_IDX_IEEE (each step an IEEE fp32 multiply-add chain in k order).
#pragma once
#include "common.cuh"
#include "mma.cuh"

#define IDX_PAD 8          // bf16 past each staged key row: a half-warp's 8-byte loads fall in distinct banks
#define IDX_MAX_I 256      // the widest index head dimension (the model has 128)

#ifdef CONTROL_IDX_REVERSED
#define IDX_STEP(s, n) ((n) - 1 - (s))
#else
#define IDX_STEP(s, n) (s)
#endif

// The row stride of staged keys: I rounded up to 16, plus the pad.
static __device__ __forceinline__ int idx_ld(int I) { return (I + 15) / 16 * 16 + IDX_PAD; }

// Keys of np pools into kt [np, ld] bf16 (zero past I and for absent pools), 16 bytes a copy: key_row(r) gives the
// pooled row of staged pool r (< 0: a zero key). I % 8 == 0 (the launcher checks).
template <class KeyRow>
static __device__ __forceinline__ void idx_stage(__nv_bfloat16* kt, const __nv_bfloat16* __restrict__ keys, int np,
                                                 int I, KeyRow key_row) {
  const int ld = idx_ld(I), per = (ld - IDX_PAD) / 8;
  for (int i = threadIdx.x; i < np * per; i += blockDim.x) {
    const int r = i / per, c = 8 * (i % per);
    const long long row = key_row(r);
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row >= 0 && c < I) v = *reinterpret_cast<const uint4*>(keys + row * I + c);
    *reinterpret_cast<uint4*>(kt + r * ld + c) = v;
  }
}

#ifdef CONTROL_IDX_IEEE
// The step as IEEE fp32 products added in k order (the thread's own 4 outputs, read from memory).
static __device__ void idx_ieee(float d[2][4], const __nv_bfloat16* q, int Hi, int I, int h0, int k0,
                                const __nv_bfloat16* kw, int ld) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int j = 0; j < 2; ++j)
    for (int e = 0; e < 4; ++e) {
      const int h = h0 + g + 8 * (e >> 1);
      const __nv_bfloat16* kr = kw + (8 * j + 2 * t + (e & 1)) * ld;
      for (int k = k0; k < k0 + 16 && k < I && h < Hi; ++k)
        d[j][e] = __fadd_rn(d[j][e], __fmul_rn(ld_bf16(q, (long long)h * I + k), __bfloat162float(kr[k])));
    }
}
#endif

// One k step of head tile h0 against the warp's two pool tiles: d[j] += A B_j (kw: the warp's 16 staged keys).
static __device__ __forceinline__ void idx_step(float d[2][4], const __nv_bfloat16* __restrict__ q, int Hi, int I,
                                                int h0, int k0, const __nv_bfloat16* kw, int ld) {
#ifdef CONTROL_IDX_IEEE
  idx_ieee(d, q, Hi, I, h0, k0, kw, ld);
#else
  const int lane = threadIdx.x & 31, g = lane >> 2, kk = k0 + 4 * (lane & 3);
  unsigned a[4];
  for (int r = 0; r < 2; ++r) {
    const int h = h0 + g + 8 * r;
    uint2 v = make_uint2(0u, 0u);
    if (h < Hi && kk < I) v = *reinterpret_cast<const uint2*>(q + (long long)h * I + kk);
    a[r] = v.x;
    a[2 + r] = v.y;
  }
  for (int j = 0; j < 2; ++j) {
    const uint2 bv = *reinterpret_cast<const uint2*>(kw + (8 * j + g) * ld + kk);
    const unsigned b[2] = {bv.x, bv.y};
    mma_m16n8k16_bf16(d[j], a, b, d[j]);
  }
#endif
}

// The lane-16 fold of one pool's lanes g (lo) and g + 8 (hi): every lane of the warp takes part.
static __device__ __forceinline__ float idx_fold(float lo, float hi) {
  float v = lo + hi;
#ifdef CONTROL_IDX_FOLD
  for (int m = 4; m <= 16; m <<= 1) v += __shfl_xor_sync(FULL_MASK, v, m);
#else
  for (int m = 16; m >= 4; m >>= 1) v += __shfl_xor_sync(FULL_MASK, v, m);
#endif
  return v;
}

// One row against the warp's 16 staged pools (kw [16, ld]): s[j][c] = the score of pool 8j + 2t + c on every lane
// t of g = 0 (lanes 0..3). q [Hi, I] bf16 the row's queries, hw [Hi] f32 its head weights (times hscale).
static __device__ __forceinline__ void idx_row_scores(float s[2][2], const __nv_bfloat16* __restrict__ q,
                                                      const float* __restrict__ hw, const __nv_bfloat16* kw, int ld,
                                                      int Hi, int I, float qscale, float hscale) {
  const int g = (threadIdx.x & 31) >> 2, steps = (I + 15) / 16;
  float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};   // [pool tile][c + 2 r]: lane g + 8 r
  for (int h0 = 0; h0 < Hi; h0 += 16) {
    float d[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    for (int s0 = 0; s0 < steps; ++s0) idx_step(d, q, Hi, I, h0, 16 * IDX_STEP(s0, steps), kw, ld);
    for (int r = 0; r < 2; ++r) {
      const int h = h0 + g + 8 * r;
      if (h >= Hi) continue;
      const float w = hw[h] * hscale;
      for (int j = 0; j < 2; ++j)
        for (int c = 0; c < 2; ++c) {
          float z = d[j][2 * r + c] * qscale;
          z = (z < 0.0f) ? 0.0f : z;   // np.maximum(z, 0): NaN stays NaN
          acc[j][2 * r + c] += z * w;
        }
    }
  }
  for (int j = 0; j < 2; ++j)
    for (int c = 0; c < 2; ++c) s[j][c] = idx_fold(acc[j][c], acc[j][2 + c]);
}
