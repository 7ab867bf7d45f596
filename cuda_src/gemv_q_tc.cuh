// gemv_q_tc.cuh -- the lane's work of the decode/verify GEMV for quantised weights on the tensor core (DESIGN §3b;
// the order of cupyglm/backend/tc_quant.py, its numpy reference): gemv_tc.cuh's warp slices and mma chains over
// weights made exact bf16 in registers from the bytes as stored (dequant.cuh's layouts and scale indexing;
// gemv_q_dec.cuh's decoders):
//   NVFP4  e2m1 x its group's e4m3 scale (exact in bf16): byte lookups (prmt) and one paired bf16 multiply by the
//          broadcast group scale; the tensor scale_2 multiplies each output once.
//   FP8    e4m3 (exact in bf16): bits placed and one paired multiply by 2^120; a chain restarts at every bk-block
//          and its fp32 result, times the block's scale_inv, is added in k order.
// Lane (g, t) of a warp loads 8c consecutive k (c = 4 NVFP4: 16 bytes; c = 1 FP8: 8 bytes) of weight columns g and
// g + 8 and of its rows at each 32c-block of the slice; step s of the block takes k 8ct + 4s + 0..3.  Weights go
// from global memory straight into the A fragments, x rows into the B fragments (no staging); runs of whole
// aligned blocks advance pointers, U blocks' loads in flight, and hold no bounds code.  gemv_q_block.cuh sums a
// block's slices.
#pragma once
#include "gemv_tc.cuh"
#include "dequant.cuh"
#include "gemv_q_dec.cuh"

#define GEMV_FP8 0
#define GEMV_NVFP4 1

// One quantised weight as stored (the fields of the other format are unused).
struct GemvQw {
  const unsigned char* v;   // FP8 [E, N, K] e4m3 codes; NVFP4 [E, N, K / 2] packed e2m1 (element 2i low nibble)
  const float* fs;          // FP8 [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
  const unsigned char* ns;  // NVFP4 [E, N, K / 16] e4m3 weight_scale
  const float* s2;          // NVFP4 [E] fp32 weight_scale_2
  int bn, bk;               // FP8 block (bk a multiple of 32: the launcher checks)
};

// What one block reads: columns [n0, n0 + ncols) of expert e of each weight, rows [0, nrows) of x.
template <int NW>
struct GemvQSrc {
  GemvQw w[NW];
  float s2[NW];             // NVFP4: the expert's tensor scale of each weight
  const __nv_bfloat16* x;   // the block's first row (rows at stride K)
  long long e;
  int n0, ncols, nrows, N, K;
  bool xvec, wvec;          // 16-byte x loads; whole weight loads (row bytes and base aligned)
  bool svec;                // NVFP4: 2-byte group scale loads (K / 16 even, base aligned)
  bool pair;                // NW = 1 over two weights (gemv_q_pair): column c < 8 is w[0]'s n0 + c, else wu's
                            // n0 + c - 8
  GemvQw wu;                // pair: the second weight
  float s2u;                // pair, NVFP4: the second weight's tensor scale
};

// The weight and the column (from n0) of a block's column c (pair: 8 columns of each of two weights).
template <int NW>
static __device__ __forceinline__ const GemvQw& gq_w(const GemvQSrc<NW>& src, int i, int c) {
  return src.pair && c >= 8 ? src.wu : src.w[i];
}
template <int NW>
static __device__ __forceinline__ int gq_col(const GemvQSrc<NW>& src, int c) { return src.pair ? c & 7 : c; }

// Lane (g, .)'s block column of half h (g or g + 8), a column past ncols read as the last one.
template <int NW>
static __device__ __forceinline__ int gq_lane_col(const GemvQSrc<NW>& src, int g, int h) {
  return src.pair ? min(g, src.ncols - 1) + 8 * h : min(g + 8 * h, src.ncols - 1);
}

template <int F>
struct GqFmt {
  static constexpr int C = F == GEMV_NVFP4 ? 4 : 1;          // 32-k units of a lane's load
  static constexpr int BYTES = F == GEMV_NVFP4 ? 16 : 8;     // bytes of a lane's load
};

template <int F>
static __device__ __forceinline__ int gq_row_bytes(int K) { return F == GEMV_FP8 ? K : K / 2; }

// The speed model's compile (GEMV_BUCKET_ONLY) keeps whole vector loads only (its shapes are aligned), so its
// disassembly holds the loop a block runs; every other compile reads partial chunks byte by byte.
#ifdef GEMV_BUCKET_ONLY
#define GQ_WHOLE_ONLY 1
#else
#define GQ_WHOLE_ONLY 0
#endif

// A lane's BYTES packed bytes of a row at byte b (rb bytes a row), those past the row zero.
template <int F>
static __device__ __forceinline__ uint4 gq_load(const unsigned char* row, int b, int rb, bool vec) {
  constexpr int n = GqFmt<F>::BYTES;
  const int valid = min(n, rb - b);
  if (!GQ_WHOLE_ONLY && valid <= 0) return make_uint4(0u, 0u, 0u, 0u);
  if (GQ_WHOLE_ONLY || (vec && valid == n)) {
    if (n == 16) return *reinterpret_cast<const uint4*>(row + b);
    const uint2 v = *reinterpret_cast<const uint2*>(row + b);
    return make_uint4(v.x, v.y, 0u, 0u);
  }
  unsigned q[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < n; ++i)
    if (i < valid) q[i >> 2] |= (unsigned)row[b + i] << (8 * (i & 3));
  return make_uint4(q[0], q[1], q[2], q[3]);
}

// x row c of a reader: memory rows at stride K (GemvXMem), or where the reader's row(c) says (a gathered row).
static __device__ __forceinline__ const __nv_bfloat16* gq_xrow(const GemvXMem& xr, int c) {
  return xr.x + (long long)c * xr.K;
}
template <typename XR>
static __device__ __forceinline__ const __nv_bfloat16* gq_xrow(const XR& xr, int c) { return xr.row(c); }

// x row c's 8 bf16 at kk of a whole aligned chunk, p = gq_xrow(xr, c) + kk: a load for readers of rows in memory; a
// reader that computes its rows (gemv_norm_x.cuh) overloads it.
template <typename XR>
static __device__ __forceinline__ uint4 gq_x_whole(const XR& xr, const __nv_bfloat16* p, int c, int kk) {
  (void)xr, (void)c, (void)kk;
  return *reinterpret_cast<const uint4*>(p);
}

// x row c's 8 bf16 at kk through the reader (the speed model's compile: whole loads, as gq_load).
template <typename XR>
static __device__ __forceinline__ uint4 gq_x8(const XR& xr, int c, int kk, int valid) {
  if (GQ_WHOLE_ONLY) return gq_x_whole(xr, gq_xrow(xr, c) + kk, c, kk);
  return xr.load8(c, kk, valid);
}

// NVFP4: the e4m3 codes of the two groups of a lane's 32 k at k of column c (its scale row at row), in bytes 0
// and 2 (0 past K; c below ncols).  The controls' builds index each code through dequant.cuh.
template <int NW>
static __device__ __forceinline__ unsigned gq_scale_codes(const GemvQSrc<NW>& src, const unsigned char* row, int i,
                                                          int c, int k) {
  const int gk = src.K >> 4, gr = (int)((unsigned)k >> 4);   // k >= 0
  if (!GQ_WHOLE_ONLY && gr >= gk) return 0u;
#if defined(CONTROL_SCALE_NEXT_BLOCK) || defined(CONTROL_SCALE_TRANSPOSED)
  const unsigned char* ns = gq_w(src, i, c).ns;
  const int n = src.n0 + gq_col(src, c);
  unsigned v = ns[dq_nvfp4_scale_at(src.e, n, gr, src.N, src.K)];
  if (gr + 1 < gk) v |= (unsigned)ns[dq_nvfp4_scale_at(src.e, n, gr + 1, src.N, src.K)] << 16;
  return v;
#else
  (void)i;
  if (GQ_WHOLE_ONLY || (src.svec && gr + 1 < gk))          // gr is even: a 2-byte load
    return gq_prmt(*reinterpret_cast<const unsigned short*>(row + gr), 0u, 0x4140u);
  return row[gr] | (gr + 1 < gk ? (unsigned)row[gr + 1] << 16 : 0u);
#endif
}

// gq_scale_codes' two codes (bytes 0 and 2) in bytes 0 and 1, as gq_decode_c takes them.
static __device__ __forceinline__ unsigned gq_scale_pair(unsigned v) { return (v & 0xffu) | ((v >> 8) & 0xff00u); }

// gq_scale_codes' two codes in bytes 0 and 1 (gq_decode_c's layout): one 2-byte load where it is whole.
template <int NW>
static __device__ __forceinline__ unsigned gq_scale_lane(const GemvQSrc<NW>& src, const unsigned char* row, int i,
                                                         int c, int k) {
#if !defined(CONTROL_SCALE_NEXT_BLOCK) && !defined(CONTROL_SCALE_TRANSPOSED)
  const int gr = (int)((unsigned)k >> 4);
  if (GQ_WHOLE_ONLY || (src.svec && gr + 1 < (src.K >> 4))) return *reinterpret_cast<const unsigned short*>(row + gr);
#endif
  return gq_scale_pair(gq_scale_codes(src, row, i, c, k));
}

// gq_load and gq_scale_codes of a whole run (gq_run): every load inside the row and aligned, so no checks.
template <int F>
static __device__ __forceinline__ uint4 gq_load_whole(const unsigned char* row, int b) {
  if (F == GEMV_NVFP4) return *reinterpret_cast<const uint4*>(row + b);
  const uint2 v = *reinterpret_cast<const uint2*>(row + b);
  return make_uint4(v.x, v.y, 0u, 0u);
}

template <int NW>
static __device__ __forceinline__ unsigned gq_scale_whole(const GemvQSrc<NW>& src, const unsigned char* row, int i,
                                                          int c, int k) {
#if defined(CONTROL_SCALE_NEXT_BLOCK) || defined(CONTROL_SCALE_TRANSPOSED)
  return gq_scale_pair(gq_scale_codes(src, row, i, c, k));
#else
  (void)src, (void)i, (void)c, (void)k;
  return *reinterpret_cast<const unsigned short*>(row);
#endif
}

// A lane's A halves of one block for weight column c: a[s][0] = k 8ct + 4s + 0, 1 and a[s][1] = + 2, 3.
// sc: NVFP4's group scale codes (gq_scale_codes).
template <int F>
static __device__ __forceinline__ void gq_decode(unsigned (*a)[2], uint4 v, unsigned sc) {
  const unsigned wd[4] = {v.x, v.y, v.z, v.w};
  if (F == GEMV_NVFP4) {
    const unsigned p = gq_e4m3x2(sc);
    const unsigned s[2] = {gq_prmt(p, p, 0x1010u), gq_prmt(p, p, 0x3232u)};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      unsigned r[4];
      gq_e2m1x8(wd[q], r);
#pragma unroll
      for (int j = 0; j < 4; ++j) a[2 * q + (j >> 1)][j & 1] = gq_bmul2(r[j], s[q >> 1]);
    }
  } else {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      a[q][0] = gq_bmul2(gq_e4m3_bits(wd[q], 0x9180u), 0x7b807b80u);
      a[q][1] = gq_bmul2(gq_e4m3_bits(wd[q], 0xb3a2u), 0x7b807b80u);
    }
  }
}

// gq_decode with NVFP4's scale codes in bytes 0 and 1 of sc (a whole 2-byte load), the group's scale broadcast by
// the multiply's operand: the same A halves.
template <int F>
static __device__ __forceinline__ void gq_decode_c(unsigned (*a)[2], uint4 v, unsigned sc) {
  if (F != GEMV_NVFP4) {
    gq_decode<F>(a, v, sc);
    return;
  }
  const unsigned wd[4] = {v.x, v.y, v.z, v.w}, s = gq_nv_scales(sc);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    unsigned r[4];
    gq_e2m1x8(wd[q], r);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      a[2 * q + (j >> 1)][j & 1] = q < 2 ? gq_bmul2h<0>(r[j], s) : gq_bmul2h<1>(r[j], s);
  }
}

// The steps of one block for weight i: ag / ah the A halves of columns g / g + 8, xc the rows' chunks.
// CONTROL_TC_REVERSED / CONTROL_TC_TRANSPOSED (planted) as gemv_tc.cuh's gtc_block.
template <int NT, int C>
static __device__ __forceinline__ void gq_steps(float (*d)[4], const unsigned (*ag)[2], const unsigned (*ah)[2],
                                                const uint4 (*xc)[C]) {
#pragma unroll
  for (int q = 0; q < 2 * C; ++q) {
#ifdef CONTROL_TC_REVERSED
    const int s = 2 * C - 1 - q;
#else
    const int s = q;
#endif
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint4 xv = xc[j][s >> 1];
      const unsigned b0 = (s & 1) ? xv.z : xv.x, b1 = (s & 1) ? xv.w : xv.y;
#ifdef CONTROL_TC_TRANSPOSED
      gtc_mma(d[j], ag[s][1], ah[s][1], ag[s][0], ah[s][0], b0, b1);
#else
      gtc_mma(d[j], ag[s][0], ah[s][0], ag[s][1], ah[s][1], b0, b1);
#endif
    }
  }
}

// FP8: the chain's fp32 results d times their block's scale (columns g, g + 8) added into acc (the slice's first
// chain: acc = its part); d back to +0.0.
template <int NW, int NT>
static __device__ __forceinline__ void gq_close(float (*acc)[NT][4], float (*d)[NT][4], const GemvQSrc<NW>& src,
                                                int kbk, int g, bool first) {
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    const int bn = src.w[i].bn, bk = src.w[i].bk, sn = (src.N + bn - 1) / bn, sk = (src.K + bk - 1) / bk;
    float s[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = g + 8 * h, n = src.n0 + gq_col(src, c);
      s[h] = (src.pair ? g : c) < src.ncols ? gq_w(src, i, c).fs[dq_fp8_scale_at(src.e, n / bn, kbk, sn, sk)] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = d[i][j][e] * s[e >> 1];
        acc[i][j][e] = first ? p : acc[i][j][e] + p;
        d[i][j][e] = 0.0f;
      }
  }
}

// One block's steps for every weight: w / sc its loads (columns g, g + 8), xc the rows' chunks.
template <int NW, int NT, int F>
static __device__ __forceinline__ void gq_block(float (*d)[NT][4], const uint4 (*w)[2], const unsigned (*sc)[2],
                                                const uint4 (*xc)[GqFmt<F>::C]) {
  constexpr int C = GqFmt<F>::C;
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    unsigned ag[2 * C][2], ah[2 * C][2];
    gq_decode_c<F>(ag, w[i][0], sc[i][0]);
    gq_decode_c<F>(ah, w[i][1], sc[i][1]);
    gq_steps<NT, C>(d[i], ag, ah, xc);
  }
}

// The 32c-blocks [kb, b) of a slice ending at k1 into the chains d (weight i, row tile j), one at a time, any
// alignment (a chunk past k1 reads zeros).  A column past ncols reads column ncols - 1 and a row past nrows row
// nrows - 1 (an output takes only its own column and row, and those are never stored), so no load waits on a
// predicate.  rg / sr: the rows (weight i, columns g, g + 8) of values and NVFP4's scales.
template <int NW, int NT, int F, typename XR>
static __device__ __forceinline__ void gq_run(float (*d)[NT][4], const GemvQSrc<NW>& src, const XR& xr,
                                              const unsigned char* const* rg, const unsigned char* const* sr, int kb,
                                              int b, int k1, int g, int t) {
  constexpr int C = GqFmt<F>::C;
  const int rb = gq_row_bytes<F>(src.K);
#pragma unroll(3 - NW)                     // two blocks' loads in flight for one weight (registers)
  for (; kb < b; kb += 32 * C) {
    const int kk = kb + 8 * C * t, bt = F == GEMV_FP8 ? kk : (int)((unsigned)kk >> 1);   // kk >= 0
    uint4 w[NW][2], xc[NT][C];
    unsigned sc[NW][2];
#pragma unroll
    for (int i = 0; i < NW; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        w[i][h] = gq_load<F>(rg[2 * i + h], bt, rb, src.wvec);
        sc[i][h] = F != GEMV_NVFP4 ? 0u : gq_scale_lane(src, sr[2 * i + h], i, gq_lane_col(src, g, h), kk);
      }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int q = 0; q < C; ++q)
        xc[j][q] = gq_x8(xr, min(g + 8 * j, src.nrows - 1), kk + 8 * q, min(8, k1 - kk - 8 * q));
    gq_block<NW, NT, F>(d, w, sc, xc);
  }
}

// gq_run over whole aligned blocks (the caller checked alignment), U at a time from kb while they lie inside
// [.., b), through pointers that advance a run's bytes (no bounds or index code in the loop); returns where it
// stopped.  The x rows come from memory at the reader's row pointers (gq_xrow).
template <int NW, int NT, int F, int U, typename XR>
static __device__ __forceinline__ int gq_run_whole(float (*d)[NT][4], const GemvQSrc<NW>& src, const XR& xr,
                                                   const unsigned char* const* rg, const unsigned char* const* sr,
                                                   int kb, int b, int g, int t) {
  constexpr int C = GqFmt<F>::C, KB = 32 * C, WB = F == GEMV_FP8 ? KB : KB / 2;   // k and value bytes a block
  const int kk0 = kb + 8 * C * t;
  const unsigned char *pw[2 * NW], *ps[2 * NW];
  const __nv_bfloat16* px[NT];
  int cx[NT];
#pragma unroll
  for (int i = 0; i < 2 * NW; ++i) {
    pw[i] = rg[i] + (F == GEMV_FP8 ? kk0 : kk0 >> 1);
    ps[i] = F == GEMV_NVFP4 ? sr[i] + (kk0 >> 4) : nullptr;
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    cx[j] = min(g + 8 * j, src.nrows - 1);
    px[j] = gq_xrow(xr, cx[j]) + kk0;
  }
  for (; kb + KB * U <= b; kb += KB * U) {
    uint4 w[U][NW][2], xc[U][NT][C];
    unsigned sc[U][NW][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {          // every load of the U blocks in flight before the first mma
#pragma unroll
      for (int i = 0; i < NW; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          w[u][i][h] = gq_load_whole<F>(pw[2 * i + h], WB * u);
          sc[u][i][h] = F != GEMV_NVFP4 ? 0u
                                        : gq_scale_whole(src, ps[2 * i + h] + KB / 16 * u, i, gq_lane_col(src, g, h),
                                                         kb + KB * u + 8 * C * t);
        }
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < C; ++q)
          xc[u][j][q] = gq_x_whole(xr, px[j] + KB * u + 8 * q, cx[j], kb + KB * u + 8 * C * t + 8 * q);
    }
#pragma unroll
    for (int i = 0; i < 2 * NW; ++i) {
      pw[i] += WB * U;
      ps[i] += KB / 16 * U;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) px[j] += KB * U;
#pragma unroll
    for (int u = 0; u < U; ++u) gq_block<NW, NT, F>(d, w[u], sc[u], xc[u]);
  }
  return kb;
}

// Blocks a WHOLE run takes at a time: the loads of U blocks in flight within the register budget.
template <int NW, int NT, int F>
struct GqUnroll {
  static constexpr int U = F == GEMV_FP8 ? 4 : (NT == 1 ? 2 : 0);
};

// The 32c-blocks [a, b) of a slice ending at k1 into the chains d: runs of whole blocks where every load is
// aligned, then the rest (a short tail, or unaligned rows) one block at a time.
template <int NW, int NT, int F, typename XR>
static __device__ __forceinline__ void gq_blocks(float (*d)[NT][4], const GemvQSrc<NW>& src, const XR& xr,
                                                 const unsigned char* const* rg, const unsigned char* const* sr,
                                                 int a, int b, int k1, int g, int t) {
  int kb = a;
  if (GqUnroll<NW, NT, F>::U > 0 && (GQ_WHOLE_ONLY || (src.wvec && xr.vec && (F == GEMV_FP8 || src.svec))))
    kb = gq_run_whole<NW, NT, F, GqUnroll<NW, NT, F>::U + (GqUnroll<NW, NT, F>::U == 0)>(d, src, xr, rg, sr, kb, b, g,
                                                                                        t);
  if (GQ_WHOLE_ONLY && GqUnroll<NW, NT, F>::U > 0)   // the speed model's compile: the tail as whole blocks too
    gq_run_whole<NW, NT, F, 1>(d, src, xr, rg, sr, kb, b, g, t);
  else
    gq_run<NW, NT, F>(d, src, xr, rg, sr, kb, b, k1, g, t);
}
