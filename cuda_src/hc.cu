// hc.cu -- hyper-connections: hc_pre (mix GEMM + RMS scale, pre/post gates, Sinkhorn comb, collapse),
// hc_pre_norm (hc_pre and the sublayer's RMSNorm in one launch), hc_post (stream update), hc_post_pre_norm
// (one sublayer's hc_post and the next one's hc_pre_norm in one launch) and stream_mean (final collapse).
// Reference: NumpyOps.hc_pre / hc_pre_norm / hc_post / hc_post_pre_norm / stream_mean in
// cupyglm/backend/numpy_ops.py; every sum over 4D runs in lane-16 order (backend/lanes.py), short sums over the
// streams left to right.  Storage: the streams X, the weight fn and every stream-shaped
// output are bf16; base and scale (stored F32), post and comb are fp32.
#include "hc_row.cuh"

// One block per token row; blockDim.x a multiple of 32 (launcher: 128).  Groups of 16 threads each
// compute one of the NM = S*(S+2) mix dots (or, as output NM, the sum of squares) in lane-16 order, hc_gates
// turns them into pre/post/comb (Sinkhorn), then all threads collapse the streams into x_out (and, when xs is
// given, the same bf16 values into xs for a fused epilogue).  hc_sh: (NM + 1 + S) floats of shared memory.
static __device__ __forceinline__ void hc_pre_row(const __nv_bfloat16* X, const __nv_bfloat16* __restrict__ fn,
                                                  const float* __restrict__ base, const float* __restrict__ scale,
                                                  __nv_bfloat16* __restrict__ x_out, float* __restrict__ post,
                                                  float* __restrict__ comb, int S, int D, float norm_eps,
                                                  float hc_eps, int iters, float* hc_sh, float* xs) {
  const int t = blockIdx.x;
  const int tid = threadIdx.x;
  const int lane = tid & 15;
  const int groups = blockDim.x >> 4;
  const int NM = S * (S + 2);
  const int K = S * D;
  const __nv_bfloat16* xr = X + (long long)t * K;
  float* pre_sh = hc_sh + NM + 1;

  // Mix dots and the sum of squares: output o in group o % groups; rounds are block-uniform so the
  // shuffles stay convergent.
  for (int o0 = 0; o0 < NM + 1; o0 += groups) {
    const int o = o0 + (tid >> 4);
    float acc = 0.0f;
    if (o < NM) {
      const __nv_bfloat16* wr = fn + (long long)o * K;
      for (int k = lane; k < K; k += 16) acc += ld_bf16_coherent(xr, k) * ld_bf16(wr, k);
    } else if (o == NM) {
      for (int k = lane; k < K; k += 16) acc += ld_bf16_coherent(xr, k) * ld_bf16_coherent(xr, k);
    }
    acc = lane16_fold(acc);
    if (lane == 0 && o <= NM) hc_sh[o] = acc;
  }
  __syncthreads();

  hc_gates(hc_sh, base, scale, post, comb, t, S, K, norm_eps, hc_eps, iters);
  __syncthreads();

  hc_collapse(xr, pre_sh, x_out, xs, t, S, D);
}

// Dynamic shared memory: (NM + 1 + S) floats.
extern "C" __global__ void hc_pre(const __nv_bfloat16* __restrict__ X,      // [T, S, D] bf16
                                  const __nv_bfloat16* __restrict__ fn,     // [NM, S*D] bf16
                                  const float* __restrict__ base,           // [NM] fp32 (stored F32)
                                  const float* __restrict__ scale,          // [3] fp32 (stored F32)
                                  __nv_bfloat16* __restrict__ x_out,        // [T, D] bf16
                                  float* __restrict__ post,         // [T, S] f32
                                  float* __restrict__ comb,         // [T, S, S] f32
                                  int T, int S, int D, float norm_eps, float hc_eps, int iters) {
  extern __shared__ float hc_sh[];  // [NM] mix dots, [1] sum of squares, [S] pre
  hc_pre_row(X, fn, base, scale, x_out, post, comb, S, D, norm_eps, hc_eps, iters, hc_sh, nullptr);
}

// hc_pre, then the sublayer's RMSNorm of x (norm_row.cuh, NumpyOps.rmsnorm) in the same block: h = rmsnorm(x,
// norm_w, norm_eps), the two launches' bits in one.  x_out is the collapsed row as hc_pre writes it.
// Dynamic shared memory: (NM + 1 + S + D) floats.
extern "C" __global__ void hc_pre_norm(const __nv_bfloat16* __restrict__ X,      // [T, S, D] bf16
                                       const __nv_bfloat16* __restrict__ fn,     // [NM, S*D] bf16
                                       const float* __restrict__ base,           // [NM] fp32 (stored F32)
                                       const float* __restrict__ scale,          // [3] fp32 (stored F32)
                                       const __nv_bfloat16* __restrict__ norm_w, // [D] bf16
                                       __nv_bfloat16* __restrict__ x_out,        // [T, D] bf16
                                       __nv_bfloat16* __restrict__ h_out,        // [T, D] bf16: rmsnorm(x)
                                       float* __restrict__ post,                 // [T, S] f32
                                       float* __restrict__ comb,                 // [T, S, S] f32
                                       int T, int S, int D, float norm_eps, float hc_eps, int iters) {
  extern __shared__ float hc_sh[];  // [NM] mix dots, [1] sum of squares, [S] pre, [D] the collapsed row
  float* xs = hc_sh + S * (S + 2) + 1 + S;
  hc_pre_row(X, fn, base, scale, x_out, post, comb, S, D, norm_eps, hc_eps, iters, hc_sh, xs);
  __syncthreads();                  // the whole row is in xs
  const HcRowShared rd{xs};
  rmsnorm_row(rd, norm_w, h_out + (long long)blockIdx.x * D, D, norm_eps);
}

// X'[t, s, d] = bf16(post[t, s] * b + sum_j comb[t, j, s] * X[t, j, d]), j left to right, where
// b = bf16(branch[t, d]): the sublayer's fp32 output, its ranks' partials summed here in rank order (ld_branch), is
// rounded to bf16 as it is read, the same bits as summing and rounding in passes of their own.
// grid (T, ceil(D / blockDim.x)): tokens on grid.x.
extern "C" __global__ void hc_post(const __nv_bfloat16* __restrict__ X,   // [T, S, D] bf16
                                   const float* __restrict__ branch,      // [ranks, T, D] f32 (summed, bf16 on load)
                                   const float* __restrict__ post,        // [T, S] f32
                                   const float* __restrict__ comb,        // [T, S, S] f32
                                   __nv_bfloat16* __restrict__ out,       // [T, S, D] bf16
                                   int T, int S, int D, int ranks) {
  const int d = blockIdx.y * blockDim.x + threadIdx.x;
  if (d < D) hc_post_at(X, branch, post, comb, out, blockIdx.x, T, S, D, d, ranks);
}

// hc_post of one sublayer, then hc_pre_norm of the next on the updated streams, one block per token (the
// streams X' stay in this block: it writes them, then reads them back after a barrier): the bits of hc_post
// followed by hc_pre_norm.  Dynamic shared memory: (NM + 1 + S + D) floats.
extern "C" __global__ void hc_post_pre_norm(const __nv_bfloat16* __restrict__ X,      // [T, S, D] bf16
                                            const float* __restrict__ branch,         // [ranks, T, D] f32 (summed)
                                            const float* __restrict__ post,           // [T, S] f32
                                            const float* __restrict__ comb,           // [T, S, S] f32
                                            const __nv_bfloat16* __restrict__ fn,     // [NM, S*D] bf16
                                            const float* __restrict__ base,           // [NM] fp32 (stored F32)
                                            const float* __restrict__ scale,          // [3] fp32 (stored F32)
                                            const __nv_bfloat16* __restrict__ norm_w, // [D] bf16
                                            __nv_bfloat16* X_out,                     // [T, S, D] bf16: X'
                                            __nv_bfloat16* __restrict__ x_out,        // [T, D] bf16
                                            __nv_bfloat16* __restrict__ h_out,        // [T, D] bf16
                                            float* __restrict__ post_out,             // [T, S] f32
                                            float* __restrict__ comb_out,             // [T, S, S] f32
                                            int T, int S, int D, float norm_eps, float hc_eps, int iters,
                                            int ranks) {
  extern __shared__ float hc_sh[];  // [NM] mix dots, [1] sum of squares, [S] pre, [D] the collapsed row
  for (int d = threadIdx.x; d < D; d += blockDim.x)
    hc_post_at(X, branch, post, comb, X_out, blockIdx.x, T, S, D, d, ranks);
  __syncthreads();                  // the token's updated streams are written
  float* xs = hc_sh + S * (S + 2) + 1 + S;
  hc_pre_row(X_out, fn, base, scale, x_out, post_out, comb_out, S, D, norm_eps, hc_eps, iters, hc_sh, xs);
  __syncthreads();
  const HcRowShared rd{xs};
  rmsnorm_row(rd, norm_w, h_out + (long long)blockIdx.x * D, D, norm_eps);
}

// out[t, d] = bf16(((X0 + X1) + X2 + X3) * inv_s), streams left to right.  grid (T, ceil(D / blockDim.x)).
extern "C" __global__ void stream_mean(const __nv_bfloat16* __restrict__ X,  // [T, S, D] bf16
                                       __nv_bfloat16* __restrict__ out,      // [T, D] bf16
                                       int T, int S, int D, float inv_s) {
  const int t = blockIdx.x;
  const int d = blockIdx.y * blockDim.x + threadIdx.x;
  if (d >= D) return;
  const __nv_bfloat16* xr = X + (long long)t * S * D + d;
  float acc = ld_bf16(xr, 0);
  for (int s = 1; s < S; ++s) acc = acc + ld_bf16(xr, (long long)s * D);
  out[(long long)t * D + d] = to_bf16(acc * inv_s);
}

// A plain residual (the MTP layer): out = bf16(x + bf16(partial)), elementwise; partial is the sublayer's
// fp32 output summed across ranks, rounded to bf16 as it is read.  grid ceil(n / blockDim.x).
extern "C" __global__ void residual_add(const __nv_bfloat16* __restrict__ x,  // [n] bf16
                                        const float* __restrict__ partial,    // [n] f32
                                        __nv_bfloat16* __restrict__ out,      // [n] bf16
                                        long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = to_bf16(ld_bf16(x, i) + ld_rounded(partial, i));
}
