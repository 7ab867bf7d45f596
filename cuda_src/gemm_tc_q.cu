// gemm_tc_q.cu -- the prompt-row GEMM on the tensor core for quantised weights (DESIGN §3b): y[m, n] =
// sum_k x[m, k] * w[e, n, k] (e = 0 dense, e = group[m] grouped) by mma.m16n8k16, fp32 out or rounded once to bf16.
//
// Order: the quantised decode GEMV's (cupyglm/backend/tc_quant.py quant_rows, gemv_q_tc.cuh), fixed by K alone.
// Weights are made exact bf16 in registers by gemv_q_tc.cuh's gq_decode from the bytes as stored (dequant.cuh's
// layouts).  K is cut into slices of GTC_SLICE added in slice order; NVFP4: a slice is one chain of 128-k blocks
// from +0.0 and scale_2 multiplies each output once at the end; FP8: a chain restarts at every bk-block, its fp32
// result times scale_inv of (the column's n-block, the k-block) is added in k order.  Lane (g, t) takes 32c
// consecutive k of a block (c = 4 NVFP4, 1 FP8): step s holds k 8ct + 4s + 0..3, as the GEMV.  An mma output
// depends on its own row of A (x) and column of B (w) only, so a prompt row's bits are the decode row's: x and w
// swap the GEMV's A / B roles, not the products or their k positions.
//
// Launch: 128 threads (4 warps); grid (ceil(N / 64), ceil(M / 32)).  A block holds a 32-row by 64-column tile:
// warp w takes rows 16 (w % 2) .. + 16 and columns 32 (w / 2) .. + 32 (GTQ_NT tiles of 8); loads go straight into
// fragments.  Blocks split M and N, never K.  Grouped: a warp loops over the distinct experts among its 16 rows in
// ascending order, computes its tile against that expert and stores only the rows of that expert; a row whose id
// is outside [0, E) reads nothing and gets NaN (the launcher checks the ids, kernels/guards.py).
#include "common.cuh"
#include "mma.cuh"
#include "gemv_q_tc.cuh"

#define GTQ_TILE_M 32                  // rows a block
#define GTQ_TILE_N 64                  // columns a block
#define GTQ_NT 4                       // 8-column mma tiles a warp

// A warp's operands against one expert: rows g, g + 8 of its 16 rows, column g of each 8-column tile.  A row past
// M (column past N) reads row M - 1 (column N - 1): those outputs are never stored.
struct GtqTile {
  const __nv_bfloat16* xg;             // row g: [K] bf16
  const __nv_bfloat16* xh;             // row g + 8
  const unsigned char* w[GTQ_NT];      // the columns' packed rows: [rb] bytes
  const unsigned char* s[GTQ_NT];      // NVFP4: the columns' group-scale rows, [K / 16] e4m3
  const unsigned char* ns;             // NVFP4 [E, N, K / 16] (the planted scale controls index it whole)
  long long e;
  int col[GTQ_NT], N, K, rb;
  bool xvec, wvec, svec;               // 16-byte x loads; whole weight loads; 2-byte scale loads
};

// FP8's block scales of the lane's output columns (8j + 2t + c of the warp's tiles).
struct GtqFp8 {
  const float* fs;                     // [E, sn, sk] fp32 weight_scale_inv
  int nb[GTQ_NT][2], bk, sn, sk;
};

// The epilogue: fp32 as summed, or rounded once to bf16.
static __device__ __forceinline__ void gtq_store(float* y, long long i, float v) { y[i] = v; }
static __device__ __forceinline__ void gtq_store(__nv_bfloat16* y, long long i, float v) { y[i] = to_bf16(v); }

// A lane's BYTES packed bytes of a row at byte b (rb a row), those past the row zero.  WHOLE: inside and aligned.
template <int F, bool WHOLE>
static __device__ __forceinline__ uint4 gtq_wload(const unsigned char* row, int b, int rb, bool vec) {
  constexpr int n = GqFmt<F>::BYTES;
  if (WHOLE || (vec && b + n <= rb)) {
    if (n == 16) return *reinterpret_cast<const uint4*>(row + b);
    const uint2 v = *reinterpret_cast<const uint2*>(row + b);
    return make_uint4(v.x, v.y, 0u, 0u);
  }
  unsigned q[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < n; ++i)
    if (b + i < rb) q[i >> 2] |= (unsigned)row[b + i] << (8 * (i & 3));
  return make_uint4(q[0], q[1], q[2], q[3]);
}

// NVFP4: the e4m3 codes of the two groups of a lane's 32 k at k (k / 16 even) of tile j's column, in bytes 0 and
// 2 (0 past K).  The controls' builds index each code through dequant.cuh.
template <bool WHOLE>
static __device__ __forceinline__ unsigned gtq_scales(const GtqTile& tl, int j, int k) {
  const int gk = tl.K >> 4, gr = k >> 4;
#if defined(CONTROL_SCALE_NEXT_BLOCK) || defined(CONTROL_SCALE_TRANSPOSED)
  if (gr >= gk) return 0u;
  unsigned v = tl.ns[dq_nvfp4_scale_at(tl.e, tl.col[j], gr, tl.N, tl.K)];
  if (gr + 1 < gk) v |= (unsigned)tl.ns[dq_nvfp4_scale_at(tl.e, tl.col[j], gr + 1, tl.N, tl.K)] << 16;
  return v;
#else
  const unsigned char* row = tl.s[j];
  if (WHOLE || (tl.svec && gr + 1 < gk))                  // gr is even: a 2-byte load
    return gq_prmt(*reinterpret_cast<const unsigned short*>(row + gr), 0u, 0x4140u);
  if (gr >= gk) return 0u;
  return row[gr] | (gr + 1 < gk ? (unsigned)row[gr + 1] << 16 : 0u);
#endif
}

// The steps of one block: xa / xb the chunks of rows g / g + 8 (A), bw[j] the B halves of tile j's column.
// CONTROL_TC_REVERSED / CONTROL_TC_TRANSPOSED (planted) as gemv_q_tc.cuh's gq_steps.
template <int C>
static __device__ __forceinline__ void gtq_steps(float (*d)[4], const uint4* xa, const uint4* xb,
                                                 const unsigned (*bw)[2 * C][2]) {
#pragma unroll
  for (int q = 0; q < 2 * C; ++q) {
#ifdef CONTROL_TC_REVERSED
    const int s = 2 * C - 1 - q;
#else
    const int s = q;
#endif
    const uint4 u = xa[s >> 1], v = xb[s >> 1];
    const unsigned a0 = (s & 1) ? u.z : u.x, a2 = (s & 1) ? u.w : u.y;
    const unsigned a1 = (s & 1) ? v.z : v.x, a3 = (s & 1) ? v.w : v.y;
#pragma unroll
    for (int j = 0; j < GTQ_NT; ++j) {
#ifdef CONTROL_TC_TRANSPOSED
      gtc_mma(d[j], a2, a3, a0, a1, bw[j][s][0], bw[j][s][1]);
#else
      gtc_mma(d[j], a0, a1, a2, a3, bw[j][s][0], bw[j][s][1]);
#endif
    }
  }
}

// One 32c-block at kb into the chains d.  WHOLE: every load whole and inside K (no checks); else x past K, weight
// bytes past the row and groups past K / 16 read as zero.
template <int F, bool WHOLE>
static __device__ __forceinline__ void gtq_block(float (*d)[4], const GtqTile& tl, int kb, int t) {
  constexpr int C = GqFmt<F>::C;
  const int kk = kb + 8 * C * t, bt = F == GEMV_FP8 ? kk : kk >> 1;
  uint4 xa[C], xb[C], wv[GTQ_NT];
  unsigned sc[GTQ_NT];
#pragma unroll
  for (int j = 0; j < GTQ_NT; ++j) {
    wv[j] = gtq_wload<F, WHOLE>(tl.w[j], bt, tl.rb, tl.wvec);
    sc[j] = F == GEMV_NVFP4 ? gtq_scales<WHOLE>(tl, j, kk) : 0u;
  }
#pragma unroll
  for (int q = 0; q < C; ++q) {
    const int c = kk + 8 * q, valid = min(8, tl.K - c);
    xa[q] = WHOLE ? *reinterpret_cast<const uint4*>(tl.xg + c) : gemv_load8(tl.xg + c, valid, tl.xvec);
    xb[q] = WHOLE ? *reinterpret_cast<const uint4*>(tl.xh + c) : gemv_load8(tl.xh + c, valid, tl.xvec);
  }
  unsigned bw[GTQ_NT][2 * C][2];
#pragma unroll
  for (int j = 0; j < GTQ_NT; ++j) gq_decode<F>(bw[j], wv[j], sc[j]);
  gtq_steps<C>(d, xa, xb, bw);
}

// One chain over the blocks of [a, b) from +0.0 into d (warp-uniform bounds): with VEC the blocks inside K
// unchecked, the rest (a K tail, or every block without VEC) checked; ascending k either way.
template <int F, bool VEC>
static __device__ __forceinline__ void gtq_chain(float (*d)[4], const GtqTile& tl, int a, int b, int t) {
  constexpr int KB = 32 * GqFmt<F>::C;
#pragma unroll
  for (int j = 0; j < GTQ_NT; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
  int kb = a;
  if (VEC) {
#pragma unroll 2
    for (; kb + KB <= b; kb += KB) gtq_block<F, true>(d, tl, kb, t);
  }
#pragma unroll 1
  for (; kb < b; kb += KB) gtq_block<F, false>(d, tl, kb, t);
}

// FP8: the chain d times its k-block's scale (per output column) into the slice sum sl (first: sl = it).
static __device__ __forceinline__ void gtq_close(float (*sl)[4], const float (*d)[4], const GtqFp8& fp, long long e,
                                                 int kblk, bool first) {
#pragma unroll
  for (int j = 0; j < GTQ_NT; ++j) {
    const float s0 = fp.fs[dq_fp8_scale_at(e, fp.nb[j][0], kblk, fp.sn, fp.sk)];
    const float s1 = fp.fs[dq_fp8_scale_at(e, fp.nb[j][1], kblk, fp.sn, fp.sk)];
#pragma unroll
    for (int c = 0; c < 4; ++c) {          // d[c] = D[row g + 8 (c / 2)][column 2t + c % 2]
      const float p = d[j][c] * ((c & 1) ? s1 : s0);
      sl[j][c] = first ? p : sl[j][c] + p;
    }
  }
}

// The warp's tile over all K into acc: slices added in order (NVFP4's scale_2 not applied).
template <int F, bool VEC>
static __device__ __forceinline__ void gtq_sum(float (*acc)[4], const GtqTile& tl, const GtqFp8& fp, int t) {
  float d[GTQ_NT][4], sl[GTQ_NT][4];
  for (int k0 = 0; k0 < tl.K; k0 += GTC_SLICE) {
    const int k1 = min(tl.K, k0 + GTC_SLICE);
    if (F == GEMV_NVFP4) {
      gtq_chain<F, VEC>(sl, tl, k0, k1, t);
    } else {
      for (int a = k0; a < k1;) {            // a chain per bk-block, closed in k order
        const int b = min(k1, (a / fp.bk + 1) * fp.bk);
        gtq_chain<F, VEC>(d, tl, a, b, t);
        gtq_close(sl, d, fp, tl.e, a / fp.bk, a == k0);
        a = b;
      }
    }
#pragma unroll
    for (int j = 0; j < GTQ_NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[j][c] = k0 == 0 ? sl[j][c] : acc[j][c] + sl[j][c];
  }
}

// Row m's expert: 0 (dense) or group[m] when in [0, E); -1 an id outside (a NaN row); -2 past M (not stored).
template <bool GROUPED>
static __device__ __forceinline__ int gtq_id(const int* __restrict__ group, int m, int M, int E) {
  if (m >= M) return -2;
  if (!GROUPED) return 0;
  const int e = group[m];
  return e >= 0 && e < E ? e : -1;
}

// Whether a row of expert id takes the outputs of expert e's pass.  CONTROL_GROUP_STORE_ALL (planted): every row
// of the warp does (the last expert's pass wins).
static __device__ __forceinline__ bool gtq_mine(int id, int e) {
#ifdef CONTROL_GROUP_STORE_ALL
  return id >= 0;
#else
  return id == e;
#endif
}

// The smallest expert above prev among the warp's 16 rows from m0 (E: none); warp-uniform.
template <bool GROUPED>
static __device__ __forceinline__ int gtq_next(const int* __restrict__ group, int m0, int M, int E, int prev) {
  if (!GROUPED) return prev < 0 ? 0 : E;
  int e = E;
  for (int r = 0; r < 16; ++r) {
    const int i = gtq_id<true>(group, m0 + r, M, E);
    if (i > prev && i < e) e = i;
  }
  return e;
}

// The warp's operands that do not depend on the expert.
template <int F>
static __device__ __forceinline__ void gtq_setup(GtqTile& tl, GtqFp8& fp, const __nv_bfloat16* x, const GemvQw& w,
                                                 int m0, int n0, int M, int N, int K, int g, int t) {
  tl.xg = x + (long long)min(m0 + g, M - 1) * K;
  tl.xh = x + (long long)min(m0 + g + 8, M - 1) * K;
  tl.ns = w.ns;
  tl.N = N;
  tl.K = K;
  tl.rb = gq_row_bytes<F>(K);
  tl.xvec = gemv_aligned(x, x, K);
  tl.wvec = tl.rb % GqFmt<F>::BYTES == 0 && ((unsigned long long)w.v) % GqFmt<F>::BYTES == 0;
  tl.svec = F != GEMV_NVFP4 || ((K / 16) % 2 == 0 && ((unsigned long long)w.ns) % 2 == 0);
  fp.fs = w.fs;
  fp.bk = w.bk;
  fp.sn = F == GEMV_FP8 ? (N + w.bn - 1) / w.bn : 0;
  fp.sk = F == GEMV_FP8 ? (K + w.bk - 1) / w.bk : 0;
#pragma unroll
  for (int j = 0; j < GTQ_NT; ++j) {
    tl.col[j] = min(n0 + 8 * j + g, N - 1);
    fp.nb[j][0] = F == GEMV_FP8 ? min(n0 + 8 * j + 2 * t, N - 1) / w.bn : 0;
    fp.nb[j][1] = F == GEMV_FP8 ? min(n0 + 8 * j + 2 * t + 1, N - 1) / w.bn : 0;
  }
}

template <int F, bool GROUPED, typename Out>
static __device__ __forceinline__ void gtq_body(const __nv_bfloat16* __restrict__ x, const GemvQw& w,
                                                const int* __restrict__ group, Out* __restrict__ y, int M, int N,
                                                int K, int E) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.y * GTQ_TILE_M + 16 * (warp & 1), n0 = blockIdx.x * GTQ_TILE_N + 32 * (warp >> 1);
  if (m0 >= M || n0 >= N) return;          // warp-uniform; the kernel has no barriers
  const int id[2] = {gtq_id<GROUPED>(group, m0 + g, M, E), gtq_id<GROUPED>(group, m0 + g + 8, M, E)};
  GtqTile tl;
  GtqFp8 fp;
  gtq_setup<F>(tl, fp, x, w, m0, n0, M, N, K, g, t);
  const bool vec = tl.xvec && tl.wvec && tl.svec;
  for (int e = gtq_next<GROUPED>(group, m0, M, E, -1); e < E; e = gtq_next<GROUPED>(group, m0, M, E, e)) {
    tl.e = e;
#pragma unroll
    for (int j = 0; j < GTQ_NT; ++j) {
      const long long row = (long long)e * N + tl.col[j];
      tl.w[j] = w.v + row * tl.rb;
      tl.s[j] = F == GEMV_NVFP4 ? w.ns + row * (K / 16) : nullptr;
    }
    float acc[GTQ_NT][4];
    if (vec)
      gtq_sum<F, true>(acc, tl, fp, t);
    else
      gtq_sum<F, false>(acc, tl, fp, t);
    const float s2 = F == GEMV_NVFP4 ? w.s2[e] : 1.0f;
#pragma unroll
    for (int j = 0; j < GTQ_NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {          // acc[c] = D[row g + 8 (c / 2)][column 2t + c % 2] of tile j
        const int m = m0 + g + 8 * (c >> 1), n = n0 + 8 * j + 2 * t + (c & 1);
        if (gtq_mine(id[c >> 1], e) && n < N)
          gtq_store(y, (long long)m * N + n, F == GEMV_NVFP4 ? acc[j][c] * s2 : acc[j][c]);
      }
  }
#pragma unroll
  for (int j = 0; j < GTQ_NT; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int m = m0 + g + 8 * (c >> 1), n = n0 + 8 * j + 2 * t + (c & 1);
      if (id[c >> 1] == -1 && n < N) gtq_store(y, (long long)m * N + n, NAN);
    }
}

static __device__ __forceinline__ GemvQw gtq_w(const unsigned char* v, const float* fs, const unsigned char* ns,
                                               const float* s2, int bn, int bk) {
  GemvQw w;
  w.v = v;
  w.fs = fs;
  w.ns = ns;
  w.s2 = s2;
  w.bn = bn;
  w.bk = bk;
  return w;
}

// ---- dense: x [M, K] bf16 against one weight; y [M, N] ----
extern "C" __global__ void __launch_bounds__(128) gemm_tc_nvfp4(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ ws,  // [N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [1] fp32 weight_scale_2
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K) {
  gtq_body<GEMV_NVFP4, false>(x, gtq_w(wv, nullptr, ws, ws2, 0, 0), nullptr, y, M, N, K, 1);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_nvfp4_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K / 2] packed e2m1
    const unsigned char* __restrict__ ws,  // [N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [1] fp32 weight_scale_2
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K) {
  gtq_body<GEMV_NVFP4, false>(x, gtq_w(wv, nullptr, ws, ws2, 0, 0), nullptr, y, M, N, K, 1);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_fp8(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K] e4m3 codes
    const float* __restrict__ ws,          // [ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K, int bn, int bk) {
  gtq_body<GEMV_FP8, false>(x, gtq_w(wv, ws, nullptr, nullptr, bn, bk), nullptr, y, M, N, K, 1);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_fp8_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K] e4m3 codes
    const float* __restrict__ ws,          // [ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K, int bn, int bk) {
  gtq_body<GEMV_FP8, false>(x, gtq_w(wv, ws, nullptr, nullptr, bn, bk), nullptr, y, M, N, K, 1);
}

// ---- grouped: row m against expert group[m] of an [E, N, K] stack; y [M, N] ----
extern "C" __global__ void __launch_bounds__(128) gemm_tc_grouped_nvfp4(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [E, N, K / 2] packed e2m1
    const unsigned char* __restrict__ ws,  // [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [E] fp32 weight_scale_2
    const int* __restrict__ group,         // [M] int32: expert id of each row (any order)
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K, int E) {
  gtq_body<GEMV_NVFP4, true>(x, gtq_w(wv, nullptr, ws, ws2, 0, 0), group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_grouped_nvfp4_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [E, N, K / 2] packed e2m1
    const unsigned char* __restrict__ ws,  // [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [E] fp32 weight_scale_2
    const int* __restrict__ group,         // [M] int32: expert id of each row (any order)
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K, int E) {
  gtq_body<GEMV_NVFP4, true>(x, gtq_w(wv, nullptr, ws, ws2, 0, 0), group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_grouped_fp8(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [E, N, K] e4m3 codes
    const float* __restrict__ ws,          // [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const int* __restrict__ group,         // [M] int32: expert id of each row (any order)
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K, int E, int bn, int bk) {
  gtq_body<GEMV_FP8, true>(x, gtq_w(wv, ws, nullptr, nullptr, bn, bk), group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_grouped_fp8_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [E, N, K] e4m3 codes
    const float* __restrict__ ws,          // [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const int* __restrict__ group,         // [M] int32: expert id of each row (any order)
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K, int E, int bn, int bk) {
  gtq_body<GEMV_FP8, true>(x, gtq_w(wv, ws, nullptr, nullptr, bn, bk), group, y, M, N, K, E);
}
