// gemm_tc_stage.cuh -- gemm_tc.cu's tile (dense and grouped): a 128-row by 256-column block tile of 8 warps (64 x 64
// each; GTS_SMALL: 64 x 128, warps 32 x 32) whose x and w k-tiles are staged through shared memory (cp.async,
// GTS_STAGES deep), so each loaded byte feeds
// every warp that needs it.  A warp's running sums over the finished slices wait in shared memory (GtsAcc), its
// current slice's chain in registers: both would not fit the registers.
//
// Order: gemm_tc.cu's (the decode GEMV's, fixed by K alone).  A stage holds GTS_K = 64 consecutive k (two 32-blocks,
// GTS_K divides GTC_SLICE, so a stage never straddles a slice); every lane then gets from shared memory exactly
// the values of the 16-byte chunks it would have loaded from global memory (8 consecutive k at kb + 8t of rows g,
// g + 8 and of column g of each 8-column tile) and takes gtc_block's two steps on them, the 32-blocks in ascending
// k, none past K.  Pieces past K are zeros, as gemv_load8 gives them; rows past M (columns past N) read row M - 1
// (column N - 1) and are not stored.
//
// Shared layout.  w: a row of a stage is 8 chunks of 16 bytes; chunk c of row r sits at chunk c ^ 4 (r & 1), so the
// 8 lanes of a 16-byte load phase (rows 2p, 2p + 1, chunks 4b .. 4b + 3) hit 32 distinct banks.  x: stored as the
// mma's A fragments, so one 16-byte load is a step's four registers (no register moves): the unit of (16-row tile T,
// row g, 32-block b, step s, lane t) holds words 2s, 2s + 1 of the chunk (k 32b + 8t ..) of rows 16T + g and
// 16T + g + 8, interleaved (a[0..3]); it sits at unit 16 (8T + g) + ((4 (2b + s) + t) ^ 4 (g & 1)), the same banks
// rule.  x is copied 4 bytes at a time (one word of one row a lane), w 16.
#pragma once
#include "common.cuh"
#include "cp_async.cuh"
#include "gemv_tc.cuh"

#ifdef GTS_SMALL                       // GPUs with 99 KB of shared memory a block: 64 x 128 (80 KB), the same bits
#define GTS_M 64                       // rows a block
#define GTS_N 128                      // columns a block
#define GTS_RT 2                       // 16-row mma tiles a warp
#define GTS_NT 4                       // 8-column mma tiles a warp
#else
#define GTS_M 128
#define GTS_N 256
#define GTS_RT 4
#define GTS_NT 8
#endif
#define GTS_K 64                       // k a stage
#define GTS_STAGES 2                   // stages in flight (the running sums take the rest of shared memory)
#define GTS_THREADS 256                // 8 warps: 2 (16 GTS_RT rows each) x 4 (8 GTS_NT columns each)
#define GTS_CHUNKS (GTS_K / 8)         // 16-byte chunks a stage row
#define GTS_XROWS (GTS_M / (GTS_THREADS / 32))            // x rows a thread copies a stage (a word of each)
#define GTS_WROWS (GTS_N / (GTS_THREADS / GTS_CHUNKS))   // w rows a thread copies a stage

// One stage: x as A fragments, then w rows of GTS_CHUNKS chunks.
struct GtsStage {
  uint4 x[GTS_M * GTS_CHUNKS];         // [GTS_M / 16][8][16] units (the layout above)
  uint4 w[GTS_N * GTS_CHUNKS];
};

// A thread's running sums (row tile i, column tile j) at float4 (GTS_NT i + j) GTS_THREADS + threadIdx.x: a warp's
// 16-byte accesses hit consecutive addresses.
struct GtsAcc {
  float4 v[GTS_RT * GTS_NT * GTS_THREADS];
};

static __device__ __forceinline__ int gts_at(int r, int c) { return r * GTS_CHUNKS + (c ^ ((r & 1) << 2)); }

// x's unit of (16-row tile T, row g, unit u = 4 (2b + s) + t of the stage).
static __device__ __forceinline__ int gts_xat(int T, int g, int u) { return 16 * (8 * T + g) + (u ^ ((g & 1) << 2)); }

// 16 bytes from global to shared memory; zeros when the chunk lies past K (valid <= 0).  VEC: cp.async (the
// emulator: a plain copy); else the valid elements one by one (unaligned rows or K % 8 != 0).
template <bool VEC>
static __device__ __forceinline__ void gts_copy(uint4* dst, const __nv_bfloat16* src, int valid) {
  if (!VEC) {
    *dst = gemv_load8(src, valid, false);
    return;
  }
  cp_async16(dst, src, valid > 0);
}

// 4 bytes (k, k + 1 of a row) likewise; valid = the row's elements left from k.
template <bool VEC>
static __device__ __forceinline__ void gts_copy4(unsigned* dst, const __nv_bfloat16* src, int valid) {
  if (!VEC) {
    const unsigned lo = valid > 0 ? __bfloat16_as_ushort(src[0]) : 0u;
    const unsigned hi = valid > 1 ? __bfloat16_as_ushort(src[1]) : 0u;
    *dst = lo | hi << 16;
    return;
  }
  cp_async4(dst, src, valid > 0);
}

static __device__ __forceinline__ void gts_commit() { cp_async_commit(); }

// Every copy but the latest GTS_STAGES - 2 groups of this thread has landed.
static __device__ __forceinline__ void gts_wait() { cp_async_wait<GTS_STAGES - 2>(); }

// What this thread copies: x rows 8 warp + q % 8 + 64 (q / 8) from k = 2 lane (one word of each), w rows r0 + 32 q
// from k = 8 c (one chunk of each), and where they land (word dx[q % 2] + 64 (q % 8) + 2048 (q / 8) of x: row tile
// warp / 2 + 4 (q / 8); unit dw + 256 q of w; gts_xat / gts_at).  The pieces are 32-bit byte offsets from the
// block's first row (x0, w0; under 2 GTS_N (K + 1) < 2^32, the launcher's limit on K): fewer registers than pointers.
struct GtsSrc {
  const __nv_bfloat16* x0;
  const __nv_bfloat16* w0;
  unsigned x[GTS_XROWS], w[GTS_WROWS];
  int K, kx, kw, dx[2], dw;
};

static __device__ __forceinline__ GtsSrc gts_src(const __nv_bfloat16* x, const __nv_bfloat16* w, int m0, int n0,
                                                 int M, int N, int K) {
  const int r0 = threadIdx.x / GTS_CHUNKS, c = threadIdx.x % GTS_CHUNKS, l = threadIdx.x & 31, warp = threadIdx.x >> 5;
  GtsSrc s;
  s.K = K;
  s.kx = 2 * l;
  s.kw = 8 * c;
  const unsigned ox = s.kx < K ? s.kx : 0, ow = s.kw < K ? s.kw : 0;   // a piece never below K: its row's start
  s.x0 = x + (long long)m0 * K;
  s.w0 = w + (long long)n0 * K;
#pragma unroll
  for (int q = 0; q < GTS_XROWS; ++q)
    s.x[q] = 2u * ((unsigned)min(8 * warp + (q & 7) + 64 * (q >> 3), M - 1 - m0) * (unsigned)K + ox);
#pragma unroll
  for (int q = 0; q < GTS_WROWS; ++q) s.w[q] = 2u * ((unsigned)min(r0 + 32 * q, N - 1 - n0) * (unsigned)K + ow);
  // word l of a row is k 2l of 32-block l / 16, lane (l / 4) % 4, step (l / 2) % 2, fragment word 2 (l % 2) + half
  const int u = 4 * (2 * (l >> 4) + ((l >> 1) & 1)) + ((l >> 2) & 3), word = 2 * (l & 1) + (warp & 1);
#pragma unroll
  for (int p = 0; p < 2; ++p) s.dx[p] = 4 * gts_xat(warp >> 1, 0, u ^ (4 * p)) + word;
  s.dw = gts_at(r0, c);
  return s;
}

// Stage st (k from GTS_K st) into sh: this thread's words and chunks, one commit group.  A piece past K reads
// nothing (cp.async's source size 0, at an address inside its row) and is zeros.
template <bool VEC>
static __device__ __forceinline__ void gts_issue(GtsStage& sh, GtsSrc& s, int st) {
  const int k = GTS_K * st, vx = s.K - k - s.kx, vw = min(8, s.K - k - s.kw);
  const char* xk = reinterpret_cast<const char*>(s.x0 + (vx > 0 ? k : 0));
  const char* wk = reinterpret_cast<const char*>(s.w0 + (vw > 0 ? k : 0));
  unsigned* sx = reinterpret_cast<unsigned*>(sh.x);
#pragma unroll
  for (int q = 0; q < GTS_XROWS; ++q)
    gts_copy4<VEC>(sx + s.dx[q & 1] + 64 * (q & 7) + 2048 * (q >> 3),
                   reinterpret_cast<const __nv_bfloat16*>(xk + s.x[q]), vx);
#pragma unroll
  for (int q = 0; q < GTS_WROWS; ++q)
    gts_copy<VEC>(sh.w + s.dw + 256 * q, reinterpret_cast<const __nv_bfloat16*>(wk + s.w[q]), vw);
  gts_commit();
}

// This lane's shared offsets (units) for the mma loads: x unit xo[s] + 128 i + 8 b is the step-s fragment of the
// warp's row tile i in 32-block b; w unit wo[b] + 64 j the chunk of column g of its column tile j (gts_xat / gts_at).
struct GtsLane {
  int xo[2], wo[2];
};

static __device__ __forceinline__ GtsLane gts_lane(int wm, int wn, int g, int t) {
  GtsLane o;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    o.xo[q] = gts_xat(GTS_RT * wm, g, 4 * q + t);
    o.wo[q] = gts_at(8 * GTS_NT * wn + g, 4 * q + t);
  }
  return o;
}

// One 32-block (b of the stage) of the warp's tile: gtc_block's two steps, row tile by row tile (each
// output's chain keeps its own order).
static __device__ __forceinline__ void gts_block(float (*d)[GTS_NT][4], const GtsStage& sh, int b, const GtsLane& o) {
  uint4 wc[GTS_NT];
#pragma unroll
  for (int j = 0; j < GTS_NT; ++j) wc[j] = sh.w[(b ? o.wo[1] : o.wo[0]) + 64 * j];
#pragma unroll
  for (int i = 0; i < GTS_RT; ++i) {         // the chunks of rows g, g + 8 rebuilt from the two steps' fragments
    const uint4 f0 = sh.x[o.xo[0] + 128 * i + 8 * b], f1 = sh.x[o.xo[1] + 128 * i + 8 * b];
    gtc_block<GTS_NT>(d[i], make_uint4(f0.x, f0.z, f1.x, f1.z), make_uint4(f0.y, f0.w, f1.y, f1.w), wc);
  }
}

// The warp's tile over one stage at k: each of its 32-blocks below K (block-uniform: no step past K's last
// 32-block).  Element loads (!VEC, a rare path) take them in a loop of their own, one at a time.
template <bool VEC>
static __device__ __forceinline__ void gts_compute(float (*d)[GTS_NT][4], const GtsStage& sh, int k, int K,
                                                   const GtsLane& o) {
  if (VEC) {
#pragma unroll
    for (int b = 0; b < GTS_K / 32; ++b)
      if (b == 0 || k + 32 * b < K) gts_block(d, sh, b, o);
  } else {
#pragma unroll 1
    for (int b = 0; b < GTS_K / 32 && k + 32 * b < K; ++b) gts_block(d, sh, b, o);
  }
}

// After the slice [k0, k1) (its chain in d): the sum so far acc + d, back to acc, or left in d after the last slice.
static __device__ __forceinline__ void gts_fold(float (*d)[GTS_NT][4], GtsAcc& acc, bool first, bool last) {
#pragma unroll
  for (int i = 0; i < GTS_RT; ++i)
#pragma unroll
    for (int j = 0; j < GTS_NT; ++j) {
      float4& a = acc.v[(GTS_NT * i + j) * GTS_THREADS + threadIdx.x];
      float* v = d[i][j];
      if (!first) {
        const float4 p = a;
        v[0] = p.x + v[0], v[1] = p.y + v[1], v[2] = p.z + v[2], v[3] = p.w + v[3];
      }
      if (!last) a = make_float4(v[0], v[1], v[2], v[3]);
    }
}

// The block's tile over all K into this warp's d (row tile i, column tile j): each slice's chain from +0.0, the
// slices added in slice order.  Every thread takes part (barriers).
template <bool VEC>
static __device__ __forceinline__ void gts_sum(float (*d)[GTS_NT][4], GtsStage* sh, GtsAcc& acc, GtsSrc& s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int K = s.K, nst = (K + GTS_K - 1) / GTS_K;
  const GtsLane o = gts_lane(warp & 1, warp >> 1, g, t);
#pragma unroll
  for (int st = 0; st < GTS_STAGES - 1; ++st) {
    if (st < nst) gts_issue<VEC>(sh[st], s, st);
    else gts_commit();                         // empty groups keep wait_group's count
  }
  int st = 0, buf = 0;
  for (int k0 = 0; k0 < K; k0 += GTC_SLICE) {
#pragma unroll
    for (int i = 0; i < GTS_RT; ++i)
#pragma unroll
      for (int j = 0; j < GTS_NT; ++j) d[i][j][0] = d[i][j][1] = d[i][j][2] = d[i][j][3] = 0.0f;
    const int k1 = min(K, k0 + GTC_SLICE);
    for (; GTS_K * st < k1; ++st) {
      gts_wait();
      __syncthreads();                         // stage st landed for all; stage st - 1 read by all
      const int nx = st + GTS_STAGES - 1, nbuf = buf == 0 ? GTS_STAGES - 1 : buf - 1;
      if (nx < nst) gts_issue<VEC>(sh[nbuf], s, nx);
      else gts_commit();
      gts_compute<VEC>(d, sh[buf], GTS_K * st, K, o);
      buf = buf == GTS_STAGES - 1 ? 0 : buf + 1;
    }
    gts_fold(d, acc, k0 == 0, k1 == K);
  }
}
