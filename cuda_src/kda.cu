// kda.cu -- Kimi Delta Attention: short conv + SiLU (kda_conv), per-channel decay (kda_gate), L2 norm
// (l2norm), the per-token delta rule with an fp32 state (kda_recurrence for any K; kda_recurrence_k{32,128}_r{1,2,4}
// with the inputs staged in shared memory and R value rows a group, the same bits; the same recurrence for prefill
// and decode, so a state computed by prefill equals one computed token by token; the decode steps with the conv,
// the q/k norms, the low-rank factors and the decay fused in are in kda_step.cu), and the gated RMS norm of the
// output (kda_out).  Reference: NumpyOps.kda_* / l2norm in cupyglm/backend/numpy_kda.py; sums over a head
// dimension in lane-16 order, the 4 taps left to right.  Storage: bf16 for what the model keeps in bf16 (the conv
// input, window and taps, gate inputs, v, beta, y, the norm's weight and output); fp32 for the recurrent state S,
// the decay g and the normalised q, k.
#include "common.cuh"
#include "cp_async.cuh"
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

// The delta rule with its inputs staged: a block (KDA_REC_GROUPS groups of 16 threads, R value rows a group, K =
// 16 J) copies q, k and g of the next KDA_CHUNK tokens of its head into shared memory (cp.async, 16 bytes a copy)
// and their v and beta through registers while it runs the current chunk from the other stage; each group then
// runs kda_token_rows, each row's sums and state updates exactly kda_recurrence's.
#define KDA_CHUNK 8          // tokens a stage holds
#define KDA_REC_GROUPS 8     // groups of 16 threads a block: 128 threads

// Planted controls of the contract (cupyglm/contract/cases_kda.py), one -D each.
#ifdef KDA_PLANT_SHORT_TAIL      // a prompt that ends inside a stage loses its last token
#define KDA_TAIL(tn) ((tn) < KDA_CHUNK ? (tn) - 1 : (tn))
#else
#define KDA_TAIL(tn) (tn)
#endif
#ifdef KDA_PLANT_FIRST_V         // every row of a group reads the group's first v
#define KDA_V_ROW(r) 0
#else
#define KDA_V_ROW(r) (r)
#endif
#ifdef KDA_PLANT_WHOLE_GROUPS    // a group with fewer than R rows inside V is dropped
#define KDA_ROW_OK(row0, r, V) ((row0) + R <= (V))
#else
#define KDA_ROW_OK(row0, r, V) ((row0) + (r) < (V))
#endif

template <int J, int R>
struct KdaStage {
  static constexpr int K = 16 * J, ROWS = KDA_REC_GROUPS * R;
  static constexpr int QKG = KDA_CHUNK * 3 * K;            // [KDA_CHUNK][3][K] f32: q, k, g of each token
  static constexpr int VB = KDA_CHUNK * ROWS + KDA_CHUNK;  // [KDA_CHUNK][ROWS] f32 v, then [KDA_CHUNK] f32 beta
  static constexpr int SIZE = QKG + VB;
  static constexpr int ITEMS = (VB + 16 * KDA_REC_GROUPS - 1) / (16 * KDA_REC_GROUPS);   // v, beta a thread
};

// q, k, g of tokens t0 .. t0 + KDA_CHUNK - 1 (zeros past n) into st, 16-byte copies (cp.async: the launcher
// passes 16-byte aligned q, k, g): a thread copies columns c .. c + 3 of tokens tt, tt + TPP, ... of each.
template <int J>
struct KdaCopy {
  static constexpr int K = 16 * J, PPT = K / 4, TPP = 16 * KDA_REC_GROUPS / PPT;   // pieces a token, tokens a pass
  static_assert(16 * KDA_REC_GROUPS % PPT == 0, "a pass covers whole tokens");
  int tt, c;
  long long row, pass;     // (tt * H + h) * K + c; TPP * H * K
};

template <int J>
static __device__ __forceinline__ KdaCopy<J> kda_copy_plan(int H, int h) {
  using C = KdaCopy<J>;
  KdaCopy<J> p;
  p.tt = threadIdx.x / C::PPT;
  p.c = 4 * (threadIdx.x % C::PPT);
  p.row = ((long long)p.tt * H + h) * C::K + p.c;
  p.pass = (long long)C::TPP * H * C::K;
  return p;
}

template <int J>
static __device__ __forceinline__ void kda_stage_qkg(float* st, const float* q, const float* k, const float* g,
                                                     const KdaCopy<J>& p, int t0, int n, int H) {
  using C = KdaCopy<J>;
  const long long o = (long long)t0 * H * C::K + p.row;
#pragma unroll
  for (int it = 0; it < (KDA_CHUNK + C::TPP - 1) / C::TPP; ++it) {
    const int t = p.tt + it * C::TPP;
    if (t >= KDA_CHUNK) break;
    const bool ok = t0 + t < n;
    const long long at = ok ? o + it * p.pass : 0;      // nothing is read past n: any address in the array
#pragma unroll
    for (int w = 0; w < 3; ++w) {
      const float* src = (w == 0 ? q : w == 1 ? k : g) + at;
      float* dst = st + (t * 3 + w) * C::K + p.c;
      cp_async16(dst, src, ok);
    }
  }
  cp_async_commit();
}

// v of the block's rows and beta of tokens t0 .. t0 + KDA_CHUNK - 1 into registers (zeros past n or V).
template <int J, int R>
static __device__ __forceinline__ void kda_stage_vb(float (&vb)[KdaStage<J, R>::ITEMS],
                                                    const __nv_bfloat16* v, const __nv_bfloat16* beta, int t0,
                                                    int n, int H, int h, int V, int vr0) {
  using S = KdaStage<J, R>;
#pragma unroll
  for (int it = 0; it < S::ITEMS; ++it) {
    const int i = threadIdx.x + it * 16 * KDA_REC_GROUPS;
    const int t = i < KDA_CHUNK * S::ROWS ? i / S::ROWS : i - KDA_CHUNK * S::ROWS, r = i % S::ROWS;
    const long long th = (long long)(t0 + t) * H + h;
    if (i < KDA_CHUNK * S::ROWS)
      vb[it] = (t0 + t < n && vr0 + r < V) ? ld_bf16(v, th * V + vr0 + r) : 0.0f;
    else
      vb[it] = (i < S::VB && t0 + t < n) ? ld_bf16(beta, th) : 0.0f;
  }
}

template <int J, int R>
static __device__ __forceinline__ void kda_rec_staged(const float* S_in, const float* q, const float* k,
                                                      const __nv_bfloat16* v, const float* g,
                                                      const __nv_bfloat16* beta, __nv_bfloat16* y, float* S_out,
                                                      int n, int H, int V) {
  using S = KdaStage<J, R>;
  constexpr int K = S::K;
  __shared__ __align__(16) float stage[2][S::SIZE];
  const int h = blockIdx.y, lane = threadIdx.x & 15, grp = threadIdx.x >> 4;
  const int vr0 = blockIdx.x * S::ROWS, row0 = vr0 + grp * R;
  float s[R][J];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < J; ++j)
      s[r][j] = KDA_ROW_OK(row0, r, V) ? S_in[((long long)h * V + row0 + r) * K + lane + 16 * j] : 0.0f;
  const KdaCopy<J> plan = kda_copy_plan<J>(H, h);
  float vb[S::ITEMS];
  kda_stage_qkg<J>(stage[0], q, k, g, plan, 0, n, H);
  kda_stage_vb<J, R>(vb, v, beta, 0, n, H, h, V, vr0);
  for (int t0 = 0; t0 < n; t0 += KDA_CHUNK) {
    float* st = stage[(t0 / KDA_CHUNK) & 1];
#pragma unroll
    for (int it = 0; it < S::ITEMS; ++it) {
      const int i = threadIdx.x + it * 16 * KDA_REC_GROUPS;
      if (i < S::VB) st[S::QKG + i] = vb[it];
    }
    cp_async_wait<0>();
    __syncthreads();   // this stage complete; the other one read by every group (free to refill)
    if (t0 + KDA_CHUNK < n) {
      kda_stage_qkg<J>(stage[((t0 / KDA_CHUNK) & 1) ^ 1], q, k, g, plan, t0 + KDA_CHUNK, n, H);
      kda_stage_vb<J, R>(vb, v, beta, t0 + KDA_CHUNK, n, H, h, V, vr0);
    }
    const int tn = KDA_TAIL(n - t0 < KDA_CHUNK ? n - t0 : KDA_CHUNK);
    __nv_bfloat16* yt = y + ((long long)t0 * H + h) * V + row0;      // this token's y of the group's rows
#pragma unroll 1
    for (int t = 0; t < tn; ++t, yt += (long long)H * V) {
      const float* qkg = st + t * 3 * K;
      float qv[J], kv[J], gv[J], vv[R];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        qv[j] = qkg[lane + 16 * j];
        kv[j] = qkg[K + lane + 16 * j];
        gv[j] = qkg[2 * K + lane + 16 * j];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) vv[r] = st[S::QKG + t * S::ROWS + grp * R + KDA_V_ROW(r)];
      const float yv = kda_token_rows<J, R>(s, qv, kv, gv, vv, st[S::QKG + KDA_CHUNK * S::ROWS + t], lane);
      const int r = lane / (16 / R);    // the row whose y this lane holds
      if (lane % (16 / R) == 0 && KDA_ROW_OK(row0, r, V)) yt[r] = to_bf16(yv);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (KDA_ROW_OK(row0, r, V)) S_out[((long long)h * V + row0 + r) * K + lane + 16 * j] = s[r][j];
}

// kda_rec_staged for K = 32 or 128 and 1, 2 or 4 value rows a group (the launcher picks by the rows there are).
// grid (ceil(V / (8 R)), H), 128 threads.
#define KDA_REC_ARGS S_in, q, k, v, g, beta, y, S_out, n, H, V
extern "C" __global__ void __launch_bounds__(128) kda_recurrence_k32_r1(
    const float* __restrict__ S_in,            // [H, V, 32] f32
    const float* __restrict__ q,               // [n, H, 32] f32
    const float* __restrict__ k,               // [n, H, 32] f32
    const __nv_bfloat16* __restrict__ v,       // [n, H, V] bf16
    const float* __restrict__ g,               // [n, H, 32] f32
    const __nv_bfloat16* __restrict__ beta,    // [n, H] bf16
    __nv_bfloat16* __restrict__ y,             // [n, H, V] bf16
    float* __restrict__ S_out,                 // [H, V, 32] f32
    int n, int H, int V) {
  kda_rec_staged<2, 1>(KDA_REC_ARGS);
}
extern "C" __global__ void __launch_bounds__(128) kda_recurrence_k32_r2(
    const float* __restrict__ S_in,            // [H, V, 32] f32
    const float* __restrict__ q,               // [n, H, 32] f32
    const float* __restrict__ k,               // [n, H, 32] f32
    const __nv_bfloat16* __restrict__ v,       // [n, H, V] bf16
    const float* __restrict__ g,               // [n, H, 32] f32
    const __nv_bfloat16* __restrict__ beta,    // [n, H] bf16
    __nv_bfloat16* __restrict__ y,             // [n, H, V] bf16
    float* __restrict__ S_out,                 // [H, V, 32] f32
    int n, int H, int V) {
  kda_rec_staged<2, 2>(KDA_REC_ARGS);
}
extern "C" __global__ void __launch_bounds__(128) kda_recurrence_k32_r4(
    const float* __restrict__ S_in,            // [H, V, 32] f32
    const float* __restrict__ q,               // [n, H, 32] f32
    const float* __restrict__ k,               // [n, H, 32] f32
    const __nv_bfloat16* __restrict__ v,       // [n, H, V] bf16
    const float* __restrict__ g,               // [n, H, 32] f32
    const __nv_bfloat16* __restrict__ beta,    // [n, H] bf16
    __nv_bfloat16* __restrict__ y,             // [n, H, V] bf16
    float* __restrict__ S_out,                 // [H, V, 32] f32
    int n, int H, int V) {
  kda_rec_staged<2, 4>(KDA_REC_ARGS);
}
extern "C" __global__ void __launch_bounds__(128) kda_recurrence_k128_r1(
    const float* __restrict__ S_in,            // [H, V, 128] f32
    const float* __restrict__ q,               // [n, H, 128] f32
    const float* __restrict__ k,               // [n, H, 128] f32
    const __nv_bfloat16* __restrict__ v,       // [n, H, V] bf16
    const float* __restrict__ g,               // [n, H, 128] f32
    const __nv_bfloat16* __restrict__ beta,    // [n, H] bf16
    __nv_bfloat16* __restrict__ y,             // [n, H, V] bf16
    float* __restrict__ S_out,                 // [H, V, 128] f32
    int n, int H, int V) {
  kda_rec_staged<8, 1>(KDA_REC_ARGS);
}
extern "C" __global__ void __launch_bounds__(128) kda_recurrence_k128_r2(
    const float* __restrict__ S_in,            // [H, V, 128] f32
    const float* __restrict__ q,               // [n, H, 128] f32
    const float* __restrict__ k,               // [n, H, 128] f32
    const __nv_bfloat16* __restrict__ v,       // [n, H, V] bf16
    const float* __restrict__ g,               // [n, H, 128] f32
    const __nv_bfloat16* __restrict__ beta,    // [n, H] bf16
    __nv_bfloat16* __restrict__ y,             // [n, H, V] bf16
    float* __restrict__ S_out,                 // [H, V, 128] f32
    int n, int H, int V) {
  kda_rec_staged<8, 2>(KDA_REC_ARGS);
}
extern "C" __global__ void __launch_bounds__(128) kda_recurrence_k128_r4(
    const float* __restrict__ S_in,            // [H, V, 128] f32
    const float* __restrict__ q,               // [n, H, 128] f32
    const float* __restrict__ k,               // [n, H, 128] f32
    const __nv_bfloat16* __restrict__ v,       // [n, H, V] bf16
    const float* __restrict__ g,               // [n, H, 128] f32
    const __nv_bfloat16* __restrict__ beta,    // [n, H] bf16
    __nv_bfloat16* __restrict__ y,             // [n, H, V] bf16
    float* __restrict__ S_out,                 // [H, V, 128] f32
    int n, int H, int V) {
  kda_rec_staged<8, 4>(KDA_REC_ARGS);
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
