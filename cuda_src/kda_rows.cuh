// kda_rows.cuh -- the per-value-row pieces of the KDA delta rule shared by kda.cu's kda_recurrence and
// kda_step.cu's decode steps: one token of the recurrence by a group of 16 threads (lane-16 order over k), the
// state row's load and store, and kda_conv's output and the [window; x] rows per channel (the same sums as
// kda_conv, so a fused step has its bits).
#pragma once
#include "common.cuh"
#include "exp_f32.cuh"

#define KDA_MAX_J 16     // K <= 16 * 16 = 256 key columns (the model has 128)

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

// lane16_fold of R rows' partials a[0..R) at once (R = 1, 2, 4): at each xor step while more than one row is left,
// the lanes with the step's bit set keep the upper half of the rows and send the lower half, so every add is one
// of lane16_fold's (the same two operands).  Returns the total of row lane / (16 / R) (every lane of those).
template <int R>
static __device__ __forceinline__ float lane16_fold_rows(float (&a)[R], int lane) {
  static_assert(R == 1 || R == 2 || R == 4, "1, 2 or 4 rows");
  int m = R;
#pragma unroll
  for (int w = 8; w > 0; w >>= 1) {
    if (m > 1) {
      const bool up = (lane & w) != 0;
#pragma unroll
      for (int i = 0; i < R / 2; ++i) {
        if (i < m / 2) {
          const float keep = up ? a[m / 2 + i] : a[i], send = up ? a[i] : a[m / 2 + i];
          a[i] = keep + __shfl_xor_sync(FULL_MASK, send, w, 16);
        }
      }
      m /= 2;
    } else {
      a[0] += __shfl_xor_sync(FULL_MASK, a[0], w, 16);
    }
  }
  return a[0];
}

// One token of the delta rule for R value rows of one group of 16 threads, K = 16 J key columns (no column past
// K): each row's sums exactly kda_token's (the same operations in the same order), q, k and g read once for the R
// rows.  s[r][j]: row r's S[h, v, lane + 16 j]; v[r]: row r's v; returns the y of row lane / (16 / R).
template <int J, int R>
static __device__ __forceinline__ float kda_token_rows(float (&s)[R][J], const float (&qv)[J], const float (&kv)[J],
                                                       const float (&gv)[J], const float (&v)[R], float beta,
                                                       int lane) {
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      s[r][j] = s[r][j] * gv[j];
      acc[r] += s[r][j] * kv[j];
    }
  const float mine = lane16_fold_rows<R>(acc, lane);
  float u[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    u[r] = (v[r] - (R == 1 ? mine : __shfl_sync(FULL_MASK, mine, r * (16 / R), 16))) * beta;
    acc[r] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      s[r][j] = s[r][j] + u[r] * kv[j];
      acc[r] += s[r][j] * qv[j];
    }
  return lane16_fold_rows<R>(acc, lane);
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
