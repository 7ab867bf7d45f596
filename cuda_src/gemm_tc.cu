// gemm_tc.cu -- the prompt-row GEMM on the tensor core (DESIGN §3b): y[h, m, n] = sum_k x[h, m, k] * w[h, n, k]
// by mma.m16n8k16 (mma.cuh), fp32 out (gemm_tc) or rounded once to bf16 in the epilogue (gemm_tc_bf16).
//
// Order: the decode GEMV's (cupyglm/backend/tc_order.py, gemv_tc.cuh), fixed by K alone.  K is cut into slices of
// GTC_SLICE; a slice is one chain of mma steps from +0.0 over its 32-blocks in ascending k, a block's two steps the
// decode GEMV's (gtc_block, so the same planted controls reach both); the slices' fp32 results are added in slice
// order.  An mma output element depends on its own row of A (x) and column of B (w) only, so a prompt row's bits
// are the decode row's: x and w swap the A / B roles of the GEMV, not the products or their k positions.
//
// Launch (gemm_tc, gemm_tc_bf16): GTS_THREADS threads (8 warps), GTS_STAGES * sizeof(GtsStage) bytes of dynamic
// shared memory; grid (ceil(M / GTS_M), ceil(N / GTS_N), H): the rows on grid.x.  A block holds a 64-row by 128-column tile, its k-tiles
// staged through shared memory (gemm_tc_stage.cuh); warp w takes rows 32 (w % 2) .. + 32, columns 32 (w / 2) .. + 32.
// Blocks split M, N and H, never K.
//
// The grouped experts (gemm_tc_grouped, at the end) keep the direct tile: 128 threads (4 warps); grid
// (ceil(M / GTC_TILE_M), ceil(N / GTC_TILE_N)).  A block holds a 32-row by 64-column tile: warp w takes rows
// 16 (w % 2) .. + 16 and columns 32 (w / 2) .. + 32 (GTC_NT tiles of 8).  Lane (g, t) loads 8 consecutive k (16
// bytes) of rows g, g + 8 and of column g of each 8-column tile straight into its fragments; rows past M and
// columns past N read row M - 1 (column N - 1) and are not stored.
#include "common.cuh"
#include "mma.cuh"
#include "gemv_tc.cuh"
#include "gemm_tc_stage.cuh"

#define GTC_TILE_M 32                  // rows a block
#define GTC_TILE_N 64                  // columns a block
#define GTC_NT GTS_NT                  // 8-column mma tiles a warp
#define GTC_U 4                        // 32-blocks of loads issued before their mma steps

// A lane's rows and weight columns (their first k).  A row past M (column past N) reads row M - 1 (column N - 1):
// an output element depends on its own row and column only, and those outputs are not stored.
struct GemmTcTile {
  const __nv_bfloat16* xg;             // row g of the warp
  const __nv_bfloat16* xh;             // row g + 8
  const __nv_bfloat16* w[GTC_NT];      // column g of each 8-column tile
};

// The epilogue: fp32 as summed, or rounded once to bf16.
static __device__ __forceinline__ void gemm_tc_store(float* y, long long i, float v) { y[i] = v; }
static __device__ __forceinline__ void gemm_tc_store(__nv_bfloat16* y, long long i, float v) { y[i] = to_bf16(v); }

// The 32-block at kk - 8t: this lane's 16-byte loads, zeros past the slice end (valid k of the chunk).
template <bool VEC>
static __device__ __forceinline__ void gtc_block_at(float (*d)[4], const GemmTcTile& tl, int kk, int valid) {
  uint4 wc[GTC_NT];
#pragma unroll
  for (int j = 0; j < GTC_NT; ++j) wc[j] = gemv_load8(tl.w[j] + kk, valid, VEC);
  gtc_block<GTC_NT>(d, gemv_load8(tl.xg + kk, valid, VEC), gemv_load8(tl.xh + kk, valid, VEC), wc);
}

// The slice [k0, k1) from +0.0 into d (one warp; warp-uniform bounds).  With 16-byte loads (VEC), GTC_U whole
// 32-blocks a trip, every load in flight before the first mma; the blocks left (and every block without VEC) one
// at a time with their bounds checked.  Both take the blocks in ascending k.
template <bool VEC>
static __device__ __forceinline__ void gemm_tc_slice(float (*d)[4], const GemmTcTile& tl, int k0, int k1, int t) {
#pragma unroll
  for (int j = 0; j < GTC_NT; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
  int kb = k0;
  if (VEC) {
    const uint4* px = reinterpret_cast<const uint4*>(tl.xg + k0 + 8 * t);     // 16-byte chunks, 4 a 32-block
    const uint4* ph = reinterpret_cast<const uint4*>(tl.xh + k0 + 8 * t);
    const uint4* pw[GTC_NT];
#pragma unroll
    for (int j = 0; j < GTC_NT; ++j) pw[j] = reinterpret_cast<const uint4*>(tl.w[j] + k0 + 8 * t);
    for (; kb + 32 * GTC_U <= k1; kb += 32 * GTC_U) {
      uint4 xa[GTC_U], xb[GTC_U], wc[GTC_U][GTC_NT];
#pragma unroll
      for (int u = 0; u < GTC_U; ++u) {
        xa[u] = px[4 * u];
        xb[u] = ph[4 * u];
#pragma unroll
        for (int j = 0; j < GTC_NT; ++j) wc[u][j] = pw[j][4 * u];
      }
      px += 4 * GTC_U;
      ph += 4 * GTC_U;
#pragma unroll
      for (int j = 0; j < GTC_NT; ++j) pw[j] += 4 * GTC_U;
#pragma unroll
      for (int u = 0; u < GTC_U; ++u) gtc_block<GTC_NT>(d, xa[u], xb[u], wc[u]);
    }
  }
#pragma unroll 1
  for (; kb < k1; kb += 32) gtc_block_at<VEC>(d, tl, kb + 8 * t, min(8, k1 - kb - 8 * t));
}

// The warp's rows m0 + g, m0 + g + 8 (row M - 1 past M) and columns n0 + 8j + g (column N - 1 past N) of x [M, K]
// and w [N, K].
static __device__ __forceinline__ GemmTcTile gemm_tc_tile(const __nv_bfloat16* x, const __nv_bfloat16* w, int m0,
                                                          int n0, int M, int N, int K, int g) {
  GemmTcTile tl;
  tl.xg = x + (long long)min(m0 + g, M - 1) * K;
  tl.xh = x + (long long)min(m0 + g + 8, M - 1) * K;
#pragma unroll
  for (int j = 0; j < GTC_NT; ++j) tl.w[j] = w + (long long)min(n0 + 8 * j + g, N - 1) * K;
  return tl;
}

// The tile's sums over all K into acc: each slice from +0.0, the slices added in slice order.
template <bool VEC>
static __device__ __forceinline__ void gemm_tc_sum(float (*acc)[4], const GemmTcTile& tl, int K, int t) {
  float d[GTC_NT][4];
  for (int k0 = 0; k0 < K; k0 += GTC_SLICE) {
    gemm_tc_slice<VEC>(d, tl, k0, min(K, k0 + GTC_SLICE), t);
#pragma unroll
    for (int j = 0; j < GTC_NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = k0 == 0 ? d[j][e] : acc[j][e] + d[j][e];
  }
}

// The dense tile (gemm_tc_stage.cuh): this warp's 32 x 32 outputs of the block's 64 x 128.
template <bool VEC, typename Out>
static __device__ __forceinline__ void gemm_tc_rows(
    GtsStage* sh,                          // [GTS_STAGES] shared stages
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    Out* __restrict__ y,                   // [H, M, N] fp32 or bf16
    int M, int N, int K) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const long long h = blockIdx.z;
  const int bm = blockIdx.x * GTS_M, bn = blockIdx.y * GTS_N;
  GtsSrc s = gts_src(x + h * M * (long long)K, w + h * N * (long long)K, bm, bn, M, N, K);
  float acc[2][GTC_NT][4];
  gts_sum<VEC>(acc, sh, s);
  Out* yh = y + h * M * (long long)N;
  const int m0 = bm + 32 * (warp & 1), n0 = bn + 32 * (warp >> 1);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < GTC_NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {      // d[e] = D[row g + 8 (e / 2)][column 2t + e % 2] of tile (i, j)
        const int m = m0 + 16 * i + g + 8 * (e >> 1), n = n0 + 8 * j + 2 * t + (e & 1);
        if (m < M && n < N) gemm_tc_store(yh, (long long)m * N + n, acc[i][j][e]);
      }
}

// 16-byte copies where x, w and K allow them (block-uniform), else element loads: the same values either way.
template <typename Out>
static __device__ __forceinline__ void gemm_tc_body(GtsStage* sh, const __nv_bfloat16* __restrict__ x,
                                                    const __nv_bfloat16* __restrict__ w, Out* __restrict__ y, int M,
                                                    int N, int K) {
  if (gemv_aligned(x, w, K))
    gemm_tc_rows<true>(sh, x, w, y, M, N, K);
  else
    gemm_tc_rows<false>(sh, x, w, y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(GTS_THREADS, 1) gemm_tc(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    float* __restrict__ y,                 // [H, M, N] f32
    int M, int N, int K) {
  extern __shared__ __align__(16) unsigned char gtc_sh[];   // [GTS_STAGES] GtsStage
  gemm_tc_body(reinterpret_cast<GtsStage*>(gtc_sh), x, w, y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(GTS_THREADS, 1) gemm_tc_bf16(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    __nv_bfloat16* __restrict__ y,         // [H, M, N] bf16 (the fp32 sum rounded once)
    int M, int N, int K) {
  extern __shared__ __align__(16) unsigned char gtc_bf16_sh[];   // [GTS_STAGES] GtsStage
  gemm_tc_body(reinterpret_cast<GtsStage*>(gtc_bf16_sh), x, w, y, M, N, K);
}

// Grouped experts (the MoE's prompt rows): y[m, n] = sum_k x[m, k] * w[group[m], n, k], row m's bits those of
// gemm_tc(x[m:m+1], w[group[m]]) whatever rows share the call, sorted by expert or not.  Launch as gemm_tc with
// H = 1.  Each warp takes the distinct experts among its 16 rows in ascending id, runs its whole k-loop against
// that expert's columns and stores the rows of that id only (an mma output depends on its own row and column, so
// a row's bits do not depend on the other rows' experts).  A row whose id is outside [0, E) (the launcher refuses
// those) reads nothing and gets NaN.
#define GTC_NO_EXPERT 0x7fffffff

// Row m's expert id, GTC_NO_EXPERT for a row past M or an id outside [0, E).
static __device__ __forceinline__ int gtc_expert(const int* group, int m, int M, int E) {
  const int e = m < M ? group[m] : -1;
  return e >= 0 && e < E ? e : GTC_NO_EXPERT;
}

// The warp's smallest expert id above cur among each lane's two rows (warp-uniform; GTC_NO_EXPERT when none).
static __device__ __forceinline__ int gtc_next_expert(int ea, int eb, int cur) {
  int v = min(ea > cur ? ea : GTC_NO_EXPERT, eb > cur ? eb : GTC_NO_EXPERT);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(FULL_MASK, v, off));
  return v;
}

template <bool VEC, typename Out>
static __device__ __forceinline__ void gemm_tc_grouped_rows(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [E, N, K] bf16
    const int* __restrict__ group,         // [M] int32: expert id of each row
    Out* __restrict__ y,                   // [M, N] fp32 or bf16
    int M, int N, int K, int E) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * GTC_TILE_M + 16 * (warp & 1), n0 = blockIdx.y * GTC_TILE_N + 32 * (warp >> 1);
  const int id[2] = {gtc_expert(group, m0 + g, M, E), gtc_expert(group, m0 + g + 8, M, E)};
  for (int ex = gtc_next_expert(id[0], id[1], -1); ex != GTC_NO_EXPERT; ex = gtc_next_expert(id[0], id[1], ex)) {
    const GemmTcTile tl = gemm_tc_tile(x, w + (long long)ex * N * K, m0, n0, M, N, K, g);
    float acc[GTC_NT][4];
    gemm_tc_sum<VEC>(acc, tl, K, t);
#pragma unroll
    for (int j = 0; j < GTC_NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {      // d[e] = D[row g + 8 (e / 2)][column 2t + e % 2] of tile j
        const int m = m0 + g + 8 * (e >> 1), n = n0 + 8 * j + 2 * t + (e & 1);
        if (id[e >> 1] == ex && n < N) gemm_tc_store(y, (long long)m * N + n, acc[j][e]);
      }
  }
#pragma unroll
  for (int j = 0; j < GTC_NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = m0 + g + 8 * (e >> 1), n = n0 + 8 * j + 2 * t + (e & 1);
      if (m < M && n < N && id[e >> 1] == GTC_NO_EXPERT) gemm_tc_store(y, (long long)m * N + n, NAN);
    }
}

template <typename Out>
static __device__ __forceinline__ void gemm_tc_grouped_body(const __nv_bfloat16* __restrict__ x,
                                                            const __nv_bfloat16* __restrict__ w,
                                                            const int* __restrict__ group, Out* __restrict__ y,
                                                            int M, int N, int K, int E) {
  if (gemv_aligned(x, w, K))             // K % 8 == 0: every expert's slice starts 16-byte aligned too
    gemm_tc_grouped_rows<true>(x, w, group, y, M, N, K, E);
  else
    gemm_tc_grouped_rows<false>(x, w, group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_grouped(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [E, N, K] bf16
    const int* __restrict__ group,         // [M] int32: expert id of each row
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K, int E) {
  gemm_tc_grouped_body(x, w, group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_grouped_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [E, N, K] bf16
    const int* __restrict__ group,         // [M] int32: expert id of each row
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 sum rounded once)
    int M, int N, int K, int E) {
  gemm_tc_grouped_body(x, w, group, y, M, N, K, E);
}
