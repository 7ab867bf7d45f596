// kda.cu -- Kimi Delta Attention: short conv + SiLU (kda_conv), per-channel decay (kda_gate), L2 norm
// (l2norm), the per-token delta rule with an fp32 state (kda_recurrence; the same recurrence for prefill and
// decode, so a state computed by prefill equals one computed token by token; kda_step: the conv, the q/k norms
// and the decay fused into it), and the gated RMS norm of the output (kda_out).  Reference: NumpyOps.kda_* /
// l2norm in cupyglm/backend/numpy_ops.py; sums over a head dimension in lane-16 order, the 4 taps left to right.
// Storage: bf16 for what the model keeps in bf16 (the conv input, window and taps, gate inputs, v, beta, y, the
// norm's weight and output); fp32 for the recurrent state S, the decay g and the normalised q, k.
#include "common.cuh"
#include "exp_f32.cuh"
#include "kda_out.cuh"

#define KDA_MAX_TAPS 8   // kda_conv: taps <= 8 (the model has 4)
#define KDA_MAX_J 16     // kda_recurrence: K <= 16 * 16 = 256 key columns (the model has 128)

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

// One token of the delta rule for one value row, by its group of 16 threads (lane l holds S[h, v, k] for
// k = l, l+16, ... in s): S *= g; kv = S k; S += ((v - kv) * beta) k; returns y = S q (folded, every lane).
// qv, kv, gv: this lane's k values of q, k and g; vb = (v, beta) of the row (zeros for an inactive group).
static __device__ __forceinline__ float kda_token(float* s, const float* qv, const float* kv, const float* gv,
                                                  int lane, int K, bool active, float v, float beta) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < KDA_MAX_J; ++j) {
    if (lane + 16 * j < K) {
      s[j] = s[j] * gv[j];
      acc += s[j] * kv[j];
    }
  }
  const float kvs = lane16_fold(acc);
  const float u = active ? (v - kvs) * beta : 0.0f;
  acc = 0.0f;
#pragma unroll
  for (int j = 0; j < KDA_MAX_J; ++j) {
    if (lane + 16 * j < K) {
      s[j] = s[j] + u * kv[j];
      acc += s[j] * qv[j];
    }
  }
  return lane16_fold(acc);
}

static __device__ __forceinline__ void kda_load_state(float* s, const float* S_in, long long srow, int lane, int K,
                                                      bool active) {
#pragma unroll
  for (int j = 0; j < KDA_MAX_J; ++j) {
    const int kk = lane + 16 * j;
    s[j] = (active && kk < K) ? S_in[srow + kk] : 0.0f;
  }
}

static __device__ __forceinline__ void kda_store_state(const float* s, float* S_out, long long srow, int lane, int K,
                                                       bool active) {
  if (!active) return;
#pragma unroll
  for (int j = 0; j < KDA_MAX_J; ++j) {
    const int kk = lane + 16 * j;
    if (kk < K) S_out[srow + kk] = s[j];
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

// Channel c of token t of kda_conv's output (the same sum and SiLU): the causal conv over [window; x] with taps
// w[c, 0..taps) oldest first, rounded to bf16 (returned as a float); a null window reads zeros.
static __device__ __forceinline__ float kda_conv_at(const __nv_bfloat16* __restrict__ x,
                                                    const __nv_bfloat16* window,
                                                    const __nv_bfloat16* __restrict__ w, int t, long long c, int C,
                                                    int taps) {
  float acc = 0.0f;
  for (int j = 0; j < taps; ++j) {
    const int i = t + j;                                     // row of [window; x]
    const float v = i < taps - 1 ? (window != nullptr ? ld_bf16(window, (long long)i * C + c) : 0.0f)
                                 : ld_bf16(x, (long long)(i - taps + 1) * C + c);
    acc = (j == 0) ? v * ld_bf16(w, c * taps) : acc + v * ld_bf16(w, c * taps + j);
  }
  return bf16_round(acc * sigmoid_f32(acc));
}

// Row i of [window; x] for channel c (the next window: rows n .. n + taps - 2).
static __device__ __forceinline__ __nv_bfloat16 kda_full_at(const __nv_bfloat16* __restrict__ x,
                                                            const __nv_bfloat16* window, int i,
                                                            long long c, int C, int taps) {
  return i < taps - 1 ? window[(long long)i * C + c] : x[(long long)(i - taps + 1) * C + c];
}

// The decode rows of one segment for value row vr of head h, by its group of 16 threads: kda_conv of the
// projections' q/k/v heads (kda_conv_at), q = l2norm(q) * q_scale, k = l2norm(k) (l2norm's lane-16 sums,
// recomputed by every value row's group), g = kda_gate(a) (kda_gate's expression per element), then kda_token: the
// bits of kda_conv, l2norm x2, kda_gate and kda_recurrence (V = K).  S_in null: a zero state; S_out null: the
// state not written.  S_in may equal S_out (in place: the group reads its row before it writes it).  x, a, beta, y
// point at the segment's first row; window at its [taps-1, 3HK] saved rows.
static __device__ __forceinline__ void kda_step_group(const float* S_in, float* S_out, const __nv_bfloat16* x,
                                                      const __nv_bfloat16* window, const __nv_bfloat16* cw,
                                                      const __nv_bfloat16* a, const float* a_log,
                                                      const float* dt_bias, const __nv_bfloat16* beta,
                                                      __nv_bfloat16* y, int n, int H, int K, int taps, float lower,
                                                      float eps, float q_scale, int h, int vr, int lane) {
  const bool active = vr < K;
  const int C = 3 * H * K;
  const long long cq = (long long)h * K, ck = cq + (long long)H * K, cv = ck + (long long)H * K;
  float s[KDA_MAX_J];
  const long long srow = ((long long)h * K + (active ? vr : 0)) * K;
  kda_load_state(s, S_in, srow, lane, K, active && S_in != nullptr);
  const float ea = exp_f32(a_log[h]);
  for (int t = 0; t < n; ++t) {
    const long long hk = ((long long)t * H + h) * K;
    float qv[KDA_MAX_J], kv[KDA_MAX_J], gv[KDA_MAX_J];
    float sq = 0.0f, sk = 0.0f;
#pragma unroll
    for (int j = 0; j < KDA_MAX_J; ++j) {
      const int kk = lane + 16 * j;
      qv[j] = kk < K ? kda_conv_at(x, window, cw, t, cq + kk, C, taps) : 0.0f;
      kv[j] = kk < K ? kda_conv_at(x, window, cw, t, ck + kk, C, taps) : 0.0f;
      if (kk < K) {
        sq += qv[j] * qv[j];
        sk += kv[j] * kv[j];
      }
    }
    const float rq = 1.0f / sqrtf(lane16_fold(sq) + eps);
    const float rk = 1.0f / sqrtf(lane16_fold(sk) + eps);
#pragma unroll
    for (int j = 0; j < KDA_MAX_J; ++j) {
      const int kk = lane + 16 * j;
      if (kk < K) {
        const float yq = qv[j] * rq;
        qv[j] = yq * q_scale;
        kv[j] = kv[j] * rk;
#ifdef CONTROL_GATE_HEAD
        const float inner = ea * (ld_bf16(a, hk + kk) + dt_bias[(long long)((h + 1) % H) * K + kk]);
#else
        const float inner = ea * (ld_bf16(a, hk + kk) + dt_bias[(long long)h * K + kk]);
#endif
        gv[j] = exp_f32(lower * sigmoid_f32(inner));
      } else {
        gv[j] = 0.0f;
      }
    }
    const float vv = active ? kda_conv_at(x, window, cw, t, cv + vr, C, taps) : 0.0f;
    const float bv = active ? ld_bf16(beta, (long long)t * H + h) : 0.0f;
    const float yv = kda_token(s, qv, kv, gv, lane, K, active, vv, bv);
    if (active && lane == 0) y[hk + vr] = to_bf16(yv);
  }
  if (S_out != nullptr) kda_store_state(s, S_out, srow, lane, K, active);
}

// The decode step of one segment in one launch (kda_step_group), out of place.  The q/k channels' next window is
// written by the first group of each head, v's by its row's group.  grid (ceil(K / (blockDim.x / 16)), H);
// blockDim.x a multiple of 32.
extern "C" __global__ void kda_step(const float* __restrict__ S_in,            // [H, K, K] f32
                                    const __nv_bfloat16* __restrict__ x,       // [n, 3, H, K] bf16: conv input
                                    const __nv_bfloat16* __restrict__ window,  // [taps-1, 3HK] bf16, oldest first
                                    const __nv_bfloat16* __restrict__ cw,      // [3HK, taps] bf16 conv taps
                                    const __nv_bfloat16* __restrict__ a,       // [n, H, K] bf16: gate input
                                    const float* __restrict__ a_log,           // [H] fp32 (stored F32)
                                    const float* __restrict__ dt_bias,         // [H, K] fp32 (stored F32)
                                    const __nv_bfloat16* __restrict__ beta,    // [n, H] bf16
                                    __nv_bfloat16* __restrict__ y,             // [n, H, K] bf16
                                    float* __restrict__ S_out,                 // [H, K, K] f32
                                    __nv_bfloat16* __restrict__ window_out,    // [taps-1, 3HK] bf16
                                    int n, int H, int K, int taps, float lower, float eps, float q_scale) {
  const int h = blockIdx.y;
  const int vr = blockIdx.x * (blockDim.x >> 4) + (threadIdx.x >> 4);
  const int lane = threadIdx.x & 15;
  const bool active = vr < K;
  const int C = 3 * H * K;
  const long long cq = (long long)h * K, ck = cq + (long long)H * K, cv = ck + (long long)H * K;
  kda_step_group(S_in, S_out, x, window, cw, a, a_log, dt_bias, beta, y, n, H, K, taps, lower, eps, q_scale, h, vr,
                 lane);
  for (int j = 0; j < taps - 1; ++j) {                 // the next window: exact bf16 copies
    if (blockIdx.x == 0 && (threadIdx.x >> 4) == 0)
      for (int kk = lane; kk < K; kk += 16) {
        window_out[(long long)j * C + cq + kk] = kda_full_at(x, window, n + j, cq + kk, C, taps);
        window_out[(long long)j * C + ck + kk] = kda_full_at(x, window, n + j, ck + kk, C, taps);
      }
    if (active && lane == 0) window_out[(long long)j * C + cv + vr] = kda_full_at(x, window, n + j, cv + vr, C, taps);
  }
}

// The decode step of several sequences in one launch, their states in slots updated in place (a CUDA graph's fixed
// addresses; model/graph_capture.py).  Entry e = blockIdx.z of seg is (row0, n, slot): rows row0 .. row0 + n - 1 of
// x, a, beta and y are one sequence's rows, run in order (kda_step_group) on S[slot] and window[slot]; n = 0: no
// work; slot < 0: a padding row run on a zero state and window, nothing written back.  In place is safe: a group
// owns its state row and its v channel's window (read first, written after, rows ascending: row j is written after
// row n + j > j was read); the q/k channels of head h are read by every block of (h, e), so only the block that
// finishes last (counted in done[e, h], which it sets back to 0 for the next launch) writes them.
// grid (ceil(K / (blockDim.x / 16)), H, E); blockDim.x a multiple of 32.
extern "C" __global__ void kda_step_slots(float* S,                                  // [slots, H, K, K] f32, in place
                                          const __nv_bfloat16* __restrict__ x,       // [R, 3, H, K] bf16: conv input
                                          __nv_bfloat16* window,                     // [slots, taps-1, 3HK] bf16, in place
                                          const __nv_bfloat16* __restrict__ cw,      // [3HK, taps] bf16 conv taps
                                          const __nv_bfloat16* __restrict__ a,       // [R, H, K] bf16: gate input
                                          const float* __restrict__ a_log,           // [H] fp32 (stored F32)
                                          const float* __restrict__ dt_bias,         // [H, K] fp32 (stored F32)
                                          const __nv_bfloat16* __restrict__ beta,    // [R, H] bf16
                                          const int* __restrict__ seg,               // [E, 3] int32 (row0, n, slot)
                                          __nv_bfloat16* __restrict__ y,             // [R, H, K] bf16
                                          int* __restrict__ done,                    // [E, H] int32, 0 on entry and exit
                                          int H, int K, int taps, float lower, float eps, float q_scale) {
  const int h = blockIdx.y, e = blockIdx.z;
  const int row0 = seg[3 * e], n = seg[3 * e + 1], slot = seg[3 * e + 2];
  if (n <= 0) return;                                  // the whole block: no barrier below is reached
  const int vr = blockIdx.x * (blockDim.x >> 4) + (threadIdx.x >> 4);
  const int lane = threadIdx.x & 15;
  const bool active = vr < K;
  const int C = 3 * H * K;
  const long long cq = (long long)h * K, ck = cq + (long long)H * K, cv = ck + (long long)H * K;
  float* Ss = slot >= 0 ? S + (long long)slot * H * K * K : nullptr;
  __nv_bfloat16* win = slot >= 0 ? window + (long long)slot * (taps - 1) * C : nullptr;
  const __nv_bfloat16* xs = x + (long long)row0 * C;
  kda_step_group(Ss, Ss, xs, win, cw, a + (long long)row0 * H * K, a_log, dt_bias, beta + (long long)row0 * H,
                 y + (long long)row0 * H * K, n, H, K, taps, lower, eps, q_scale, h, vr, lane);
  if (slot < 0) return;
  for (int j = 0; j < taps - 1; ++j)                   // v: this group's own channel, in place
    if (active && lane == 0) win[(long long)j * C + cv + vr] = kda_full_at(xs, win, n + j, cv + vr, C, taps);
  __shared__ int last;
#ifdef CONTROL_WINDOW_EAGER
  __syncthreads();
  if (threadIdx.x == 0) last = 1;
#else
  __syncthreads();                                     // every group of this block has read the saved window
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&done[(long long)e * H + h], 1) == (int)gridDim.x - 1;
    if (last) done[(long long)e * H + h] = 0;
  }
#endif
  __syncthreads();
  if (!last) return;
  for (int kk = threadIdx.x; kk < K; kk += blockDim.x)
    for (int j = 0; j < taps - 1; ++j) {               // rows ascending: in place
      win[(long long)j * C + cq + kk] = kda_full_at(xs, win, n + j, cq + kk, C, taps);
      win[(long long)j * C + ck + kk] = kda_full_at(xs, win, n + j, ck + kk, C, taps);
    }
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
