// gemv_q_block.cuh -- a block of the quantised decode/verify GEMV (gemv_q.cu's kernels): the warps' slices through
// gemv_q_tc.cuh's block runs, their sums in slice order (gemv_tc.cuh's rounds), and the block's source and output
// (NVFP4's tensor scale once per output).
#pragma once
#include "gemv_q_tc.cuh"
#include "gemv_part.cuh"
#include "swiglu.cuh"

#define GEMV_Q_PAIR_OUTS 8                   // output columns of a dense SwiGLU block (ops_gemv_q.PAIR_OUTS)

// One warp's slice [k0, k1): acc[i][j] the D fragments (weight i, row tile j), FP8's scaled.  Warp-uniform bounds.
template <int NW, int NT, int F, typename XR>
static __device__ __forceinline__ void gq_slice(float (*acc)[NT][4], const GemvQSrc<NW>& src, const XR& xr, int k0,
                                                int k1, int lane) {
  const int g = lane >> 2, t = lane & 3, rb = gq_row_bytes<F>(src.K), bk = src.w[0].bk, gk = src.K / 16;
  float d[NW][NT][4];
  const unsigned char* rg[2 * NW];
  const unsigned char* sr[2 * NW];
#pragma unroll
  for (int i = 0; i < NW; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = gq_lane_col(src, g, h);
      const GemvQw& w = gq_w(src, i, c);
      const long long row = src.e * src.N + src.n0 + gq_col(src, c);
      rg[2 * i + h] = w.v + row * rb;
      sr[2 * i + h] = F == GEMV_NVFP4 ? w.ns + row * gk : nullptr;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) d[i][j][e] = acc[i][j][e] = 0.0f;
  }
  if (F == GEMV_NVFP4) {
    gq_blocks<NW, NT, F>(acc, src, xr, rg, sr, k0, k1, k1, g, t);
    return;
  }
  for (int a = k0; a < k1;) {                // FP8: a chain per bk-block, closed into acc in k order
    const int b = min(k1, (a / bk + 1) * bk);
    gq_blocks<NW, NT, F>(d, src, xr, rg, sr, a, b, k1, g, t);
    gq_close<NW, NT>(acc, d, src, a / bk, g, a == k0);
    a = b;
  }
}

// As gemv_tc.cuh's gtc_rows_nt: out[i] = thread (row threadIdx.x, column threadIdx.y)'s slices of weight i added
// in slice order (NVFP4's scale_2 not applied); 0 slices when the block has no column.  Every thread takes part.
template <int NW, int NT, int F, typename XR>
static __device__ __forceinline__ void gq_rows_nt(GemvTcShared<NW>& sh, const GemvQSrc<NW>& src, const XR& xr,
                                                  float out[NW]) {
  const int tid = threadIdx.y * 16 + threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3, r = threadIdx.x, o = threadIdx.y;
  const int slices = src.ncols > 0 ? (src.K + GTC_SLICE - 1) / GTC_SLICE : 0;
#pragma unroll
  for (int i = 0; i < NW; ++i) out[i] = 0.0f;
  for (int s0 = 0; s0 < slices; s0 += GTC_WARPS) {
    const int sl = s0 + warp;
    if (sl < slices) {
      float d[NW][NT][4];
      gq_slice<NW, NT, F>(d, src, xr, sl * GTC_SLICE, min(src.K, (sl + 1) * GTC_SLICE), lane);
#pragma unroll
      for (int i = 0; i < NW; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)        // d[e] = D[column g + 8 (e / 2)][row 2t + e % 2]
            sh.part[i][warp][8 * j + 2 * t + (e & 1)][g + 8 * (e >> 1)] = d[i][j][e];
    }
    __syncthreads();
    const int n = min(GTC_WARPS, slices - s0);
    if (r < 8 * NT)
      for (int w = 0; w < n; ++w)
#pragma unroll
        for (int i = 0; i < NW; ++i) out[i] = s0 + w == 0 ? sh.part[i][w][r][o] : out[i] + sh.part[i][w][r][o];
    __syncthreads();                         // the round is read before the next one is written
  }
}

// The block's rows (src.nrows <= GEMV_ROWS) read through xr in 1 or 2 row tiles (gtc_tiles): out[i] as
// gq_rows_nt's.
template <int NW, int F, typename XR>
static __device__ __forceinline__ void gemv_q_rows_x(GemvTcShared<NW>& sh, const GemvQSrc<NW>& src, const XR& xr,
                                                     float out[NW]) {
  if (gtc_tiles(src.nrows) == 1)
    gq_rows_nt<NW, 1, F>(sh, src, xr, out);
  else
    gq_rows_nt<NW, 2, F>(sh, src, xr, out);
}

// gemv_q_rows_x of the rows at src.x (stride K).
template <int NW, int F>
static __device__ __forceinline__ void gemv_q_rows(GemvTcShared<NW>& sh, const GemvQSrc<NW>& src, float out[NW]) {
  const GemvXMem xr = {src.x, src.K, src.xvec};
  gemv_q_rows_x<NW, F>(sh, src, xr, out);
}

// A block's source: columns from n0 of expert e of each weight (ncols = 0: nothing read).
template <int NW, int F>
static __device__ __forceinline__ void gemv_q_src(GemvQSrc<NW>& src, const GemvQw (&w)[NW], long long e, int n0,
                                                  int ncols, int N, int K, const __nv_bfloat16* x) {
  const int rb = gq_row_bytes<F>(K), n = GqFmt<F>::BYTES;
  bool wvec = rb % n == 0, svec = F == GEMV_NVFP4 && (K / 16) % 2 == 0;
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    src.w[i] = w[i];
    src.s2[i] = F == GEMV_NVFP4 && ncols > 0 ? w[i].s2[e] : 0.0f;
    wvec = wvec && (((unsigned long long)w[i].v) % n == 0);
    svec = svec && (F != GEMV_NVFP4 || ((unsigned long long)w[i].ns) % 2 == 0);
  }
  src.pair = false;
  src.wu = w[0];
  src.s2u = 0.0f;
  src.e = e;
  src.n0 = n0;
  src.ncols = ncols;
  src.N = N;
  src.K = K;
  src.x = x;
  src.xvec = gemv_aligned(x, x, K);
  src.wvec = wvec;
  src.svec = svec;
}

// gemv_q_src's source made a pair (NW = 1, ncols <= 8): the block's columns 8..15 are wu's n0.. (gemv_q_pair_out).
template <int F>
static __device__ __forceinline__ void gemv_q_pair(GemvQSrc<1>& src, const GemvQw& wu) {
  src.pair = true;
  src.wu = wu;
  src.s2u = F == GEMV_NVFP4 && src.ncols > 0 ? wu.s2[src.e] : 0.0f;
  src.wvec = src.wvec && ((unsigned long long)wu.v) % GqFmt<F>::BYTES == 0;
  src.svec = src.svec && (F != GEMV_NVFP4 || ((unsigned long long)wu.ns) % 2 == 0);
}

// A pair block's output of thread column o (out as gq_rows_nt's), NVFP4's tensor scale of its weight applied.
template <int F>
static __device__ __forceinline__ float gemv_q_pair_out(const GemvQSrc<1>& src, float out, int o) {
  return F == GEMV_NVFP4 ? out * (o < 8 ? src.s2[0] : src.s2u) : out;
}

// out[i] times NVFP4's tensor scale (once per output); FP8's as summed.
template <int NW, int F>
static __device__ __forceinline__ float gemv_q_out(const GemvQSrc<NW>& src, const float out[NW], int i) {
  return F == GEMV_NVFP4 ? out[i] * src.s2[i] : out[i];
}

static __device__ __forceinline__ void gemv_q_store(float* y, long long i, float v) { y[i] = v; }
static __device__ __forceinline__ void gemv_q_store(__nv_bfloat16* y, long long i, float v) { y[i] = to_bf16(v); }
// A multi launch's quantised part's output element: gemv_part.cuh's epilogue (kind 0 fp32, 1 bf16, 2 bf16 sigmoid).
static __device__ __forceinline__ void gemv_q_store(const GemvPart& p, long long i, float v) {
  gemv_part_store(p, i, v);
}

// The block's rows [m0, m0 + nrows) (nrows <= GEMV_ROWS) read through xr (row c of the block at xr's row c) against
// src's column block (from src.n0), stored in y [M, N] by gemv_q_store(y, ...); valid false (an expert id outside
// [0, E)): NaN rows, no weight read (src.ncols 0).
template <int F, typename XR, typename Y>
static __device__ __forceinline__ void gemv_q_group_x(GemvTcShared<1>& sh, GemvQSrc<1>& src, const XR& xr, Y y, int N,
                                                      int m0, int nrows, bool valid) {
  src.nrows = valid ? nrows : 0;
  float v[1];
  gemv_q_rows_x<1, F>(sh, src, xr, v);
  const int lane = threadIdx.x, n = src.n0 + threadIdx.y;
  if (n < N && lane < nrows) gemv_q_store(y, (long long)(m0 + lane) * N + n, valid ? gemv_q_out<1, F>(src, v, 0) : NAN);
}

// gemv_q_group_x of rows [m0, m0 + nrows) of x [M, K] bf16 in memory.
template <int F, typename Y>
static __device__ __forceinline__ void gemv_q_group(GemvTcShared<1>& sh, GemvQSrc<1>& src, const __nv_bfloat16* x,
                                                    Y y, int N, int K, int m0, int nrows, bool valid) {
  src.x = x + (long long)m0 * K;
  const GemvXMem xr = {src.x, K, src.xvec};
  gemv_q_group_x<F>(sh, src, xr, y, N, m0, nrows, valid);
}

static __device__ __forceinline__ GemvQw gemv_qw_fp8(const unsigned char* v, const float* s, int bn, int bk) {
  GemvQw w = {v, s, nullptr, nullptr, bn, bk};
  return w;
}

static __device__ __forceinline__ GemvQw gemv_qw_nvfp4(const unsigned char* v, const unsigned char* s,
                                                      const float* s2) {
  GemvQw w = {v, nullptr, s, s2, 1, 16};
  return w;
}

// The dense SwiGLU's pair block bx of GEMV_Q_PAIR_OUTS columns (twice the blocks of a 16-column grid): each lane's
// two A halves are the gate's and the up's column, so one chain serves both; the up sums reach the gate's thread
// through shared memory.
template <int F>
static __device__ __forceinline__ void gemv_q_swiglu_body(GemvTcShared<1>& sh, int bx,
                                                          const __nv_bfloat16* __restrict__ x, const GemvQw& wg,
                                                          const GemvQw& wu, __nv_bfloat16* __restrict__ y, int N,
                                                          int K, int rows, int has_limit, float limit) {
  const int n0 = bx * GEMV_Q_PAIR_OUTS, m0 = blockIdx.y * GEMV_ROWS;
  const GemvQw w[1] = {wg};
  GemvQSrc<1> src;
  gemv_q_src<1, F>(src, w, 0, n0, min(GEMV_Q_PAIR_OUTS, N - n0), N, K, x);
  gemv_q_pair<F>(src, wu);
  src.x = x + (long long)m0 * K;
  src.nrows = min(GEMV_ROWS, rows - m0);
  float v[1];
  gemv_q_rows<1, F>(sh, src, v);             // ends on a barrier: part is free
  const int lane = threadIdx.x, o = threadIdx.y, n = n0 + o;
  sh.part[0][0][lane][o] = gemv_q_pair_out<F>(src, v[0], o);
  __syncthreads();
  if (o < GEMV_Q_PAIR_OUTS && n < N && lane < src.nrows)
    y[(long long)(m0 + lane) * N + n] = to_bf16(swiglu_f32(bf16_round(sh.part[0][0][lane][o]),
                                                           bf16_round(sh.part[0][0][lane][o + 8]), has_limit, limit));
}
