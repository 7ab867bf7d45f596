// gemm_tc_q.cu -- the prompt-row GEMM on the tensor core for quantised weights (DESIGN §3b): y[m, n] =
// sum_k x[m, k] * w[e, n, k] (e = 0 dense, e = group[m] grouped) by mma.m16n8k16, fp32 out or rounded once to bf16.
//
// Order: the quantised decode GEMV's (cupyglm/backend/tc_quant.py quant_rows, gemv_q_tc.cuh), fixed by K alone,
// in its very steps: weights made exact bf16 by gq_decode (the A operand, 16 columns), x rows the B operand (8 rows
// a tile), gq_steps' mma.  K is cut into slices of GTC_SLICE added in slice order; NVFP4: a slice is one chain of
// 128-k blocks from +0.0 and scale_2 multiplies each output once at the end; FP8: a chain restarts at every
// bk-block, its fp32 result times scale_inv of (the column's n-block, the k-block) is added in k order.  Lane (g, t)
// takes 32c consecutive k of a block (c = 4 NVFP4, 1 FP8; step s holds k 8ct + 4s + 0..3) of columns g, g + 8 and
// of rows g of each row tile.  An mma output depends on its own row and column only, so a prompt row's bits are the
// decode row's whatever rows share its tile.
//
// Launch: GTQ_THREADS threads (8 warps), two GtqStage then GtqAcc (FP8 on the big tile: two) of dynamic shared
// memory (ops_gemm_tc_q.shared_bytes); grid (ceil(M / GTQ_M), ceil(N / GTQ_N)): the rows on grid.x.  A block holds
// a GTQ_M-row (128; -DGTQ_SMALL 64) by 128-column tile: warp w takes columns 16w .. + 16 (one A tile) and all GTQ_M
// rows (GTQ_RT tiles of 8), so a weight made bf16 serves them all.  The x rows and the packed weights (NVFP4: and
// their group scales) of GTQ_SK k are staged through shared memory (gemm_tc_q_stage.cuh); the finished slices'
// running sums wait in shared memory (GtqAcc).  Blocks split M and N, never K.  Grouped: the block loops over the
// distinct experts among its rows in ascending order, computes its tile against that expert and stores only the
// rows of that expert; a row whose id is outside [0, E) reads nothing and gets NaN (the launcher checks the ids,
// kernels/guards.py).
#include "common.cuh"
#include "mma.cuh"
#include "gemv_q_tc.cuh"
#include "gemm_tc_q_stage.cuh"

// FP8's block scales: the n-blocks of columns g, g + 8.
struct GtqFp8 {
  const float* fs;                     // [E, sn, sk] fp32 weight_scale_inv
  int nb[2], bk, sn, sk;
};

// Block b (of 32c k) of a stage into the warp's chains d: columns c0 + g, + 8 made bf16 once, then each row tile's
// steps (a row tile's chain keeps gq_steps' order; the tiles' chains are independent).
template <int F>
static __device__ __forceinline__ void gtq_block(float (*d)[4], const GtqStage& sh, int b, int c0, int g, int t) {
  constexpr int C = GqFmt<F>::C;
  unsigned ag[2 * C][2], ah[2 * C][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = c0 + g + 8 * h;
    uint4 v;
    unsigned sc = 0u;
    if (F == GEMV_FP8) {                   // 8 bytes at k 32b + 8t: half t % 2 of chunk 2b + t / 2
      const uint2 u = reinterpret_cast<const uint2*>(&sh.w[gtq_wat<F>(n, 2 * b + (t >> 1))])[t & 1];
      v = make_uint4(u.x, u.y, 0u, 0u);
    } else {                               // 16 bytes at k 32t; group codes 2t, 2t + 1 in bytes 0 and 2
      v = sh.w[gtq_wat<F>(n, t)];
      sc = gq_prmt(reinterpret_cast<const unsigned short*>(sh.s)[4 * n + t], 0u, 0x4140u);
    }
    gq_decode<F>(h ? ah : ag, v, sc);
  }
#pragma unroll
  for (int j = 0; j < GTQ_RT; ++j) {
    uint4 xc[1][C];
#pragma unroll
    for (int q = 0; q < C; ++q) xc[0][q] = sh.x[gtq_xat(8 * j + g, 4 * C * b + C * t + q)];
    gq_steps<1, C>(d + j, ag, ah, xc);
  }
}

// FP8: the chain d times its k-block's scale (columns g, g + 8) added into the slice sum (first: it is the sum);
// d back to +0.0.  The slice sum: sl in registers, or (GTQ_VSH: the big tile, whose registers are short) vs.
static __device__ __forceinline__ void gtq_close(float (*sl)[4], GtqAcc& vs, float (*d)[4], const GtqFp8& fp,
                                                 long long e, int kblk, bool first) {
  const float s[2] = {fp.fs[dq_fp8_scale_at(e, fp.nb[0], kblk, fp.sn, fp.sk)],
                      fp.fs[dq_fp8_scale_at(e, fp.nb[1], kblk, fp.sn, fp.sk)]};
#pragma unroll
  for (int r = 0; r < GTQ_RT; ++r) {
    float p[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {          // d[c] = D[column g + 8 (c / 2)][row 2t + c % 2]
      p[c] = d[r][c] * s[c >> 1];
      d[r][c] = 0.0f;
    }
#ifdef GTQ_VSH
    float4& a = vs.v[r * GTQ_THREADS + threadIdx.x];
    if (!first) {
      const float4 q = a;
      p[0] = q.x + p[0], p[1] = q.y + p[1], p[2] = q.z + p[2], p[3] = q.w + p[3];
    }
    a = make_float4(p[0], p[1], p[2], p[3]);
#else
    (void)vs;
#pragma unroll
    for (int c = 0; c < 4; ++c) sl[r][c] = first ? p[c] : sl[r][c] + p[c];
#endif
  }
}

// FP8 after a slice's last close: its sum into d.
static __device__ __forceinline__ void gtq_slice(float (*d)[4], const float (*sl)[4], const GtqAcc& vs) {
#pragma unroll
  for (int r = 0; r < GTQ_RT; ++r) {
#ifdef GTQ_VSH
    const float4 q = vs.v[r * GTQ_THREADS + threadIdx.x];
    d[r][0] = q.x, d[r][1] = q.y, d[r][2] = q.z, d[r][3] = q.w;
#else
    (void)vs;
    d[r][0] = sl[r][0], d[r][1] = sl[r][1], d[r][2] = sl[r][2], d[r][3] = sl[r][3];
#endif
  }
}

// After a slice (its sum in v): the sum so far acc + v, back to acc, or left in v after the last slice.
static __device__ __forceinline__ void gtq_fold(float (*v)[4], GtqAcc& acc, bool first, bool last) {
#pragma unroll
  for (int r = 0; r < GTQ_RT; ++r) {
    float4& a = acc.v[r * GTQ_THREADS + threadIdx.x];
    if (!first) {
      const float4 p = a;
      v[r][0] = p.x + v[r][0], v[r][1] = p.y + v[r][1], v[r][2] = p.z + v[r][2], v[r][3] = p.w + v[r][3];
    }
    if (!last) a = make_float4(v[r][0], v[r][1], v[r][2], v[r][3]);
  }
}

// One stage's turn: stage st landed (every thread's copies, then a barrier that also ends stage st - 1's reads),
// stage st + 1 issued into the other buffer.
template <int F, bool VEC>
static __device__ __forceinline__ void gtq_turn(GtqStage* sh, const GtqSrc& s, const unsigned char* ns, long long e,
                                                int n0, int N, int st, int nst) {
  gts_wait();
  __syncthreads();
  if (st + 1 < nst) gtq_issue<F, VEC>(sh[(st + 1) & 1], s, ns, e, n0, N, st + 1);
}

// The block's tile against expert e over all K into this warp's d (NVFP4's scale_2 not applied; FP8: sl, acc[1] its
// slice sums): stages in ascending k, each slice's chains from +0.0, FP8's chains closed at every bk-block,
// the slices added in order.  The inner loop runs whole stages that hold no slice or chain boundary; a stage
// that does (FP8 blocks below GTQ_SK, K's last stage) takes its blocks one by one.  Every thread takes part.
template <int F, bool VEC>
static __device__ __forceinline__ void gtq_sum(float (*d)[4], float (*sl)[4], GtqStage* sh, GtqAcc* acc,
                                               const GtqSrc& s, const GtqFp8& fp, const unsigned char* ns,
                                               long long e, int n0, int N) {
  constexpr int KB = 32 * GqFmt<F>::C;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, K = s.K;
  const int nst = (K + GTQ_SK - 1) / GTQ_SK, c0 = 16 * warp;
  __syncthreads();                         // the last pass's readers of the stages are done
  gtq_issue<F, VEC>(sh[0], s, ns, e, n0, N, 0);
  int chain = 0;
  for (int st = 0; st < nst;) {
    const int k0 = GTQ_SK * st, ks = k0 - k0 % GTC_SLICE;
    if (k0 == ks) {
#pragma unroll
      for (int r = 0; r < GTQ_RT; ++r) d[r][0] = d[r][1] = d[r][2] = d[r][3] = 0.0f;
      chain = k0;
    } else if (F == GEMV_FP8 && k0 % fp.bk == 0) {
      gtq_close(sl, acc[1], d, fp, e, chain / fp.bk, chain == ks);
      chain = k0;
    }
    int kend = min(ks + GTC_SLICE, K);     // the whole stages up to the slice's end, K or (FP8) the chain's end
    if (F == GEMV_FP8) kend = min(kend, (k0 / fp.bk + 1) * fp.bk);
    const int se = max(st, kend / GTQ_SK);
    for (; st < se; ++st) {
      gtq_turn<F, VEC>(sh, s, ns, e, n0, N, st, nst);
      // FP8: two of a stage's four blocks an iteration (registers: no spills in the stage loops)
#pragma unroll 2
      for (int b = 0; b < GTQ_SK / KB; ++b) gtq_block<F>(d, sh[st & 1], b, c0, g, t);
    }
    if (GTQ_SK * st == k0) {               // no whole stage ran: this one by blocks
      gtq_turn<F, VEC>(sh, s, ns, e, n0, N, st, nst);
#pragma unroll
      for (int b = 0; b < GTQ_SK / KB; ++b) {
        const int kb = k0 + KB * b;
        if (kb >= K) break;                // block-uniform
        if (F == GEMV_FP8 && b > 0 && kb % fp.bk == 0) {
          gtq_close(sl, acc[1], d, fp, e, chain / fp.bk, chain == ks);
          chain = kb;
        }
        gtq_block<F>(d, sh[st & 1], b, c0, g, t);
      }
      ++st;
    }
    const int k1 = min(K, GTQ_SK * st);
    if (k1 == K || k1 % GTC_SLICE == 0) {
      if (F == GEMV_FP8) {
        gtq_close(sl, acc[1], d, fp, e, chain / fp.bk, chain == ks);
        gtq_slice(d, sl, acc[1]);
      }
      gtq_fold(d, acc[0], ks == 0, k1 == K);
    }
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
// of the block does (the last expert's pass wins).
static __device__ __forceinline__ bool gtq_mine(int id, int e) {
#ifdef CONTROL_GROUP_STORE_ALL
  return id >= 0;
#else
  return id == e;
#endif
}

// The smallest expert above prev among the block's rows from m0 (E: none); every thread reads the same ids, so
// block-uniform.
template <bool GROUPED>
static __device__ __forceinline__ int gtq_next(const int* __restrict__ group, int m0, int M, int E, int prev) {
  if (!GROUPED) return prev < 0 ? 0 : E;
  int e = E;
  for (int r = 0; r < GTQ_M; ++r) {
    const int i = gtq_id<true>(group, m0 + r, M, E);
    if (i > prev && i < e) e = i;
  }
  return e;
}

// The epilogue: fp32 as summed, or rounded once to bf16.
static __device__ __forceinline__ void gtq_store(float* y, long long i, float v) { y[i] = v; }
static __device__ __forceinline__ void gtq_store(__nv_bfloat16* y, long long i, float v) { y[i] = to_bf16(v); }

// The warp's outputs of expert e's pass into its rows of that expert (e = -1: NaN into the rows whose id is
// outside [0, E)); NVFP4's scale_2 applied once here.
template <int F, bool GROUPED, typename Out>
static __device__ __forceinline__ void gtq_out(Out* __restrict__ y, const float (*v)[4],
                                               const int* __restrict__ group, int e, float s2, int m0, int n0, int M,
                                               int N, int E, int g, int t) {
#pragma unroll
  for (int r = 0; r < GTQ_RT; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) {          // v[r][c] = D[column g + 8 (c / 2)][row 2t + c % 2] of row tile r
      const int m = m0 + 8 * r + 2 * t + (c & 1), n = n0 + g + 8 * (c >> 1), i = gtq_id<GROUPED>(group, m, M, E);
      const float o = e < 0 ? NAN : F == GEMV_NVFP4 ? v[r][c] * s2 : v[r][c];
      if ((e < 0 ? i == -1 : gtq_mine(i, e)) && n < N) gtq_store(y, (long long)m * N + n, o);
    }
}

template <int F, bool GROUPED, bool VEC, typename Out>
static __device__ __forceinline__ void gtq_rows(unsigned char* sh, const __nv_bfloat16* __restrict__ x,
                                                const GemvQw& w, const int* __restrict__ group, Out* __restrict__ y,
                                                int M, int N, int K, int E) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * GTQ_M, n0 = blockIdx.y * GTQ_N, nw = n0 + 16 * warp;
  GtqSrc s;
  gtq_src<F>(s, x, m0, n0, M, N, K);
  GtqFp8 fp;
  fp.fs = w.fs;
  fp.bk = w.bk;
  fp.sn = F == GEMV_FP8 ? (N + w.bn - 1) / w.bn : 0;
  fp.sk = F == GEMV_FP8 ? (K + w.bk - 1) / w.bk : 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) fp.nb[h] = F == GEMV_FP8 ? min(nw + g + 8 * h, N - 1) / w.bn : 0;
  GtqStage* st = reinterpret_cast<GtqStage*>(sh);
  GtqAcc* acc = reinterpret_cast<GtqAcc*>(sh + 2 * sizeof(GtqStage));   // the running sums; FP8: the slice sums
  for (int e = gtq_next<GROUPED>(group, m0, M, E, -1); e < E; e = gtq_next<GROUPED>(group, m0, M, E, e)) {
    const long long col = (long long)e * N + n0;
    s.w0 = w.v + col * s.rb;
    s.s0 = F == GEMV_NVFP4 ? w.ns + col * (K / 16) : nullptr;
    float d[GTQ_RT][4], sl[GTQ_RT][4];     // a pass's sums (FP8: sl its slice sums)
    gtq_sum<F, VEC>(d, sl, st, acc, s, fp, w.ns, e, n0, N);
    gtq_out<F, GROUPED>(y, d, group, e, F == GEMV_NVFP4 ? w.s2[e] : 1.0f, m0, nw, M, N, E, g, t);
  }
  if (GROUPED) {
    const float nan[GTQ_RT][4] = {};       // unread: every stored value is NaN
    gtq_out<F, GROUPED>(y, nan, group, -1, 0.0f, m0, nw, M, N, E, g, t);
  }
}

// cp.async where x, the packed rows and NVFP4's scale rows allow 16-byte (scales 4-byte) copies (block-uniform),
// else element loads: the same values either way.
template <int F, bool GROUPED, typename Out>
static __device__ __forceinline__ void gtq_body(unsigned char* sh, const __nv_bfloat16* __restrict__ x,
                                                const GemvQw& w, const int* __restrict__ group, Out* __restrict__ y,
                                                int M, int N, int K, int E) {
  const int rb = gq_row_bytes<F>(K);
  const bool vec = gemv_aligned(x, x, K) && rb % 16 == 0 && ((unsigned long long)w.v) % 16 == 0 &&
                   (F == GEMV_FP8 || ((K / 16) % 4 == 0 && ((unsigned long long)w.ns) % 4 == 0));
  if (vec)
    gtq_rows<F, GROUPED, true>(sh, x, w, group, y, M, N, K, E);
  else
    gtq_rows<F, GROUPED, false>(sh, x, w, group, y, M, N, K, E);
}

// ---- dense: x [M, K] bf16 against one weight; y [M, N] ----
extern "C" __global__ void __launch_bounds__(GTQ_THREADS, 1) gemm_tc_nvfp4(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ ws,  // [N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [1] fp32 weight_scale_2
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K) {
  extern __shared__ __align__(16) unsigned char gtq_nvfp4_sh[];   // [2] GtqStage, GtqAcc (FP8 big tile: 2)
  gtq_body<GEMV_NVFP4, false>(gtq_nvfp4_sh, x, GemvQw{wv, nullptr, ws, ws2, 0, 0}, nullptr, y, M, N, K, 1);
}

extern "C" __global__ void __launch_bounds__(GTQ_THREADS, 1) gemm_tc_nvfp4_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ ws,  // [N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [1] fp32 weight_scale_2
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K) {
  extern __shared__ __align__(16) unsigned char gtq_nvfp4_bf16_sh[];   // [2] GtqStage, GtqAcc (FP8 big tile: 2)
  gtq_body<GEMV_NVFP4, false>(gtq_nvfp4_bf16_sh, x, GemvQw{wv, nullptr, ws, ws2, 0, 0}, nullptr, y, M, N, K, 1);
}

extern "C" __global__ void __launch_bounds__(GTQ_THREADS, 1) gemm_tc_fp8(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K] e4m3 codes
    const float* __restrict__ ws,          // [ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K, int bn, int bk) {
  extern __shared__ __align__(16) unsigned char gtq_fp8_sh[];   // [2] GtqStage, GtqAcc (FP8 big tile: 2)
  gtq_body<GEMV_FP8, false>(gtq_fp8_sh, x, GemvQw{wv, ws, nullptr, nullptr, bn, bk}, nullptr, y, M, N, K, 1);
}

extern "C" __global__ void __launch_bounds__(GTQ_THREADS, 1) gemm_tc_fp8_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [N, K] e4m3 codes
    const float* __restrict__ ws,          // [ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K, int bn, int bk) {
  extern __shared__ __align__(16) unsigned char gtq_fp8_bf16_sh[];   // [2] GtqStage, GtqAcc (FP8 big tile: 2)
  gtq_body<GEMV_FP8, false>(gtq_fp8_bf16_sh, x, GemvQw{wv, ws, nullptr, nullptr, bn, bk}, nullptr, y, M, N, K, 1);
}


// ---- grouped: row m against expert group[m] of an [E, N, K] stack; y [M, N] ----
extern "C" __global__ void __launch_bounds__(GTQ_THREADS, 1) gemm_tc_grouped_nvfp4(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [E, N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ ws,  // [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [E] fp32 weight_scale_2
    const int* __restrict__ group,         // [M] int32: expert id of each row (any order)
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K, int E) {
  extern __shared__ __align__(16) unsigned char gtq_grouped_nvfp4_sh[];   // [2] GtqStage, GtqAcc (FP8 big tile: 2)
  gtq_body<GEMV_NVFP4, true>(gtq_grouped_nvfp4_sh, x, GemvQw{wv, nullptr, ws, ws2, 0, 0}, group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(GTQ_THREADS, 1) gemm_tc_grouped_nvfp4_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [E, N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ ws,  // [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [E] fp32 weight_scale_2
    const int* __restrict__ group,         // [M] int32: expert id of each row (any order)
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K, int E) {
  extern __shared__ __align__(16) unsigned char gtq_grouped_nvfp4_bf16_sh[];   // [2] GtqStage, GtqAcc (FP8 big tile: 2)
  gtq_body<GEMV_NVFP4, true>(gtq_grouped_nvfp4_bf16_sh, x, GemvQw{wv, nullptr, ws, ws2, 0, 0}, group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(GTQ_THREADS, 1) gemm_tc_grouped_fp8(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [E, N, K] e4m3 codes
    const float* __restrict__ ws,          // [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const int* __restrict__ group,         // [M] int32: expert id of each row (any order)
    float* __restrict__ y,                 // [M, N] f32
    int M, int N, int K, int E, int bn, int bk) {
  extern __shared__ __align__(16) unsigned char gtq_grouped_fp8_sh[];   // [2] GtqStage, GtqAcc (FP8 big tile: 2)
  gtq_body<GEMV_FP8, true>(gtq_grouped_fp8_sh, x, GemvQw{wv, ws, nullptr, nullptr, bn, bk}, group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(GTQ_THREADS, 1) gemm_tc_grouped_fp8_bf16(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const unsigned char* __restrict__ wv,  // [E, N, K] e4m3 codes
    const float* __restrict__ ws,          // [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const int* __restrict__ group,         // [M] int32: expert id of each row (any order)
    __nv_bfloat16* __restrict__ y,         // [M, N] bf16 (the fp32 result rounded once)
    int M, int N, int K, int E, int bn, int bk) {
  extern __shared__ __align__(16) unsigned char gtq_grouped_fp8_bf16_sh[];   // [2] GtqStage, GtqAcc (FP8 big tile: 2)
  gtq_body<GEMV_FP8, true>(gtq_grouped_fp8_bf16_sh, x, GemvQw{wv, ws, nullptr, nullptr, bn, bk}, group, y, M, N, K, E);
}
