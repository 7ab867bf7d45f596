// gemv_q_tile.cuh -- the weight-streaming machinery of the decode/verify GEMV (gemv_tile.cuh) for quantised
// weights (dequant.cuh): FP8 block-scaled (e4m3 codes, fp32 scale per bn x bk block) and NVFP4 (two e2m1 codes a
// byte, an e4m3 scale per 16 values, an fp32 scale per tensor), read as stored and dequantised in registers.
//
// Same bits as the dequantising gemm.cu kernels and the reference gemm(x, dequant(w)): each weight value is
// dequant.cuh's sequence of IEEE operations (FP8 e4m3 * scale; NVFP4 (e2m1 * e4m3 scale) * tensor scale), and
// the sums are gemv_tile.cuh's (term k to lane k % 16 in increasing k from +0.0, the lane-16 fold).
//
// A stage holds as many packed bytes of each column as the bf16 GEMV's stage (1 KiB, or 512 B a weight with
// NW = 2): TK = 2 (FP8) or 4 (NVFP4) times the bf16 stage's k values, read with the bf16 GEMV's count of 16-byte
// loads (16 fp8 or 32 fp4 values a load), so a block keeps as many weight bytes in flight; NVFP4's e4m3 group
// scales are staged beside them (each read once per group); FP8's fp32 scale is read once per (thread, k block)
// and held in a register.  The stage's weights are issued into registers before the previous stage is summed.
// x (L2-resident) is staged in sub-stages of the bf16 stage's k values, read synchronously, so the registers
// hold only the weights' loads.  Thread (lane, o) reads back its lane's codes in increasing k and decodes them.
// Blocks split N (and rows) only, never K; a block's rows run in their row bucket (gemv_tile.cuh's gemv_bucket).
#pragma once
#include "gemv_tile.cuh"
#include "dequant.cuh"

#define GEMV_FP8 0
#define GEMV_NVFP4 1

template <int NW, int F>
struct GemvQ {
  static constexpr int XK = Gemv<NW>::TK;                      // k values of an x sub-stage (the bf16 stage)
  static constexpr int SUBS = F == GEMV_FP8 ? 2 : 4;           // x sub-stages a stage
  static constexpr int TK = SUBS * XK;                         // k values per stage
  static constexpr int WB = F == GEMV_FP8 ? TK : TK / 2;       // packed bytes of a column per stage (1024 / NW)
  static constexpr int WCHUNKS = WB / 16;                      // 16-byte loads of a column per stage
  static constexpr int WLOADS = (GEMV_OUTS * WCHUNKS + 255) / 256;   // per thread per stage, per weight
  static constexpr int WPITCH = WB + 16;                       // shared pitch (bytes): a warp's two columns apart
  static constexpr int GS = F == GEMV_NVFP4 ? TK / 16 : 1;     // NVFP4 group scales of a column per stage
  static constexpr int SCHUNKS = GS >= 16 ? GS / 16 : 1;      // 16-byte loads of a column's scales per stage
};

template <int NW, int F>
union GemvQShared {
  struct {
    union {
      unsigned short x[GEMV_ROWS][Gemv<NW>::PITCH];           // [row, k of the sub-stage] bf16 bit patterns
      float xf[GEMV_ROWS / 2][Gemv<NW>::PITCH];               // the same values as fp32 (buckets <= 8: GemvXf)
    };
    unsigned char w[NW][GEMV_OUTS][GemvQ<NW, F>::WPITCH];     // [weight, column, byte of the stage] packed codes
    unsigned char s[NW][GEMV_OUTS][GemvQ<NW, F>::GS];         // [weight, column, group of the stage] e4m3 (NVFP4)
  } tile;
  float part[NW][GEMV_OUTS][GEMV_ROWS][GEMM_LANES + 1];      // [weight, column, row, lane] fp32 lane partials
};

// One quantised weight as stored (the fields of the other format are unused).
struct GemvQw {
  const unsigned char* v;   // FP8 [E, N, K] e4m3 codes; NVFP4 [E, N, K / 2] packed e2m1 (element 2i low nibble)
  const float* fs;          // FP8 [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
  const unsigned char* ns;  // NVFP4 [E, N, K / 16] e4m3 weight_scale
  const float* s2;          // NVFP4 [E] fp32 weight_scale_2
  int bn, bk;               // FP8 block
};

// What one block reads: columns [n0, n0 + ncols) of expert e of each weight, rows [m0, m0 + nrows) of x.
template <int NW>
struct GemvQSrc {
  GemvQw w[NW];
  float s2[NW];             // NVFP4: the expert's tensor scale of each weight, read once per block
  const __nv_bfloat16* x;   // row m0 of x (rows at stride K)
  long long e;
  int n0, ncols, nrows, N, K, klen;   // klen: K summed (0: nothing read)
  bool xvec, wvec;          // 16-byte loads of x (K % 8 == 0, aligned) and of the packed rows (row bytes % 16 == 0)
  bool svec;                // NVFP4: 16-byte loads of the group scales (K % 256 == 0, aligned); else read in stash
};

template <int F>
static __device__ __forceinline__ int gemv_q_row_bytes(int K) { return F == GEMV_FP8 ? K : K / 2; }

// 16 packed bytes at p[0..16) of which `valid` lie inside the row; the rest read as 0 (never decoded).
static __device__ __forceinline__ uint4 gemv_q_load16(const unsigned char* p, int valid, bool vec) {
  if (valid <= 0) return make_uint4(0u, 0u, 0u, 0u);
  if (vec) return *reinterpret_cast<const uint4*>(p);
  unsigned int b[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 16; ++i)
    if (i < valid) b[i >> 2] |= (unsigned int)p[i] << (8 * (i & 3));
  return make_uint4(b[0], b[1], b[2], b[3]);
}

template <int NW, int F>
struct GemvQStage {
  uint4 w[NW][GemvQ<NW, F>::WLOADS];
  uint4 s[NW];                          // NVFP4: threads t < GEMV_OUTS * SCHUNKS, one load of group scales
};

template <int NW, int F>
static __device__ __forceinline__ void gemv_q_fetch(GemvQStage<NW, F>& s, const GemvQSrc<NW>& src, int k0) {
  typedef GemvQ<NW, F> Q;
  const int t = threadIdx.y * 16 + threadIdx.x;
  const int rb = gemv_q_row_bytes<F>(src.K);
  const int b0 = gemv_q_row_bytes<F>(k0);
#pragma unroll
  for (int q = 0; q < Q::WLOADS; ++q) {
    const int idx = t + 256 * q;
    const int c = idx / Q::WCHUNKS, b = b0 + 16 * (idx % Q::WCHUNKS);
    const bool in = idx < GEMV_OUTS * Q::WCHUNKS && c < src.ncols;
#pragma unroll
    for (int i = 0; i < NW; ++i)
      s.w[i][q] = in ? gemv_q_load16(src.w[i].v + (long long)c * rb + b, rb - b, src.wvec)
                     : make_uint4(0u, 0u, 0u, 0u);
  }
  if (F == GEMV_NVFP4 && src.svec) {
    const int c = t / Q::SCHUNKS, g = k0 / 16 + 16 * (t % Q::SCHUNKS), gk = src.K / 16;
    const bool in = t < GEMV_OUTS * Q::SCHUNKS && c < src.ncols;
#pragma unroll
    for (int i = 0; i < NW; ++i)
      s.s[i] = in ? gemv_q_load16(src.w[i].ns + (src.e * src.N + src.n0 + c) * (long long)gk + g, gk - g, true)
                  : make_uint4(0u, 0u, 0u, 0u);
  }
}

// The stage at k0 into shared memory; NVFP4 scales that cannot take 16-byte loads (or the planted controls'
// indexing) are read here, one byte each, through dequant.cuh's index.
template <int NW, int F>
static __device__ __forceinline__ void gemv_q_stash(const GemvQStage<NW, F>& s, GemvQShared<NW, F>& sh,
                                                    const GemvQSrc<NW>& src, int k0) {
  typedef GemvQ<NW, F> Q;
  const int t = threadIdx.y * 16 + threadIdx.x;
#pragma unroll
  for (int q = 0; q < Q::WLOADS; ++q) {
    const int idx = t + 256 * q;
    if (idx < GEMV_OUTS * Q::WCHUNKS) {
#pragma unroll
      for (int i = 0; i < NW; ++i)
        *reinterpret_cast<uint4*>(&sh.tile.w[i][idx / Q::WCHUNKS][16 * (idx % Q::WCHUNKS)]) = s.w[i][q];
    }
  }
  if (F != GEMV_NVFP4) return;
  if (src.svec) {
    if (t < GEMV_OUTS * Q::SCHUNKS) {
#pragma unroll
      for (int i = 0; i < NW; ++i)
        *reinterpret_cast<uint4*>(&sh.tile.s[i][t / Q::SCHUNKS][16 * (t % Q::SCHUNKS)]) = s.s[i];
    }
    return;
  }
  for (int idx = t; idx < GEMV_OUTS * Q::GS; idx += 256) {
    const int c = idx / Q::GS, g = k0 / 16 + idx % Q::GS;
    const bool in = c < src.ncols && g < src.K / 16;
#pragma unroll
    for (int i = 0; i < NW; ++i)
      sh.tile.s[i][c][idx % Q::GS] = in ? src.w[i].ns[dq_nvfp4_scale_at(src.e, src.n0 + c, g, src.N, src.K)] : 0;
  }
}

// x rows [0, nrows) of the sub-stage at k0 into shared memory (16-byte loads as gemv_fetch's; L2-resident); only
// the rows of the row bucket NR are written (the rows past it are never read back).
template <int NW, int F, int NR>
static __device__ __forceinline__ void gemv_q_x(GemvQShared<NW, F>& sh, const GemvQSrc<NW>& src, int k0) {
  typedef Gemv<NW> G;
  const int t = threadIdx.y * 16 + threadIdx.x;
  const int kk = 8 * (t % G::CHUNKS);
  const int valid = min(8, src.K - k0 - kk);
  uint4 v[G::VECS];
#pragma unroll
  for (int q = 0; q < G::VECS && G::STEP * q < NR; ++q) {
    const int r = t / G::CHUNKS + G::STEP * q;
    v[q] = r < src.nrows ? gemv_load8(src.x + (long long)r * src.K + k0 + kk, valid, src.xvec)
                         : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int q = 0; q < G::VECS && G::STEP * q < NR; ++q) {
    const int r = t / G::CHUNKS + G::STEP * q;
    if (r < NR) {
      if (GemvXf<NR>::on)
        gemv_store_f32x8(&sh.tile.xf[r][kk], v[q]);
      else
        *reinterpret_cast<uint4*>(&sh.tile.x[r][kk]) = v[q];
    }
  }
}

// Lane `lane` of column o over the sub-stage at kx (sub-stage `sub` of the stage): terms kx + lane,
// kx + lane + 16, ... (< K) in increasing k, per row of the NR slots (rows >= nrows skipped), each weight decoded
// once per term as dequant.cuh's readers decode it.  CONTROL_CHUNK_ORDER as in gemv_tile.cuh.
template <int NW, int F, int NR>
static __device__ __forceinline__ void gemv_q_sum(const GemvQShared<NW, F>& sh, float (*acc)[NR],
                                                  const GemvQSrc<NW>& src, int kx, int sub) {
  const int lane = threadIdx.x, o = threadIdx.y;
  if (o >= src.ncols) return;          // no weight there (its partials are never stored)
  const int kend = min(GemvQ<NW, F>::XK, src.klen - kx);
  const int n = src.n0 + o;
  const int w0 = sub * GemvQ<NW, F>::XK;   // the sub-stage's first k within the stage's weight tile
  int kb_held = -1;
  float sc[NW];
#pragma unroll
  for (int i = 0; i < NW; ++i) sc[i] = 0.0f;
  for (int j = lane; j < kend; j += GEMM_LANES) {
#ifdef CONTROL_CHUNK_ORDER
    const int kk = (j ^ 16) < kend ? (j ^ 16) : j;
#else
    const int kk = j;
#endif
    const int k = kx + kk, wk = w0 + kk;
    float wv[NW];
    if (F == GEMV_FP8) {
      const int kb = k / src.w[0].bk;
      if (kb != kb_held) {             // a new k block: its scale, once
        kb_held = kb;
#pragma unroll
        for (int i = 0; i < NW; ++i) {
          const int sn = (src.N + src.w[i].bn - 1) / src.w[i].bn, sk = (src.K + src.w[i].bk - 1) / src.w[i].bk;
          sc[i] = src.w[i].fs[dq_fp8_scale_at(src.e, n / src.w[i].bn, kb, sn, sk)];
        }
      }
#pragma unroll
      for (int i = 0; i < NW; ++i) {
        const float q = dq_e4m3(sh.tile.w[i][o][wk]);
        wv[i] = q * sc[i];
      }
    } else {
#pragma unroll
      for (int i = 0; i < NW; ++i) {
        const unsigned int code = dq_nvfp4_code(sh.tile.w[i][o][wk >> 1], k);
        const float q = dq_e2m1(code) * dq_e4m3(sh.tile.s[i][o][wk >> 4]);
        wv[i] = q * src.s2[i];
      }
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < src.nrows) {
        const float xv = GemvXf<NR>::on ? sh.tile.xf[r][kk] : gemv_bf(sh.tile.x[r][kk]);
#pragma unroll
        for (int i = 0; i < NW; ++i) {
          const float p = xv * wv[i];
          acc[i][r] = acc[i][r] + p;
        }
      }
    }
  }
}

// As gemv_rows_nr (row bucket NR >= nrows): every thread takes part (barriers); rows [0, NR) go to sh.part.
template <int NW, int F, int NR>
static __device__ __forceinline__ void gemv_q_rows_nr(GemvQShared<NW, F>& sh, const GemvQSrc<NW>& src) {
  float acc[NW][NR];
#pragma unroll
  for (int i = 0; i < NW; ++i)
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[i][r] = 0.0f;
  GemvQStage<NW, F> s;
  gemv_q_fetch(s, src, 0);
  for (int k0 = 0; k0 < src.klen; k0 += GemvQ<NW, F>::TK) {
    __syncthreads();                   // the previous stage (or fold) is done with shared memory
    gemv_q_stash(s, sh, src, k0);
    if (k0 + GemvQ<NW, F>::TK < src.klen) gemv_q_fetch(s, src, k0 + GemvQ<NW, F>::TK);   // in flight meanwhile
#pragma unroll 1
    for (int sub = 0; sub < GemvQ<NW, F>::SUBS; ++sub) {
      const int kx = k0 + sub * GemvQ<NW, F>::XK;
      if (kx >= src.klen) break;       // uniform across the block
      if (sub > 0) __syncthreads();    // the previous sub-stage is done with the x tile
      gemv_q_x<NW, F, NR>(sh, src, kx);
      __syncthreads();                 // the stage's weights and the sub-stage's x are in shared memory
      gemv_q_sum<NW, F, NR>(sh, acc, src, kx, sub);
    }
  }
  __syncthreads();                     // every thread has summed its last stage: the tiles may be overwritten
#pragma unroll
  for (int i = 0; i < NW; ++i)
#pragma unroll
    for (int r = 0; r < NR; ++r) sh.part[i][threadIdx.y][r][threadIdx.x] = acc[i][r];
  __syncthreads();
}

// The block's rows (src.nrows <= GEMV_ROWS) in their row bucket (gemv_bucket, block-uniform); the caller reads
// sh.part[i][o][r] (row r < nrows) after it returns.
template <int NW, int F>
static __device__ __forceinline__ void gemv_q_rows(GemvQShared<NW, F>& sh, const GemvQSrc<NW>& src) {
  switch (gemv_bucket(src.nrows)) {
    case 1: gemv_q_rows_nr<NW, F, 1>(sh, src); break;
    case 2: gemv_q_rows_nr<NW, F, 2>(sh, src); break;
    case 4: gemv_q_rows_nr<NW, F, 4>(sh, src); break;
    case 8: gemv_q_rows_nr<NW, F, 8>(sh, src); break;
    default: gemv_q_rows_nr<NW, F, GEMV_ROWS>(sh, src); break;
  }
}

// A block's source: columns from n0 of expert e of each weight (ncols = 0: an expert id outside [0, E)).
template <int NW, int F>
static __device__ __forceinline__ void gemv_q_src(GemvQSrc<NW>& src, const GemvQw (&w)[NW], long long e, int n0,
                                                  int ncols, int N, int K, const __nv_bfloat16* x) {
  const long long rb = gemv_q_row_bytes<F>(K);
  bool wvec = rb % 16 == 0;
#if defined(CONTROL_SCALE_NEXT_BLOCK) || defined(CONTROL_SCALE_TRANSPOSED)
  bool svec = false;                   // the controls index each scale through dequant.cuh
#else
  bool svec = F == GEMV_NVFP4 && (K / 16) % 16 == 0;
#endif
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    src.w[i] = w[i];
    src.w[i].v = w[i].v + (e * N + n0) * rb;
    src.s2[i] = F == GEMV_NVFP4 && ncols > 0 ? w[i].s2[e] : 0.0f;
    wvec = wvec && ((((unsigned long long)w[i].v) & 15ull) == 0);
    svec = svec && ((((unsigned long long)w[i].ns) & 15ull) == 0);
  }
  src.e = e;
  src.n0 = n0;
  src.ncols = ncols;
  src.N = N;
  src.K = K;
  src.klen = ncols > 0 ? K : 0;
  src.xvec = gemv_aligned(x, x, K);
  src.wvec = wvec;
  src.svec = svec;
}
