// index_mma.cuh -- the DSA indexer's scores on the tensor core: one warp scores one row against 32 pooled keys
// staged in shared memory. Reference: cupyglm/backend/tc_index.py (the exact model) and NumpyOps.index_scores.
//   dots: each dot qi[h] . pk[p] is a chain over I from +0.0 in ascending k steps of 16 (I zero-padded to a multiple
//         of 16; heads past Hi are zero); inside a step, position q holds k = 4 ((q % 8) / 2) + q % 2 + 2 (q / 8).
//         The model's element is symmetric in its operands, so the warp puts the keys in A (two 16-pool tiles,
//         staged in that k order and read by ldmatrix) and the heads in B (8-head tiles): a lane's b[0], b[1] of
//         head g are the 4 consecutive k 4t .. 4t + 3 of one 8-byte load (mma.cuh's layout, g = lane / 4,
//         t = lane % 4), the bits those of heads in A and pools in B.
//   epilogue (fp32): z = dot * qscale, relu, times hw[h] * hscale, added into head h's lane h % 16 in ascending
//         16-head tiles; a lane holds heads 2t, 2t + 1 of each 8-head tile, so the lane-16 fold (8, 4, 2, 1) is
//         an in-thread add (the tile pair), shuffles to lane xor 2 and xor 1, an in-thread add (the head pair).
// Heads past Hi add nothing (a lane's sum starts at +0 and never becomes -0, so a +0 term would not change it).
// Planted controls: CONTROL_IDX_REVERSED (the k steps descending), CONTROL_IDX_FOLD (the lanes folded 1, 8, 4, 2),
// CONTROL_IDX_IEEE (each step an IEEE fp32 multiply-add chain in k order).
#pragma once
#include "common.cuh"
#include "mma.cuh"

#define IDX_PAD 8          // bf16 past each staged key row: ldmatrix's eight rows fall in distinct banks
#define IDX_MAX_I 256      // the widest index head dimension (the model has 128)
#define IDX_WARP_POOLS 32  // pools a warp: two 16-pool A tiles

#ifdef CONTROL_IDX_REVERSED
#define IDX_STEP(s, n) ((n) - 1 - (s))
#else
#define IDX_STEP(s, n) (s)
#endif

// The row stride of staged keys: I rounded up to 16, plus the pad.
static __device__ __forceinline__ int idx_ld(int I) { return (I + 15) / 16 * 16 + IDX_PAD; }

// Keys of np pools into kt [np, ld] bf16 in the steps' k order (zero past I and for absent pools): key_row(r) gives
// the pooled row of staged pool r (< 0: a zero key). 16 bytes read a copy (k 8c .. 8c + 7), their 4 k pairs stored
// at positions 8 (w % 2) + 4 (c % 2) + 2 (w / 2) of their step. I % 8 == 0 (the launcher checks).
template <class KeyRow>
static __device__ __forceinline__ void idx_stage(__nv_bfloat16* kt, const __nv_bfloat16* __restrict__ keys, int np,
                                                 int I, KeyRow key_row) {
  const int ld = idx_ld(I), per = (ld - IDX_PAD) / 8;
  for (int i = threadIdx.x; i < np * per; i += blockDim.x) {
    const int r = i / per, c = i % per;
    const long long row = key_row(r);
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row >= 0 && 8 * c < I) v = *reinterpret_cast<const uint4*>(keys + row * I + 8 * c);
    unsigned* dst = reinterpret_cast<unsigned*>(kt + r * ld + 16 * (c / 2) + 4 * (c % 2));
    dst[0] = v.x;   // k pair 0: position 0 (+ 4 (c % 2))
    dst[4] = v.y;   // k pair 1: position 8
    dst[1] = v.z;   // k pair 2: position 2
    dst[5] = v.w;   // k pair 3: position 10
  }
}

#ifdef CONTROL_IDX_IEEE
// The step as IEEE fp32 products added in k order (the thread's own outputs, read from memory; kr in the steps'
// k order, so k sits at position 8 ((k / 2) % 2) + 2 (k / 4) + k % 2).
static __device__ void idx_ieee(float d[2][2][4], const __nv_bfloat16* q, int Hi, int I, int h0, int k0,
                                const __nv_bfloat16* kw, int ld) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int m = 0; m < 2; ++m)
    for (int n = 0; n < 2; ++n)
      for (int e = 0; e < 4; ++e) {
        const int h = h0 + 8 * n + 2 * t + (e & 1);
        const __nv_bfloat16* kr = kw + (16 * m + g + 8 * (e >> 1)) * ld + k0;
        for (int k = 0; k < 16 && k0 + k < I && h < Hi; ++k) {
          const float key = __bfloat162float(kr[8 * ((k >> 1) & 1) + 2 * (k >> 2) + (k & 1)]);
          d[m][n][e] = __fadd_rn(d[m][n][e], __fmul_rn(ld_bf16(q, (long long)h * I + k0 + k), key));
        }
      }
}
#endif

// One k step of a 16-head tile against the warp's two pool tiles: d[m][n] += A_m B_n. ka[m]: this lane's ldmatrix
// row of pool tile m (staged keys), qb[n]: its head row of B tile n at k 4t (a head past Hi reads head Hi - 1:
// its outputs are dropped, and each output element is its own head's); k past I reads zero.
static __device__ __forceinline__ void idx_step(float d[2][2][4], const __nv_bfloat16* const ka[2],
                                                const __nv_bfloat16* const qb[2], int k0, bool tail) {
  unsigned a[2][4], b[2][2];
  for (int m = 0; m < 2; ++m) mma_ldmatrix_x4(a[m], ka[m] + k0);
  for (int n = 0; n < 2; ++n) {
    uint2 v = make_uint2(0u, 0u);
    if (!tail) v = *reinterpret_cast<const uint2*>(qb[n] + k0);
    b[n][0] = v.x;
    b[n][1] = v.y;
  }
  for (int m = 0; m < 2; ++m)
    for (int n = 0; n < 2; ++n) mma_m16n8k16_bf16(d[m][n], a[m], b[n], d[m][n]);
}

// The lane-16 fold of one pool's 4 lane sums held by this thread (s[e][c]: lane 8e + 2t + c); every lane of the
// warp takes part.
static __device__ __forceinline__ float idx_fold(const float s[2][2]) {
#ifdef CONTROL_IDX_FOLD
  float v0 = s[0][0] + s[0][1], v1 = s[1][0] + s[1][1];
  float v = v0 + v1;
#else
  float v0 = s[0][0] + s[1][0], v1 = s[0][1] + s[1][1];   // fold 8: lanes L and L + 8
  v0 += __shfl_xor_sync(FULL_MASK, v0, 2);                 // fold 4: t and t + 2
  v1 += __shfl_xor_sync(FULL_MASK, v1, 2);
  v0 += __shfl_xor_sync(FULL_MASK, v0, 1);                 // fold 2: t and t + 1
  v1 += __shfl_xor_sync(FULL_MASK, v1, 1);
  float v = v0 + v1;                                       // fold 1: c = 0 and 1
#endif
#ifdef CONTROL_IDX_FOLD
  v += __shfl_xor_sync(FULL_MASK, v, 2);
  v += __shfl_xor_sync(FULL_MASK, v, 1);
#endif
  return v;
}

// One row against the warp's 32 staged pools (kw [32, ld]): s[m][r] = the score of pool 16m + g + 8r, on every
// lane of that g. q [Hi, I] bf16 the row's queries, hw [Hi] f32 its head weights (times hscale).
static __device__ __forceinline__ void idx_row_scores(float s[2][2], const __nv_bfloat16* __restrict__ q,
                                                      const float* __restrict__ hw, const __nv_bfloat16* kw, int ld,
                                                      int Hi, int I, float qscale, float hscale) {
  const int lane = threadIdx.x & 31, t = lane & 3, steps = (I + 15) / 16;
  const __nv_bfloat16* ka[2];   // this lane's ldmatrix rows: pool 16m + lane % 16, column 8 (lane / 16)
  for (int m = 0; m < 2; ++m) ka[m] = kw + (16 * m + (lane & 15)) * ld + 8 * (lane >> 4);
  float acc[2][2][2][2] = {};   // [pool tile m][pool g + 8r][lane 8e + 2t + c]: [m][r][e][c]
  for (int h0 = 0; h0 < Hi; h0 += 16) {
    float d[2][2][4] = {};      // [m][head tile n][e]: pool 16m + g + 8 (e / 2), head h0 + 8n + 2t + e % 2
#ifdef CONTROL_IDX_IEEE
    for (int s0 = 0; s0 < steps; ++s0) idx_ieee(d, q, Hi, I, h0, 16 * IDX_STEP(s0, steps), kw, ld);
#else
    const __nv_bfloat16* qb[2];
    for (int n = 0; n < 2; ++n) qb[n] = q + (long long)min(h0 + 8 * n + (lane >> 2), Hi - 1) * I + 4 * t;
    for (int s0 = 0; s0 < steps; ++s0) {
      const int k0 = 16 * IDX_STEP(s0, steps);
      idx_step(d, ka, qb, k0, k0 + 4 * t >= I);
    }
#endif
    for (int n = 0; n < 2; ++n)
      for (int c = 0; c < 2; ++c) {
        const int h = h0 + 8 * n + 2 * t + c;
        if (h >= Hi) continue;
        const float w = hw[h] * hscale;
        for (int m = 0; m < 2; ++m)
          for (int r = 0; r < 2; ++r) {
            float z = d[m][n][2 * r + c] * qscale;
            z = (z < 0.0f) ? 0.0f : z;   // np.maximum(z, 0): NaN stays NaN
            acc[m][r][n][c] += z * w;
          }
      }
  }
  for (int m = 0; m < 2; ++m)
    for (int r = 0; r < 2; ++r) s[m][r] = idx_fold(acc[m][r]);
}
