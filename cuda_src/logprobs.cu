// logprobs.cu -- log-probabilities of each row's sampled token and of its K most likely ids, from the same fp32
// logits the sampler sees (after the min_tokens bans, before temperature: the model's distribution, as vLLM's
// default raw logprobs).  Reference: cupyglm.backend.numpy_logprobs.logprobs_rows (NumpyOps.logprobs), step for step:
//
//  * m = max(x) (-0 made +0); e[i] = exp_f32(x[i] - m);
//  * S: thread t of LP_THREADS sums e[t], e[t + LP_THREADS], ... left to right, then thread 0 sums the
//    LP_THREADS partials left to right; L = log_f32(S) (S >= 1: the maximum contributes exp(0) = 1);
//  * logprob(i) = (x[i] - m) - L;
//  * the top K ids by (x desc, id asc): K rounds of a block argmax that skips the ids already taken.
//
// Output: one int32 buffer [R, 2 + 2K] (so one transfer brings a step's tokens and logprobs back):
//   out[r, 0] = token, out[r, 1] = bits of logprob(token), out[r, 2 + j] = j-th top id,
//   out[r, 2 + K + j] = bits of its logprob.
// One block of LP_THREADS threads per row.  A token outside 0..V-1 (sample's -1 for a NaN row) gets a NaN logprob.
//
// Planted control (contract): -DLOGPROBS_CTL_REVERSED_PARTIALS sums the partials right to left.
#include "common.cuh"
#include "exp_f32.cuh"

#define LP_THREADS 256
#define LP_MAX_K 20

// log in float32 from IEEE +, -, *, / and exact exponent arithmetic only (no FMA: NVRTC --fmad=false, the
// emulator -ffp-contract=off), so GPU, emulator and the NumPy twin give the same bits.  For finite x >= 1:
//   x = 2**e * m with m in [sqrt(1/2), sqrt(2)); f = m - 1 (exact); s = f / (2 + f); z = s * s;
//   log(m) = 2s + 2s * z * (1/3 + z/5 + z^2/7 + z^3/9 + z^4/11);  log(x) = e * LN2_HI + (log(m) + e * LN2_LO).
static __device__ __forceinline__ float log_f32(float x) {
  const unsigned b = __float_as_uint(x);
  int e = (int)(b >> 23) - 127;
  float m = __uint_as_float((b & 0x7fffffu) | 0x3f800000u);
  if (m > 0x1.6a09e6p+0f) {                           // sqrt(2)
    m = m * 0.5f;
    e = e + 1;
  }
  const float f = m - 1.0f;
  const float s = f / (2.0f + f);
  const float z = s * s;
  float p = 0x1.745d18p-4f;                           // 1/11
  p = p * z + 0x1.c71c72p-4f;                         // 1/9
  p = p * z + 0x1.24924ap-3f;                         // 1/7
  p = p * z + 0x1.99999ap-3f;                         // 1/5
  p = p * z + 0x1.555556p-2f;                         // 1/3
  const float s2 = s + s;
  const float lm = s2 + (s2 * z) * p;
  const float ef = (float)e;
  return ef * 0x1.63p-1f + (lm + ef * -0x1.bd0106p-13f);
}

// Argmax order: larger value first, ties to the lower id.
static __device__ __forceinline__ bool lp_better(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}

extern "C" __global__ void __launch_bounds__(LP_THREADS) logprobs_rows(
    const float* __restrict__ logits,                // [R, V] f32 (what ops.sample drew from)
    const int* __restrict__ tokens,                  // [R] i32, the sampled ids
    int* __restrict__ out,                           // [R, 2 + 2K] i32 out (see above)
    int V, int K) {
  __shared__ float lp_part[LP_THREADS];
  __shared__ float lp_wv[LP_THREADS / 32];
  __shared__ int lp_wi[LP_THREADS / 32];
  __shared__ int lp_taken[LP_MAX_K];
  __shared__ float lp_m, lp_L;

  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const float* x = logits + (long long)row * V;
  int* o = out + (long long)row * (2 + 2 * K);

  // ---- the maximum ------------------------------------------------------------------------------------------
  float mx = -INFINITY;
  for (int i = tid; i < V; i += LP_THREADS) mx = x[i] > mx ? x[i] : mx;
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(FULL_MASK, mx, off);
    mx = ov > mx ? ov : mx;
  }
  if (lane == 0) lp_wv[warp] = mx;
  __syncthreads();
  if (tid == 0) {
    float v = lp_wv[0];
    for (int w = 1; w < LP_THREADS / 32; ++w) v = lp_wv[w] > v ? lp_wv[w] : v;
    lp_m = v + 0.0f;                                  // -0 -> +0
  }
  __syncthreads();
  const float m = lp_m;

  // ---- S and L ----------------------------------------------------------------------------------------------
  float part = 0.0f;
  for (int i = tid; i < V; i += LP_THREADS) part = part + exp_f32(x[i] - m);
  lp_part[tid] = part;
  __syncthreads();
  if (tid == 0) {
    float S = 0.0f;
#ifdef LOGPROBS_CTL_REVERSED_PARTIALS
    for (int t = LP_THREADS - 1; t >= 0; --t) S = S + lp_part[t];
#else
    for (int t = 0; t < LP_THREADS; ++t) S = S + lp_part[t];
#endif
    lp_L = log_f32(S);
    const int tok = tokens[row];
    o[0] = tok;
    o[1] = (tok >= 0 && tok < V) ? __float_as_int((x[tok] - m) - lp_L) : 0x7fc00000;   // NaN for no token
  }
  __syncthreads();
  const float L = lp_L;

  // ---- the top K --------------------------------------------------------------------------------------------
  for (int j = 0; j < K; ++j) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = tid; i < V; i += LP_THREADS) {
      bool used = false;
      for (int q = 0; q < j; ++q) used = used || lp_taken[q] == i;
      if (!used && lp_better(x[i], i, bv, bi)) { bv = x[i]; bi = i; }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(FULL_MASK, bv, off);
      const int oi = __shfl_xor_sync(FULL_MASK, bi, off);
      if (lp_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { lp_wv[warp] = bv; lp_wi[warp] = bi; }
    __syncthreads();
    if (tid == 0) {
      float v = lp_wv[0];
      int id = lp_wi[0];
      for (int w = 1; w < LP_THREADS / 32; ++w)
        if (lp_better(lp_wv[w], lp_wi[w], v, id)) { v = lp_wv[w]; id = lp_wi[w]; }
      lp_taken[j] = id;
      o[2 + j] = id;
      o[2 + K + j] = __float_as_int((x[id] - m) - L);
    }
    __syncthreads();
  }
}
