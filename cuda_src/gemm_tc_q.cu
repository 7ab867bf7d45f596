// gemm_tc_q.cu -- the prompt-row GEMM on the tensor core for quantised weights (DESIGN §3b): y[m, n] =
// sum_k x[m, k] * w[e, n, k] (e = 0 dense, e = group[m] grouped) by mma.m16n8k16, fp32 out or rounded once to bf16.
//
// Order: the quantised decode GEMV's (cupyglm/backend/tc_quant.py quant_rows, gemv_q_tc.cuh), fixed by K alone,
// in its very steps: weights made exact bf16 in registers by gq_decode (the A operand, 16 columns), x rows the B
// operand (8 rows a tile), gq_steps' mma.  K is cut into slices of GTC_SLICE added in slice order; NVFP4: a slice
// is one chain of 128-k blocks from +0.0 and scale_2 multiplies each output once at the end; FP8: a chain restarts
// at every bk-block, its fp32 result times scale_inv of (the column's n-block, the k-block) is added in k order.
// Lane (g, t) loads 32c consecutive k of a block (c = 4 NVFP4, 1 FP8; step s holds k 8ct + 4s + 0..3) of columns
// g, g + 8 and of rows g of each row tile.  An mma output depends on its own row and column only, so a prompt row's
// bits are the decode row's whatever rows share its tile.
//
// Launch: 128 threads (4 warps); grid (ceil(M / 64), ceil(N / 64)): the rows on grid.x.  A block holds a 64-row by
// 64-column tile: warp w takes columns 16w .. + 16 (one A tile) and all 64 rows (GTQ_RT tiles of 8), so a weight
// made bf16 serves the 64 rows; loads go straight into fragments.  Blocks split M and N, never K.  Grouped: a warp
// loops over the distinct experts among its rows in ascending order, computes its tile against that expert and
// stores only the rows of that expert; a row whose id is outside [0, E) reads nothing and gets NaN (the launcher
// checks the ids, kernels/guards.py).
#include "common.cuh"
#include "mma.cuh"
#include "gemv_q_tc.cuh"

#define GTQ_TILE_M 64                  // rows a block
#define GTQ_TILE_N 64                  // columns a block
#define GTQ_RT 8                       // 8-row mma tiles a warp (the B operands)

// A warp's operands against one expert: row 8r + g of each row tile, columns g and g + 8 of its 16.  A row past M
// (column past N) reads row M - 1 (column N - 1): those outputs are never stored.
struct GtqTile {
  const __nv_bfloat16* x[GTQ_RT];      // row 8r + g: [K] bf16
  const unsigned char* w[2];           // columns g, g + 8: their packed rows, [rb] bytes
  const unsigned char* s[2];           // NVFP4: their group-scale rows, [K / 16] e4m3
  const unsigned char* ns;             // NVFP4 [E, N, K / 16] (the planted scale controls index it whole)
  long long e;
  int col[2], N, K, rb;
  bool xvec, wvec, svec;               // 16-byte x loads; whole weight loads; 2-byte scale loads
};

// FP8's block scales: the n-blocks of columns g, g + 8.
struct GtqFp8 {
  const float* fs;                     // [E, sn, sk] fp32 weight_scale_inv
  int nb[2], bk, sn, sk;
};

// The epilogue: fp32 as summed, or rounded once to bf16.
static __device__ __forceinline__ void gtq_store(float* y, long long i, float v) { y[i] = v; }
static __device__ __forceinline__ void gtq_store(__nv_bfloat16* y, long long i, float v) { y[i] = to_bf16(v); }

// A lane's BYTES packed bytes of a row at byte b (rb a row), those past the row zero.
template <int F>
static __device__ __forceinline__ uint4 gtq_wload(const unsigned char* row, int b, int rb, bool vec) {
  constexpr int n = GqFmt<F>::BYTES;
  if (vec && b + n <= rb) {
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

// NVFP4: the e4m3 codes of the two groups of a lane's 32 k at k (k / 16 even) of column h (g + 8h), in bytes 0
// and 2 (0 past K).  The controls' builds index each code through dequant.cuh.
static __device__ __forceinline__ unsigned gtq_scales(const GtqTile& tl, int h, int k) {
  const int gk = tl.K >> 4, gr = k >> 4;
  if (gr >= gk) return 0u;
#if defined(CONTROL_SCALE_NEXT_BLOCK) || defined(CONTROL_SCALE_TRANSPOSED)
  unsigned v = tl.ns[dq_nvfp4_scale_at(tl.e, tl.col[h], gr, tl.N, tl.K)];
  if (gr + 1 < gk) v |= (unsigned)tl.ns[dq_nvfp4_scale_at(tl.e, tl.col[h], gr + 1, tl.N, tl.K)] << 16;
  return v;
#else
  const unsigned char* row = tl.s[h];
  if (tl.svec && gr + 1 < gk)                // gr is even: a 2-byte load
    return gq_prmt(*reinterpret_cast<const unsigned short*>(row + gr), 0u, 0x4140u);
  return row[gr] | (gr + 1 < gk ? (unsigned)row[gr + 1] << 16 : 0u);
#endif
}

// One block's weights made bf16 (wv columns g, g + 8's bytes, sc NVFP4's group scale codes) and its steps into d.
template <int F>
static __device__ __forceinline__ void gtq_math(float (*d)[4], const uint4 (*xc)[GqFmt<F>::C], const uint4* wv,
                                                const unsigned* sc) {
  constexpr int C = GqFmt<F>::C;
  unsigned ag[2 * C][2], ah[2 * C][2];
  gq_decode<F>(ag, wv[0], sc[0]);
  gq_decode<F>(ah, wv[1], sc[1]);
  gq_steps<GTQ_RT, C>(d, ag, ah, xc);
}

// One 32c-block at kb into the chains d, every load checked: x past K, weight bytes past the row and groups past
// K / 16 read as zero.
template <int F>
static __device__ __forceinline__ void gtq_block(float (*d)[4], const GtqTile& tl, int kb, int t) {
  constexpr int C = GqFmt<F>::C;
  const int kk = kb + 8 * C * t, bt = F == GEMV_FP8 ? kk : kk >> 1;
  uint4 xc[GTQ_RT][C], wv[2];
  unsigned sc[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    wv[h] = gtq_wload<F>(tl.w[h], bt, tl.rb, tl.wvec);
    sc[h] = F == GEMV_NVFP4 ? gtq_scales(tl, h, kk) : 0u;
  }
#pragma unroll
  for (int q = 0; q < C; ++q) {
    const int c = kk + 8 * q, valid = min(8, tl.K - c);
#pragma unroll
    for (int r = 0; r < GTQ_RT; ++r) xc[r][q] = gemv_load8(tl.x[r] + c, valid, tl.xvec);
  }
  gtq_math<F>(d, xc, wv, sc);
}

// The whole blocks from kb while they end by b (every load whole, aligned and inside K) into d, read through
// running pointers (a bump each, the loads at fixed offsets); returns where it stopped.
template <int F>
static __device__ __forceinline__ int gtq_run(float (*d)[4], const GtqTile& tl, int kb, int b, int t) {
  constexpr int C = GqFmt<F>::C, KB = 32 * C, WB = F == GEMV_FP8 ? KB : KB / 2;
  const int kk = kb + 8 * C * t;
  const uint4* px[GTQ_RT];                 // [4 C] 16-byte chunks a block
  const unsigned char* pw[2];              // [WB] bytes a block
  const unsigned short* ps[2];             // NVFP4: [KB / 32] scale pairs a block
#pragma unroll
  for (int r = 0; r < GTQ_RT; ++r) px[r] = reinterpret_cast<const uint4*>(tl.x[r] + kk);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    pw[h] = tl.w[h] + (F == GEMV_FP8 ? kk : kk >> 1);
    ps[h] = F == GEMV_NVFP4 ? reinterpret_cast<const unsigned short*>(tl.s[h] + (kk >> 4)) : nullptr;
  }
#pragma unroll 2
  for (; kb + KB <= b; kb += KB) {
    uint4 xc[GTQ_RT][C], wv[2];
    unsigned sc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wv[h] = gtq_wload<F>(pw[h], 0, WB, true);
      pw[h] += WB;
#if defined(CONTROL_SCALE_NEXT_BLOCK) || defined(CONTROL_SCALE_TRANSPOSED)
      sc[h] = F == GEMV_NVFP4 ? gtq_scales(tl, h, kb + 8 * C * t) : 0u;
#else
      sc[h] = F == GEMV_NVFP4 ? gq_prmt(*ps[h], 0u, 0x4140u) : 0u;
#endif
      if (F == GEMV_NVFP4) ps[h] += KB / 32;
    }
#pragma unroll
    for (int r = 0; r < GTQ_RT; ++r) {
#pragma unroll
      for (int q = 0; q < C; ++q) xc[r][q] = px[r][q];
      px[r] += 4 * C;
    }
    gtq_math<F>(d, xc, wv, sc);
  }
  return kb;
}

// One chain over the blocks of [a, b) from +0.0 into d (warp-uniform bounds): with VEC the whole blocks through
// gtq_run, the rest (a K tail, or every block without VEC) checked; ascending k either way.
template <int F, bool VEC>
static __device__ __forceinline__ void gtq_chain(float (*d)[4], const GtqTile& tl, int a, int b, int t) {
  constexpr int KB = 32 * GqFmt<F>::C;
#pragma unroll
  for (int r = 0; r < GTQ_RT; ++r) d[r][0] = d[r][1] = d[r][2] = d[r][3] = 0.0f;
  const int kb = VEC ? gtq_run<F>(d, tl, a, b, t) : a;
#pragma unroll 1
  for (int k = kb; k < b; k += KB) gtq_block<F>(d, tl, k, t);
}

// FP8: the chain d times its k-block's scale (columns g, g + 8) into the slice sum sl (first: sl = it).
static __device__ __forceinline__ void gtq_close(float (*sl)[4], const float (*d)[4], const GtqFp8& fp, long long e,
                                                 int kblk, bool first) {
  const float s[2] = {fp.fs[dq_fp8_scale_at(e, fp.nb[0], kblk, fp.sn, fp.sk)],
                      fp.fs[dq_fp8_scale_at(e, fp.nb[1], kblk, fp.sn, fp.sk)]};
#pragma unroll
  for (int r = 0; r < GTQ_RT; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) {          // d[c] = D[column g + 8 (c / 2)][row 2t + c % 2]
      const float p = d[r][c] * s[c >> 1];
      sl[r][c] = first ? p : sl[r][c] + p;
    }
}

// The warp's tile over all K into acc: slices added in order (NVFP4's scale_2 not applied).
template <int F, bool VEC>
static __device__ __forceinline__ void gtq_sum(float (*acc)[4], const GtqTile& tl, const GtqFp8& fp, int t) {
  float d[GTQ_RT][4], sl[GTQ_RT][4];
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
    for (int r = 0; r < GTQ_RT; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] = k0 == 0 ? sl[r][c] : acc[r][c] + sl[r][c];
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

// The smallest expert above prev among the block's rows from m0 (E: none); warp-uniform.
template <bool GROUPED>
static __device__ __forceinline__ int gtq_next(const int* __restrict__ group, int m0, int M, int E, int prev) {
  if (!GROUPED) return prev < 0 ? 0 : E;
  int e = E;
  for (int r = 0; r < GTQ_TILE_M; ++r) {
    const int i = gtq_id<true>(group, m0 + r, M, E);
    if (i > prev && i < e) e = i;
  }
  return e;
}

// The warp's operands that do not depend on the expert.
template <int F>
static __device__ __forceinline__ void gtq_setup(GtqTile& tl, GtqFp8& fp, const __nv_bfloat16* x, const GemvQw& w,
                                                 int m0, int n0, int M, int N, int K, int g) {
#pragma unroll
  for (int r = 0; r < GTQ_RT; ++r) tl.x[r] = x + (long long)min(m0 + 8 * r + g, M - 1) * K;
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
  for (int h = 0; h < 2; ++h) {
    tl.col[h] = min(n0 + g + 8 * h, N - 1);
    fp.nb[h] = F == GEMV_FP8 ? tl.col[h] / w.bn : 0;
  }
}

// The warp's outputs of expert e's pass into its rows of that expert (e = -1: NaN into the rows whose id is
// outside [0, E)); NVFP4's scale_2 applied once here.  The rows' ids are read again here, not held through K.
template <int F, bool GROUPED, typename Out>
static __device__ __forceinline__ void gtq_out(Out* __restrict__ y, const float (*acc)[4],
                                               const int* __restrict__ group, int e, float s2, int m0, int n0, int M,
                                               int N, int E, int g, int t) {
#pragma unroll
  for (int r = 0; r < GTQ_RT; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) {          // acc[r][c] = D[column g + 8 (c / 2)][row 2t + c % 2] of row tile r
      const int m = m0 + 8 * r + 2 * t + (c & 1), n = n0 + g + 8 * (c >> 1), i = gtq_id<GROUPED>(group, m, M, E);
      const float v = e < 0 ? NAN : F == GEMV_NVFP4 ? acc[r][c] * s2 : acc[r][c];
      if ((e < 0 ? i == -1 : gtq_mine(i, e)) && n < N) gtq_store(y, (long long)m * N + n, v);
    }
}

template <int F, bool GROUPED, typename Out>
static __device__ __forceinline__ void gtq_body(const __nv_bfloat16* __restrict__ x, const GemvQw& w,
                                                const int* __restrict__ group, Out* __restrict__ y, int M, int N,
                                                int K, int E) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * GTQ_TILE_M, n0 = blockIdx.y * GTQ_TILE_N + 16 * warp;
  if (n0 >= N) return;                     // warp-uniform; the kernel has no barriers
  GtqTile tl;
  GtqFp8 fp;
  gtq_setup<F>(tl, fp, x, w, m0, n0, M, N, K, g);
  const bool vec = tl.xvec && tl.wvec && tl.svec;
  float acc[GTQ_RT][4] = {};
  for (int e = gtq_next<GROUPED>(group, m0, M, E, -1); e < E; e = gtq_next<GROUPED>(group, m0, M, E, e)) {
    tl.e = e;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long row = (long long)e * N + tl.col[h];
      tl.w[h] = w.v + row * tl.rb;
      tl.s[h] = F == GEMV_NVFP4 ? w.ns + row * (K / 16) : nullptr;
    }
    if (vec)
      gtq_sum<F, true>(acc, tl, fp, t);
    else
      gtq_sum<F, false>(acc, tl, fp, t);
    gtq_out<F, GROUPED>(y, acc, group, e, F == GEMV_NVFP4 ? w.s2[e] : 1.0f, m0, n0, M, N, E, g, t);
  }
  if (GROUPED) gtq_out<F, GROUPED>(y, acc, group, -1, 0.0f, m0, n0, M, N, E, g, t);
}

// ---- dense: x [M, K] bf16 against one weight; y [M, N] ----
extern "C" __global__ void __launch_bounds__(128) gemm_tc_nvfp4(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ ws,  // [N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [1] fp32 weight_scale_2
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K) {
  gtq_body<GEMV_NVFP4, false>(x, GemvQw{wv, nullptr, ws, ws2, 0, 0}, nullptr, y, M, N, K, 1);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_nvfp4_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K / 2] packed e2m1
    const unsigned char* __restrict__ ws,  // [N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [1] fp32 weight_scale_2
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K) {
  gtq_body<GEMV_NVFP4, false>(x, GemvQw{wv, nullptr, ws, ws2, 0, 0}, nullptr, y, M, N, K, 1);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_fp8(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K] e4m3 codes
    const float* __restrict__ ws,          // [ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K, int bn, int bk) {
  gtq_body<GEMV_FP8, false>(x, GemvQw{wv, ws, nullptr, nullptr, bn, bk}, nullptr, y, M, N, K, 1);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_fp8_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K] e4m3 codes
    const float* __restrict__ ws,          // [ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K, int bn, int bk) {
  gtq_body<GEMV_FP8, false>(x, GemvQw{wv, ws, nullptr, nullptr, bn, bk}, nullptr, y, M, N, K, 1);
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
  gtq_body<GEMV_NVFP4, true>(x, GemvQw{wv, nullptr, ws, ws2, 0, 0}, group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_grouped_nvfp4_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [E, N, K / 2] packed e2m1
    const unsigned char* __restrict__ ws,  // [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [E] fp32 weight_scale_2
    const int* __restrict__ group,         // [M] int32: expert id of each row (any order)
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K, int E) {
  gtq_body<GEMV_NVFP4, true>(x, GemvQw{wv, nullptr, ws, ws2, 0, 0}, group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_grouped_fp8(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [E, N, K] e4m3 codes
    const float* __restrict__ ws,          // [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const int* __restrict__ group,         // [M] int32: expert id of each row (any order)
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K, int E, int bn, int bk) {
  gtq_body<GEMV_FP8, true>(x, GemvQw{wv, ws, nullptr, nullptr, bn, bk}, group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(128) gemm_tc_grouped_fp8_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [E, N, K] e4m3 codes
    const float* __restrict__ ws,          // [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const int* __restrict__ group,         // [M] int32: expert id of each row (any order)
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K, int E, int bn, int bk) {
  gtq_body<GEMV_FP8, true>(x, GemvQw{wv, ws, nullptr, nullptr, bn, bk}, group, y, M, N, K, E);
}
