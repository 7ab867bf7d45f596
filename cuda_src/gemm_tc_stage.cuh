// gemm_tc_stage.cuh -- gemm_tc.cu's dense tile: a 64-row by 128-column block tile of 8 warps whose x and w k-tiles
// are staged through shared memory (cp.async, GTS_STAGES deep), so each loaded byte feeds every warp that needs it.
//
// Order: gemm_tc.cu's (the decode GEMV's, fixed by K alone).  A stage holds GTS_K = 64 consecutive k (two 32-blocks,
// GTS_K divides GTC_SLICE, so a stage never straddles a slice); every lane then reads from shared memory exactly
// the 16-byte chunks it would have loaded from global memory (8 consecutive k at kb + 8t of rows g, g + 8 and of
// column g of each 8-column tile) and takes gtc_block's two steps on them, the 32-blocks in ascending k, none past
// K.  Chunks past K are zeros, as gemv_load8 gives them; rows past M (columns past N) read row M - 1 (column N - 1)
// and are not stored.
//
// Shared layout: a row of a stage is 8 chunks of 16 bytes; chunk c of row r sits at chunk c ^ 4 (r & 1), so the 8
// lanes of a 16-byte load phase (rows 2p, 2p + 1, chunks 4b .. 4b + 3) hit 32 distinct banks.
#pragma once
#include "common.cuh"
#include "gemv_tc.cuh"

#define GTS_M 64                       // rows a block
#define GTS_N 128                      // columns a block
#define GTS_K 64                       // k a stage
#define GTS_NT 4                       // 8-column mma tiles a warp
#define GTS_STAGES 3                   // stages in flight
#define GTS_THREADS 256                // 8 warps: 2 (32 rows each) x 4 (32 columns each)
#define GTS_CHUNKS (GTS_K / 8)         // 16-byte chunks a stage row
#define GTS_XROWS (GTS_M / (GTS_THREADS / GTS_CHUNKS))   // x rows a thread copies a stage
#define GTS_WROWS (GTS_N / (GTS_THREADS / GTS_CHUNKS))   // w rows a thread copies a stage

// One stage: x rows then w rows, GTS_CHUNKS chunks each.
struct GtsStage {
  uint4 x[GTS_M * GTS_CHUNKS];
  uint4 w[GTS_N * GTS_CHUNKS];
};

static __device__ __forceinline__ int gts_at(int r, int c) { return r * GTS_CHUNKS + (c ^ ((r & 1) << 2)); }

// 16 bytes from global to shared memory; zeros when the chunk lies past K (valid <= 0).  VEC: cp.async (the
// emulator: a plain copy); else the valid elements one by one (unaligned rows or K % 8 != 0).
template <bool VEC>
static __device__ __forceinline__ void gts_copy(uint4* dst, const __nv_bfloat16* src, int valid) {
  if (!VEC) {
    *dst = gemv_load8(src, valid, false);
    return;
  }
#ifdef __CUEMU__
  *dst = valid > 0 ? *reinterpret_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
#else
  const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(valid > 0 ? 16 : 0));
#endif
}

static __device__ __forceinline__ void gts_commit() {
#ifndef __CUEMU__
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Every copy but the latest GTS_STAGES - 2 groups of this thread has landed.
static __device__ __forceinline__ void gts_wait() {
#ifndef __CUEMU__
  asm volatile("cp.async.wait_group %0;\n" ::"n"(GTS_STAGES - 2));
#endif
}

// The rows this thread copies (their first k) and its chunk of each stage row.
struct GtsSrc {
  const __nv_bfloat16* x[GTS_XROWS];
  const __nv_bfloat16* w[GTS_WROWS];
  int K;
};

static __device__ __forceinline__ GtsSrc gts_src(const __nv_bfloat16* x, const __nv_bfloat16* w, int m0, int n0,
                                                 int M, int N, int K) {
  const int r0 = threadIdx.x / GTS_CHUNKS, c = threadIdx.x % GTS_CHUNKS;
  GtsSrc s;
#pragma unroll
  for (int q = 0; q < GTS_XROWS; ++q) s.x[q] = x + (long long)min(m0 + r0 + 32 * q, M - 1) * K + 8 * c;
#pragma unroll
  for (int q = 0; q < GTS_WROWS; ++q) s.w[q] = w + (long long)min(n0 + r0 + 32 * q, N - 1) * K + 8 * c;
  s.K = K;
  return s;
}

// Stage st (k from GTS_K st) into sh: this thread's chunks, one commit group.
template <bool VEC>
static __device__ __forceinline__ void gts_issue(GtsStage& sh, const GtsSrc& s, int st) {
  const int r0 = threadIdx.x / GTS_CHUNKS, c = threadIdx.x % GTS_CHUNKS;
  const int k = GTS_K * st, valid = min(8, s.K - k - 8 * c);
  const int at = valid > 0 ? k : 0;           // a chunk past K reads nothing (cp.async's source size 0)
#pragma unroll
  for (int q = 0; q < GTS_XROWS; ++q) gts_copy<VEC>(&sh.x[gts_at(r0 + 32 * q, c)], s.x[q] + at, valid);
#pragma unroll
  for (int q = 0; q < GTS_WROWS; ++q) gts_copy<VEC>(&sh.w[gts_at(r0 + 32 * q, c)], s.w[q] + at, valid);
  gts_commit();
}

// One 32-block (b of the stage) of the warp's 32 x 32 tile: gtc_block's two steps, row tile 0 then 1 (each
// output's chain keeps its own order).
static __device__ __forceinline__ void gts_block(float (*d)[GTS_NT][4], const GtsStage& sh, int b, int wm, int wn,
                                                 int g, int t) {
  const int c = 4 * b + t;
  uint4 xa[2], xb[2], wc[GTS_NT];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    xa[i] = sh.x[gts_at(32 * wm + 16 * i + g, c)];
    xb[i] = sh.x[gts_at(32 * wm + 16 * i + g + 8, c)];
  }
#pragma unroll
  for (int j = 0; j < GTS_NT; ++j) wc[j] = sh.w[gts_at(32 * wn + 8 * j + g, c)];
#pragma unroll
  for (int i = 0; i < 2; ++i) gtc_block<GTS_NT>(d[i], xa[i], xb[i], wc);
}

// The warp's 32 x 32 tile over one stage at k: each of its 32-blocks below K (block-uniform: no step past K's last
// 32-block).  Element loads (!VEC, a rare path) take them in a loop of their own, one at a time.
template <bool VEC>
static __device__ __forceinline__ void gts_compute(float (*d)[GTS_NT][4], const GtsStage& sh, int k, int K, int wm,
                                                   int wn, int g, int t) {
  if (VEC) {
#pragma unroll
    for (int b = 0; b < GTS_K / 32; ++b)
      if (b == 0 || k + 32 * b < K) gts_block(d, sh, b, wm, wn, g, t);
  } else {
#pragma unroll 1
    for (int b = 0; b < GTS_K / 32 && k + 32 * b < K; ++b) gts_block(d, sh, b, wm, wn, g, t);
  }
}

// The block's tile over all K into this warp's acc (row tile i, column tile j): each slice's chain from +0.0, the
// slices added in slice order.  Every thread takes part (barriers).
template <bool VEC>
static __device__ __forceinline__ void gts_sum(float (*acc)[GTS_NT][4], GtsStage* sh, const GtsSrc& s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp & 1, wn = warp >> 1, K = s.K, nst = (K + GTS_K - 1) / GTS_K;
#pragma unroll
  for (int st = 0; st < GTS_STAGES - 1; ++st) {
    if (st < nst) gts_issue<VEC>(sh[st], s, st);
    else gts_commit();                         // empty groups keep wait_group's count
  }
  int st = 0, buf = 0;
  for (int k0 = 0; k0 < K; k0 += GTC_SLICE) {
    float d[2][GTS_NT][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < GTS_NT; ++j) d[i][j][0] = d[i][j][1] = d[i][j][2] = d[i][j][3] = 0.0f;
    const int k1 = min(K, k0 + GTC_SLICE);
    for (; GTS_K * st < k1; ++st) {
      gts_wait();
      __syncthreads();                         // stage st landed for all; stage st - 1 read by all
      const int nx = st + GTS_STAGES - 1, nbuf = buf == 0 ? GTS_STAGES - 1 : buf - 1;
      if (nx < nst) gts_issue<VEC>(sh[nbuf], s, nx);
      else gts_commit();
      gts_compute<VEC>(d, sh[buf], GTS_K * st, K, wm, wn, g, t);
      buf = buf == GTS_STAGES - 1 ? 0 : buf + 1;
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < GTS_NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = k0 == 0 ? d[i][j][e] : acc[i][j][e] + d[i][j][e];
  }
}
