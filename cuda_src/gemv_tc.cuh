// gemv_tc.cuh -- the bf16 decode/verify GEMV on the tensor core (DESIGN §3b): one block of (16, GEMV_OUTS) threads
// (8 warps) sums up to GEMV_ROWS rows against GEMV_OUTS columns of NW weights (1, or 2 for gate and up).
//
// Order (cupyglm/backend/tc_order.py, the numpy reference): K in slices of GTC_SLICE (the last shorter); a slice is
// one warp's chain of mma.m16n8k16 (mma.cuh) from +0.0, the weights' 16 columns as A, the rows as B's 8 columns (a
// second mma for rows 9..16 only); the slices' fp32 results are added in slice order by the block.  In a slice, 32 k
// at k0 make two steps: lane (g, t) loads 8 consecutive k (k0 + 8t ..) of weight columns g and g + 8 and of rows
// g (and g + 8) in one 16-byte load each; step s takes words 2s, 2s + 1 of each (k0 + 8t + 4s + 0..3).  Weights go
// from global memory straight into the A fragments (GTC_UNROLL 32-blocks of loads in flight, no staging); a row
// past the real rows is a zero column.  Nothing depends on how many rows the block holds.
#pragma once
#include "common.cuh"
#include "mma.cuh"
#include "gemv_tile.cuh"

#define GTC_SLICE 512                    // k of one warp's chain
#define GTC_WARPS 8                      // warps of a (16, GEMV_OUTS) block: slices taken GTC_WARPS at a time

// Slice results of one round of GTC_WARPS slices: [weight, warp, row, column].
template <int NW>
struct GemvTcShared {
  float part[NW][GTC_WARPS][GEMV_ROWS][GEMV_OUTS];
};

// 32-blocks of loads issued before their mma (register budget: two weights halve it).
template <int NW>
struct GemvTcUnroll {
  static constexpr int U = NW == 1 ? 4 : 2;
};

static __device__ __forceinline__ float gtc_lo(unsigned v) { return __uint_as_float(v << 16); }
static __device__ __forceinline__ float gtc_hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }

// CONTROL_TC_IEEE (planted): the step as IEEE fp32 multiply-adds in k order (fragments gathered by shuffles), not
// the tensor core's model.
static __device__ __forceinline__ void gtc_ieee(float d[4], const unsigned a[4], const unsigned b[2]) {
  const int lane = (threadIdx.y * blockDim.x + threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  for (int tt = 0; tt < 4; ++tt) {
    unsigned A[4], B[2][2];
    for (int r = 0; r < 4; ++r) A[r] = __shfl_sync(FULL_MASK, a[r], 4 * g + tt);
    for (int c = 0; c < 2; ++c)
      for (int r = 0; r < 2; ++r) B[c][r] = __shfl_sync(FULL_MASK, b[r], 4 * (2 * t + c) + tt);
    for (int e = 0; e < 4; ++e) {
      const unsigned lo = A[e >> 1], hi = A[2 + (e >> 1)];
      const unsigned* bc = B[e & 1];
      d[e] = __fadd_rn(d[e], __fmul_rn(gtc_lo(lo), gtc_lo(bc[0])));
      d[e] = __fadd_rn(d[e], __fmul_rn(gtc_hi(lo), gtc_hi(bc[0])));
      d[e] = __fadd_rn(d[e], __fmul_rn(gtc_lo(hi), gtc_lo(bc[1])));
      d[e] = __fadd_rn(d[e], __fmul_rn(gtc_hi(hi), gtc_hi(bc[1])));
    }
  }
}

static __device__ __forceinline__ void gtc_mma(float d[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                               unsigned b0, unsigned b1) {
  const unsigned a[4] = {a0, a1, a2, a3};
  const unsigned b[2] = {b0, b1};
#ifdef CONTROL_TC_IEEE
  gtc_ieee(d, a, b);
#else
  mma_m16n8k16_bf16(d, a, b, d);
#endif
}

// One 32-block's two steps: wg / wh the lane's chunks of weight columns g / g + 8, xr the rows' chunks.
// CONTROL_TC_REVERSED (planted): the two steps of a block taken in the other order.
template <int NT>
static __device__ __forceinline__ void gtc_block(float (*d)[4], uint4 wg, uint4 wh, const uint4* xc) {
#ifdef CONTROL_TC_REVERSED
  const int s0 = 1;
#else
  const int s0 = 0;
#endif
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int s = s0 ^ q;
    const unsigned ag = s ? wg.z : wg.x, ag2 = s ? wg.w : wg.y, ah = s ? wh.z : wh.x, ah2 = s ? wh.w : wh.y;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#ifdef CONTROL_TC_TRANSPOSED                 // planted: a fragment's two k halves swapped
      gtc_mma(d[j], ag2, ah2, ag, ah, s ? xc[j].z : xc[j].x, s ? xc[j].w : xc[j].y);
#else
      gtc_mma(d[j], ag, ah, ag2, ah2, s ? xc[j].z : xc[j].x, s ? xc[j].w : xc[j].y);
#endif
    }
  }
}

// x row c's 8 values at kk of a whole aligned chunk (the reader's vec holds): any reader's load8 with valid 8;
// the plain reader loads it with no checks.
template <typename XR>
static __device__ __forceinline__ uint4 gtc_x_whole(const XR& xr, int c, int kk) { return xr.load8(c, kk, 8); }
static __device__ __forceinline__ uint4 gtc_x_whole(const GemvXMem& xr, int c, int kk) {
  return *reinterpret_cast<const uint4*>(xr.x + (long long)c * xr.K + kk);
}

// The slice's 32-blocks from kb on, U at a time, into d; returns where it stopped.  WHOLE: only runs of U blocks
// that lie inside [.., k1), every load a whole aligned chunk (src.vec and xr.vec), so the loop holds no bounds or
// fallback code; else every block up to k1, partial chunks read element by element.  The blocks' order and steps
// are the same either way.
template <int NW, int NT, int U, bool WHOLE, typename XR>
static __device__ __forceinline__ int gtc_run(float (*d)[NT][4], const GemvSrc<NW>& src, const XR& xr, int kb,
                                              int k1, int g, int t) {
  const long long rg = (long long)g * src.K + 8 * t, rh = (long long)(g + 8) * src.K + 8 * t;
  const bool cg = g < src.ncols, ch = g + 8 < src.ncols;
  for (; WHOLE ? kb + 32 * U <= k1 : kb < k1; kb += 32 * U) {
    uint4 wg[U][NW], wh[U][NW], xc[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {            // every load of the U blocks in flight before the first mma
      const int kb_u = kb + 32 * u, valid = WHOLE ? 8 : min(8, k1 - kb_u - 8 * t);
#pragma unroll
      for (int i = 0; i < NW; ++i) {
        const __nv_bfloat16 *pg = src.w[i] + rg + kb_u, *ph = src.w[i] + rh + kb_u;
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        wg[u][i] = !cg ? z : WHOLE ? *reinterpret_cast<const uint4*>(pg) : gemv_load8(pg, valid, src.vec);
        wh[u][i] = !ch ? z : WHOLE ? *reinterpret_cast<const uint4*>(ph) : gemv_load8(ph, valid, src.vec);
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int c = g + 8 * j, kk = kb_u + 8 * t;
        xc[u][j] = c >= src.nrows ? make_uint4(0u, 0u, 0u, 0u)
                   : WHOLE        ? gtc_x_whole(xr, c, kk) : xr.load8(c, kk, valid);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (WHOLE || kb + 32 * u < k1)         // warp-uniform: no step past the slice's last 32-block
#pragma unroll
        for (int i = 0; i < NW; ++i) gtc_block<NT>(d[i], wg[u][i], wh[u][i], xc[u]);
  }
  return kb;
}

// One warp's slice [k0, k1): d[i][j] the D fragments (weight i, row tile j) from +0.0.  Warp-uniform bounds.  The
// runs of whole chunks go through the WHOLE loop, the rest (a short tail, or unaligned rows) one block at a time.
template <int NW, int NT, typename XR>
static __device__ __forceinline__ void gtc_slice(float (*d)[NT][4], const GemvSrc<NW>& src, const XR& xr, int k0,
                                                 int k1, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < NW; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) d[i][j][0] = d[i][j][1] = d[i][j][2] = d[i][j][3] = 0.0f;
  int kb = k0;
  if (src.vec && xr.vec) kb = gtc_run<NW, NT, GemvTcUnroll<NW>::U, true>(d, src, xr, kb, k1, g, t);
  gtc_run<NW, NT, 1, false>(d, src, xr, kb, k1, g, t);
}

// The block's rows in NT row tiles of 8: out[i] = this thread's (row threadIdx.x, column threadIdx.y) sum of
// weight i over all K (meaningful for rows < nrows, columns < ncols).  Every thread takes part (barriers).
template <int NW, int NT, typename XR>
static __device__ __forceinline__ void gtc_rows_nt(GemvTcShared<NW>& sh, const GemvSrc<NW>& src, const XR& xr,
                                                   float out[NW]) {
  const int tid = threadIdx.y * 16 + threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3, r = threadIdx.x, o = threadIdx.y;
  const int slices = (src.K + GTC_SLICE - 1) / GTC_SLICE;
#pragma unroll
  for (int i = 0; i < NW; ++i) out[i] = 0.0f;
  for (int s0 = 0; s0 < slices; s0 += GTC_WARPS) {
    const int sl = s0 + warp;
    if (sl < slices) {
      float d[NW][NT][4];
      gtc_slice<NW, NT>(d, src, xr, sl * GTC_SLICE, min(src.K, (sl + 1) * GTC_SLICE), lane);
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

// The row tiles of nrows rows (block-uniform): 1 for up to 8 rows, 2 beyond.  GEMV_BUCKET_ONLY (the speed model's
// compile) fixes it, so a disassembly holds one loop.
static __device__ __forceinline__ int gtc_tiles(int nrows) {
#ifdef GEMV_BUCKET_ONLY
  return GEMV_BUCKET_ONLY <= 8 ? 1 : 2;
#else
  return nrows <= 8 ? 1 : 2;
#endif
}

// The block's rows (src.nrows <= GEMV_ROWS) through reader xr: out[i] as gtc_rows_nt's.
template <int NW, typename XR>
static __device__ __forceinline__ void gemv_tc_rows(GemvTcShared<NW>& sh, const GemvSrc<NW>& src, const XR& xr,
                                                    float out[NW]) {
  if (gtc_tiles(src.nrows) == 1)
    gtc_rows_nt<NW, 1>(sh, src, xr, out);
  else
    gtc_rows_nt<NW, 2>(sh, src, xr, out);
}

// The rows of x read from memory (src.x at stride K).
template <int NW>
static __device__ __forceinline__ void gemv_tc_rows(GemvTcShared<NW>& sh, const GemvSrc<NW>& src, float out[NW]) {
  const GemvXMem xr = {src.x, src.K, src.vec};
  gemv_tc_rows(sh, src, xr, out);
}
