// kda.cu -- Kimi Delta Attention: short conv + SiLU (kda_conv), per-channel decay (kda_gate), L2 norm
// (l2norm), the per-token delta rule with an fp32 state (kda_recurrence; the same recurrence for prefill and
// decode, so a state computed by prefill equals one computed token by token; the decode steps with the conv, the
// q/k norms, the low-rank factors and the decay fused in are in kda_step.cu), and the gated RMS norm of the output
// (kda_out).  Reference: NumpyOps.kda_* / l2norm in cupyglm/backend/numpy_kda.py; sums over a head dimension in
// lane-16 order, the 4 taps left to right.  Storage: bf16 for what the model keeps in bf16 (the conv input,
// window and taps, gate inputs, v, beta, y, the norm's weight and output); fp32 for the
// recurrent state S, the decay g and the normalised q, k.
#include "common.cuh"
#include "exp_f32.cuh"
#include "kda_out.cuh"
#include "kda_rows.cuh"

#define KDA_MAX_TAPS 8   // kda_conv: taps <= 8 (the model has 4)

// Depthwise causal conv over [window; x], taps oldest first, fp32, then SiLU, bf16.  One thread per channel
// walks the tokens in order.  grid ceil(C / blockDim.x).
extern "C" __global__ void kda_conv(const __nv_bfloat16* __restrict__ x,       // [n, C] bf16
                                    const __nv_bfloat16* __restrict__ window,  // [taps-1, C] bf16, oldest first
                                    const __nv_bfloat16* __restrict__ w,       // [C, taps] bf16
                                    __nv_bfloat16* __restrict__ y,             // [n, C] bf16
                                    __nv_bfloat16* __restrict__ window_out,    // [taps-1, C] bf16
                                    int n, int C, int taps) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float hist[KDA_MAX_TAPS];
  float wc[KDA_MAX_TAPS];
  for (int j = 0; j < taps; ++j) wc[j] = ld_bf16(w, (long long)c * taps + j);
  for (int j = 0; j < taps - 1; ++j) hist[j] = ld_bf16(window, (long long)j * C + c);
  for (int t = 0; t < n; ++t) {
    const float xt = ld_bf16(x, (long long)t * C + c);
    float acc = (taps == 1) ? xt * wc[0] : hist[0] * wc[0];
    for (int j = 1; j < taps; ++j) acc = acc + ((j < taps - 1) ? hist[j] : xt) * wc[j];
    y[(long long)t * C + c] = to_bf16(acc * sigmoid_f32(acc));
    for (int j = 0; j + 1 < taps - 1; ++j) hist[j] = hist[j + 1];
    if (taps > 1) hist[taps - 2] = xt;
  }
  for (int j = 0; j < taps - 1; ++j) window_out[(long long)j * C + c] = to_bf16(hist[j]);  // exact: bf16 values
}

// g = exp(lower * sigmoid(exp(A_log[h]) * (a + dt_bias[h, k]))), elementwise, fp32.
extern "C" __global__ void kda_gate(const __nv_bfloat16* __restrict__ a,        // [n, H, K] bf16
                                    const float* __restrict__ a_log,            // [H] fp32 (stored F32)
                                    const float* __restrict__ dt_bias,          // [H, K] fp32 (stored F32)
                                    float* __restrict__ g,              // [n, H, K] f32
                                    long long total, int H, int K, float lower) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int kk = (int)(i % K);
  const int h = (int)((i / K) % H);
  const float inner = exp_f32(a_log[h]) * (ld_bf16(a, i) + dt_bias[(long long)h * K + kk]);
  g[i] = exp_f32(lower * sigmoid_f32(inner));
}

// out = x / sqrt(sum(x^2) + eps) per row of K, the sum in lane-16 order, then (has_scale) times scale: the
// reference's separate fp32 multiply (q's K^-0.5), rounded as it is.  One group of 16 threads per row;
// grid ceil(rows / (blockDim.x / 16)).
extern "C" __global__ void l2norm(const __nv_bfloat16* __restrict__ x,  // [rows, K] bf16
                                  float* __restrict__ out,              // [rows, K] f32
                                  long long rows, int K, float eps, int has_scale, float scale) {
  const long long row = (long long)blockIdx.x * (blockDim.x >> 4) + (threadIdx.x >> 4);
  const int lane = threadIdx.x & 15;
  const bool active = row < rows;
  const __nv_bfloat16* xr = x + (active ? row : 0) * K;
  const float acc = lane16_sum_squares(xr, K, lane, active);
  if (!active) return;
  const float r = 1.0f / sqrtf(acc + eps);
  for (int k = lane; k < K; k += 16) {
    const float y = ld_bf16(xr, k) * r;
    out[row * K + k] = has_scale ? y * scale : y;
  }
}

// The delta rule, token by token.  Value row v of head h is independent of every other row, so a group of
// 16 threads owns one row: lane l keeps S[h, v, k] for k = l, l+16, ... in registers (the lane-16 order of
// the sums over k comes for free).  Per token: kda_token.
// grid (ceil(V / (blockDim.x / 16)), H); blockDim.x a multiple of 32.
extern "C" __global__ void kda_recurrence(const float* __restrict__ S_in,  // [H, V, K] f32
                                          const float* __restrict__ q,     // [n, H, K] f32
                                          const float* __restrict__ k,     // [n, H, K] f32
                                          const __nv_bfloat16* __restrict__ v,     // [n, H, V] bf16
                                          const float* __restrict__ g,             // [n, H, K] f32
                                          const __nv_bfloat16* __restrict__ beta,  // [n, H] bf16
                                          __nv_bfloat16* __restrict__ y,           // [n, H, V] bf16
                                          float* __restrict__ S_out,       // [H, V, K] f32
                                          int n, int H, int V, int K) {
  const int h = blockIdx.y;
  const int vr = blockIdx.x * (blockDim.x >> 4) + (threadIdx.x >> 4);
  const int lane = threadIdx.x & 15;
  const bool active = vr < V;
  float s[KDA_MAX_J];
  const long long srow = ((long long)h * V + (active ? vr : 0)) * K;
  kda_load_state(s, S_in, srow, lane, K, active);
  for (int t = 0; t < n; ++t) {
    const long long hk = ((long long)t * H + h) * K;
    float qv[KDA_MAX_J], kv[KDA_MAX_J], gv[KDA_MAX_J];
#pragma unroll
    for (int j = 0; j < KDA_MAX_J; ++j) {
      const int kk = lane + 16 * j;
      qv[j] = kk < K ? q[hk + kk] : 0.0f;
      kv[j] = kk < K ? k[hk + kk] : 0.0f;
      gv[j] = kk < K ? g[hk + kk] : 0.0f;
    }
    const float vv = active ? ld_bf16(v, ((long long)t * H + h) * V + vr) : 0.0f;
    const float bv = active ? ld_bf16(beta, (long long)t * H + h) : 0.0f;
    const float yv = kda_token(s, qv, kv, gv, lane, K, active, vv, bv);
    if (active && lane == 0) y[((long long)t * H + h) * V + vr] = to_bf16(yv);
  }
  kda_store_state(s, S_out, srow, lane, K, active);
}

// Gated RMS norm per (token, head) row of V (kda_out.cuh): out = bf16(w * (y * r) * sigmoid(gate)),
// r = 1 / sqrt(sum(y^2) / V + eps), the sum in lane-16 order.  One group of 16 threads per row.
extern "C" __global__ void kda_out(const __nv_bfloat16* __restrict__ y,     // [rows, V] bf16
                                   const __nv_bfloat16* __restrict__ w,     // [V] bf16
                                   const __nv_bfloat16* __restrict__ gate,  // [rows, V] bf16
                                   __nv_bfloat16* __restrict__ out,         // [rows, V] bf16
                                   long long rows, int V, float eps) {
  const long long row = (long long)blockIdx.x * (blockDim.x >> 4) + (threadIdx.x >> 4);
  const int lane = threadIdx.x & 15;
  const bool active = row < rows;
  const __nv_bfloat16* yr = y + (active ? row : 0) * V;
  const float r = kda_out_scale(yr, V, lane, active, eps);
  if (!active) return;
  for (int k = lane; k < V; k += 16)
    out[row * V + k] = kda_out_value(ld_bf16(w, k), ld_bf16(yr, k), r, ld_bf16(gate, row * V + k));
}
