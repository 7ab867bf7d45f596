// hc_row.cuh -- one token row's hyper-connection pieces shared by hc.cu (one block a row) and hc_split.cu (the
// decode form: a row's mix dots over several blocks): the branch read (ranks summed in rank order, rounded to bf16),
// hc_post's element, the gates from the mix dots (sigmoid pre/post, Sinkhorn comb: a thread an element) and the
// collapse.
// Reference: NumpyOps.hc_pre / hc_post (cupyglm/backend/numpy_ops.py).
#pragma once
#include "common.cuh"
#include "exp_f32.cuh"
#include "norm_row.cuh"

#define HC_MAX_S 8  // streams supported by the per-thread Sinkhorn (the model has 4)

// The fp32 sublayer output read as bf16 (hc_post's branch, residual_add's partial), or, in the planted control
// variant of the contract (-DCONTROL_UNROUNDED), read unrounded.
static __device__ __forceinline__ float rounded(float v) {
#ifdef CONTROL_UNROUNDED
  return v;
#else
  return bf16_round(v);
#endif
}

static __device__ __forceinline__ float ld_rounded(const float* p, long long i) { return rounded(p[i]); }

// hc_post's branch at element i of its [T, D] block: the ranks' fp32 partials (branch [ranks, T, D] as gathered,
// rank r at row r, n = T * D) added left to right in fp32, ((p0 + p1) + p2) + ..., the bits of the rank-order sum
// (cuda_src/rank_sum.cu) before the bf16 read.  Planted control HC_PLANT_RANKS_REVERSED adds from the last rank.
static __device__ __forceinline__ float ld_branch(const float* p, long long i, long long n, int ranks) {
#ifdef HC_PLANT_RANKS_REVERSED
  float acc = p[(long long)(ranks - 1) * n + i];
  for (int r = ranks - 2; r >= 0; --r) acc = acc + p[(long long)r * n + i];
#else
  float acc = p[i];
  for (int r = 1; r < ranks; ++r) acc = acc + p[(long long)r * n + i];
#endif
  return rounded(acc);
}

// X is read with plain (coherent) loads: hc_post_pre_norm passes streams its own block wrote in this launch.
static __device__ __forceinline__ float ld_bf16_coherent(const __nv_bfloat16* p, long long i) {
  return __bfloat162float(p[i]);
}

// One element d of token t's updated streams (hc_post).
static __device__ __forceinline__ void hc_post_at(const __nv_bfloat16* __restrict__ X, const float* __restrict__ branch,
                                                  const float* __restrict__ post, const float* __restrict__ comb,
                                                  __nv_bfloat16* out, int t, int T, int S, int D, int d,
                                                  int ranks) {
  const float b = ld_branch(branch, (long long)t * D + d, (long long)T * D, ranks);
  const __nv_bfloat16* xr = X + (long long)t * S * D + d;
  for (int s = 0; s < S; ++s) {
    float acc = post[(long long)t * S + s] * b;
    for (int j = 0; j < S; ++j) acc = acc + comb[((long long)t * S + j) * S + s] * ld_bf16(xr, (long long)j * D);
    out[((long long)t * S + s) * D + d] = to_bf16(acc);
  }
}

// One Sinkhorn normalisation of the S x S matrix cs, of its rows or its columns: thread (i, j) < S * S divides its
// element by its line's sum (left to right, the values before this step) + eps.  Every thread calls it (barriers).
static __device__ __forceinline__ void hc_sinkhorn_step(float* cs, int S, bool rows, float hc_eps) {
  const int tid = threadIdx.x;
  float v = 0.0f;
  if (tid < S * S) {
    const int first = rows ? tid - tid % S : tid % S, stride = rows ? 1 : S;
    float s = cs[first];
    for (int q = 1; q < S; ++q) s = s + cs[first + q * stride];
    const float den = s + hc_eps;
    v = cs[tid] / den;
  }
  __syncthreads();
  if (tid < S * S) cs[tid] = v;
  __syncthreads();
}

// Token t's gates from its mix dots hc_sh[0 .. NM - 1] and sum of squares hc_sh[NM] (over K = S * D): pre into
// hc_sh[NM + 1 ..], post and comb to memory.  Every thread calls it (barriers); thread (i, j) < S * S owns comb's
// element (i, j) through the row softmax and the Sinkhorn steps, the bits of one thread doing them in order.
static __device__ __forceinline__ void hc_gates(float* hc_sh, const float* __restrict__ base,
                                                const float* __restrict__ scale, float* __restrict__ post,
                                                float* __restrict__ comb, int t, int S, int K, float norm_eps,
                                                float hc_eps, int iters) {
  __shared__ float cs[HC_MAX_S * HC_MAX_S];
  const int NM = S * (S + 2), tid = threadIdx.x;
  float* pre_sh = hc_sh + NM + 1;
  const float r = 1.0f / sqrtf(hc_sh[NM] / (float)K + norm_eps);
  const float sc0 = scale[0], sc1 = scale[1], sc2 = scale[2];
  if (tid < S) {
    pre_sh[tid] = sigmoid_f32(hc_sh[tid] * r * sc0 + base[tid]) + hc_eps;
    post[(long long)t * S + tid] = 2.0f * sigmoid_f32(hc_sh[S + tid] * r * sc1 + base[S + tid]);
  }
  if (tid < S * S) {                     // row softmax + eps: the row's logits, max and sum, then this element
    const int i = tid / S, j = tid % S;
    float lg[HC_MAX_S];
    float m = 0.0f;
    for (int q = 0; q < S; ++q) {
      const int o = 2 * S + i * S + q;
      lg[q] = hc_sh[o] * r * sc2 + base[o];
      m = (q == 0 || lg[q] > m) ? lg[q] : m;
    }
    float rows = 0.0f, mine = 0.0f;
    for (int q = 0; q < S; ++q) {
      const float e = exp_f32(lg[q] - m);
      rows = (q == 0) ? e : rows + e;
      mine = q == j ? e : mine;
    }
    cs[tid] = mine / rows + hc_eps;
  }
  __syncthreads();
  // Columns once, then (rows, columns) iters - 1 times; the reference normalises the columns once even for iters 0.
  for (int it = 0; it < iters; ++it) {
    if (it > 0) hc_sinkhorn_step(cs, S, true, hc_eps);
    hc_sinkhorn_step(cs, S, false, hc_eps);
  }
  if (iters <= 0) hc_sinkhorn_step(cs, S, false, hc_eps);
  if (tid < S * S) comb[(long long)t * S * S + tid] = cs[tid];
}

// x = bf16(((pre0 X0 + pre1 X1) + pre2 X2) + pre3 X3) of token t's streams xr [S, D] into x_out (and, when xs is
// given, the same bf16 values into xs for a fused epilogue).  Every thread of the block calls it.
static __device__ __forceinline__ void hc_collapse(const __nv_bfloat16* xr, const float* pre_sh,
                                                   __nv_bfloat16* __restrict__ x_out, float* xs, int t, int S,
                                                   int D) {
  const int tid = threadIdx.x;
  for (int d = tid; d < D; d += blockDim.x) {
    float acc = pre_sh[0] * ld_bf16_coherent(xr, d);
    for (int s = 1; s < S; ++s) acc = acc + pre_sh[s] * ld_bf16_coherent(xr, (long long)s * D + d);
    x_out[(long long)t * D + d] = to_bf16(acc);
#ifdef CONTROL_NORM_UNROUNDED
    if (xs != nullptr) xs[d] = acc;                 // planted control: the norm reads the unrounded collapse
#else
    if (xs != nullptr) xs[d] = bf16_round(acc);     // the norm reads x exactly as stored
#endif
  }
}

struct HcRowShared {            // the collapsed row's bf16 values, kept in shared memory as floats
  const float* xs;
  __device__ float operator()(int i) const { return xs[i]; }
};

