// gemv_tile.cuh -- the lane-16 weight-streaming GEMV (kda_step.cu's low-rank factors) and the pieces every decode
// GEMV shares (GemvSrc, gemv_load8, the x readers, GEMV_ROWS / GEMV_OUTS; the decode GEMVs sum in gemv_tc.cuh and
// gemv_q_tc.cuh): one block sums up to GEMV_ROWS rows
// against GEMV_OUTS columns of NW weights (1, or 2 for gate and up) over all of K.
//
// The lane-16 order (cupyglm/backend/lanes.py): term k goes to lane k % 16, each lane adds its
// terms in increasing k from +0.0, the lanes fold i += i+8, +4, +2, +1 (gemm_tile.cuh).  Only the way the values
// reach the threads differs: a stage of TK k values of the block's columns and rows is read with 16-byte loads,
// coalesced along k, into shared memory; thread (lane, o) then reads back exactly its lane's terms k = lane,
// lane + 16, ... of column o in increasing k, so the 16-byte load never reorders a lane's sum.  The loads of
// stage s + 1 are issued into registers before stage s is summed (VECS loads of each weight and of x in flight
// per thread).  Blocks split N (and rows, heads) only, never K.  Block: (16, GEMV_OUTS) = 256 threads.
//
// Row buckets: a block's rows (at most GEMV_ROWS) run in the smallest of 1, 2, 4, 8, 16 row slots holding them,
// one template instance each (gemv_rows dispatches, block-uniformly), so accumulators, x staging and partials cover
// only the bucket's slots; a row's terms, order and fold do not depend on the bucket, so neither do its bits.
//
// The x side of a stage comes from a reader (x row c's 8 bf16 values at k, packed as gemv_load8 packs them): GemvXMem
// loads them from memory; a prologue reader (gemv_norm.cu) computes them, e.g. a norm of the row, with the bits the
// separate norm kernel would have stored, so nothing after the reader depends on where the row came from.
#pragma once
#include "common.cuh"
#include "gemm_tile.cuh"
#include "check_flag.cuh"

#define GEMV_OUTS 16                   // output columns per block (threadIdx.y)
#define GEMV_ROWS 16                   // rows per block: a call's decode/verify rows of one block
#define GEMV_STAGE_BYTES 1024          // bytes of each column's weights (over all NW) per stage

template <int NW>
struct Gemv {
  static constexpr int TK = GEMV_STAGE_BYTES / 2 / NW;   // k values per stage: 512 (NW = 1), 256 (NW = 2)
  static constexpr int CHUNKS = TK / 8;                  // 16-byte chunks per column (row) per stage
  static constexpr int STEP = 256 / CHUNKS;              // columns (rows) one pass of the 256 threads covers
  static constexpr int VECS = GEMV_OUTS / STEP;          // 16-byte loads per thread per stage, per weight and x
  static constexpr int PITCH = TK + 16;                  // shared pitch (bf16): a warp's two columns on other banks
};

// Shared memory: a stage's tiles while summing, then (after a barrier) the lane partials for the fold.
template <int NW>
union GemvShared {
  struct {
    unsigned short w[NW][GEMV_OUTS][Gemv<NW>::PITCH];   // [weight, column, k of the stage] bf16 bit patterns
    union {
      unsigned short x[GEMV_ROWS][Gemv<NW>::PITCH];     // [row, k of the stage] bf16 bit patterns (bucket 16)
      float xf[GEMV_ROWS / 2][Gemv<NW>::PITCH];         // [row, k of the stage] the same values as fp32 (buckets <= 8)
    };
  } tile;
  float part[NW][GEMV_OUTS][GEMV_ROWS][GEMM_LANES + 1];  // [weight, column, row, lane] fp32 lane partials
};

// What one block reads: column n0's row of each weight w[i] (the next columns follow at stride K; ncols of them
// lie inside N) and row m0 of x (nrows rows at stride K); vec: 16-byte loads are aligned (K % 8 == 0).
template <int NW>
struct GemvSrc {
  const __nv_bfloat16* w[NW];
  const __nv_bfloat16* x;
  int ncols, nrows, K;
  bool vec;
};

// A grouped call's run of rows [m, end) whose expert id is outside [0, E): each row counted once (by the
// blocks of the first column block) into the launcher's guard slot (slot < 0: the ids were checked on the host).
static __device__ __forceinline__ void gemv_flag_run(unsigned int* flags, int slot, int m, int end) {
  if (slot < 0 || blockIdx.x != 0) return;
  for (int i = m + threadIdx.y * 16 + threadIdx.x; i < end; i += 256) check_flag(flags, slot, i);
}

static __device__ __forceinline__ bool gemv_aligned(const void* a, const void* b, int K) {
  return (K % 8) == 0 && ((((unsigned long long)a) | ((unsigned long long)b)) & 15ull) == 0;
}

// Whether a row bucket stages x as fp32 (converted once a stage, not once a column; the same value, exactly).
template <int NR>
struct GemvXf {
  static constexpr bool on = NR <= GEMV_ROWS / 2;
};

// A packed chunk of 8 bf16 values stored as 8 fp32 at p (16-byte aligned): the exact conversion of each.
static __device__ __forceinline__ void gemv_store_f32x8(float* p, uint4 v) {
  const unsigned u[4] = {v.x, v.y, v.z, v.w};
  float4 lo, hi;
  lo.x = __uint_as_float(u[0] << 16); lo.y = __uint_as_float(u[0] & 0xffff0000u);
  lo.z = __uint_as_float(u[1] << 16); lo.w = __uint_as_float(u[1] & 0xffff0000u);
  hi.x = __uint_as_float(u[2] << 16); hi.y = __uint_as_float(u[2] & 0xffff0000u);
  hi.z = __uint_as_float(u[3] << 16); hi.w = __uint_as_float(u[3] & 0xffff0000u);
  reinterpret_cast<float4*>(p)[0] = lo;
  reinterpret_cast<float4*>(p)[1] = hi;
}

// 8 bf16 bit patterns h[0..8) as one 16-byte chunk (element i at bits 16 (i % 2) of word i / 2).
static __device__ __forceinline__ uint4 gemv_pack8(const unsigned short* h) {
  return make_uint4(h[0] | ((unsigned)h[1] << 16), h[2] | ((unsigned)h[3] << 16), h[4] | ((unsigned)h[5] << 16),
                    h[6] | ((unsigned)h[7] << 16));
}

// The 8 bf16 bit patterns of a packed chunk, element i at h[i].
static __device__ __forceinline__ void gemv_unpack8(uint4 v, unsigned short* h) {
  const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    h[2 * i] = (unsigned short)(u[i] & 0xffffu);
    h[2 * i + 1] = (unsigned short)(u[i] >> 16);
  }
}

// 8 bf16 values at p[0..8) of which `valid` (0..8) lie inside the row; the rest read as +0.0 (never summed).
// `vec`: p is 16-byte aligned and valid == 8 whenever valid > 0, so one 16-byte load does.
// The weight load: a quantised weight (dequant.cuh) plugs in here, unpacking to the same bf16 values in
// registers; nothing after this load depends on how the weight is stored.
static __device__ __forceinline__ uint4 gemv_load8(const __nv_bfloat16* p, int valid, bool vec) {
  if (valid <= 0) return make_uint4(0u, 0u, 0u, 0u);
  if (vec) return *reinterpret_cast<const uint4*>(p);
  unsigned short h[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = i < valid ? __bfloat16_as_ushort(p[i]) : (unsigned short)0;
  return gemv_pack8(h);
}

// The plain x reader: row c (of the block's rows) read from memory at stride K; vec as GemvSrc's.
struct GemvXMem {
  const __nv_bfloat16* x;
  int K;
  bool vec;
  __device__ __forceinline__ uint4 load8(int c, int kk, int valid) const {
    return gemv_load8(x + (long long)c * K + kk, valid, vec);
  }
};

// One stage on its way to shared memory: thread t takes chunk t % CHUNKS of columns (rows) t / CHUNKS + STEP q;
// x rows only inside the row bucket NR (the rows past it are never read back).
template <int NW>
struct GemvStage {
  uint4 w[NW][Gemv<NW>::VECS];
  uint4 x[Gemv<NW>::VECS];
};

template <int NW, int NR, typename XR>
static __device__ __forceinline__ void gemv_fetch(GemvStage<NW>& s, const GemvSrc<NW>& src, const XR& xr, int k0) {
  typedef Gemv<NW> G;
  const int t = threadIdx.y * 16 + threadIdx.x;
  const int kk = k0 + 8 * (t % G::CHUNKS);
  const int valid = min(8, src.K - kk);
#pragma unroll
  for (int q = 0; q < G::VECS; ++q) {
    const int c = t / G::CHUNKS + G::STEP * q;
    const long long at = (long long)c * src.K + kk;
#pragma unroll
    for (int i = 0; i < NW; ++i)
      s.w[i][q] = c < src.ncols ? gemv_load8(src.w[i] + at, valid, src.vec) : make_uint4(0u, 0u, 0u, 0u);
    if (G::STEP * q < NR) s.x[q] = c < src.nrows ? xr.load8(c, kk, valid) : make_uint4(0u, 0u, 0u, 0u);
  }
}

template <int NW, int NR>
static __device__ __forceinline__ void gemv_stash(const GemvStage<NW>& s, GemvShared<NW>& sh) {
  typedef Gemv<NW> G;
  const int t = threadIdx.y * 16 + threadIdx.x;
  const int kk = 8 * (t % G::CHUNKS);
#pragma unroll
  for (int q = 0; q < G::VECS; ++q) {
    const int c = t / G::CHUNKS + G::STEP * q;
#pragma unroll
    for (int i = 0; i < NW; ++i) *reinterpret_cast<uint4*>(&sh.tile.w[i][c][kk]) = s.w[i][q];
    if (G::STEP * q < NR && c < NR) {
      if (GemvXf<NR>::on)
        gemv_store_f32x8(&sh.tile.xf[c][kk], s.x[q]);
      else
        *reinterpret_cast<uint4*>(&sh.tile.x[c][kk]) = s.x[q];
    }
  }
}

static __device__ __forceinline__ float gemv_bf(unsigned short b) { return __bfloat162float(__ushort_as_bfloat16(b)); }

// Lane `lane` of column o: terms k0 + lane, k0 + lane + 16, ... (< K) of the stage, in increasing k, per row of
// the NR slots (rows >= nrows skipped).  x is read from shared memory once per (term, row), the weight once per term.
template <int NW, int NR>
static __device__ __forceinline__ void gemv_sum(const GemvShared<NW>& sh, float (*acc)[NR], int nrows, int K,
                                                int k0) {
  const int lane = threadIdx.x, o = threadIdx.y;
  const int kend = min(Gemv<NW>::TK, K - k0);
  for (int j = lane; j < kend; j += GEMM_LANES) {
    const int kk = j;
    float wv[NW];
#pragma unroll
    for (int i = 0; i < NW; ++i) wv[i] = gemv_bf(sh.tile.w[i][o][kk]);
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < nrows) {
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

// One block's rows against its columns in the row bucket NR (nrows <= NR): lane partials of every (weight, row,
// column) in acc, summed over all K; then rows [0, NR) go to sh.part for the fold.  Every thread of the block takes
// part (barriers).  Each row's sums are the same operations in the same order whatever NR holds it.
template <int NW, int NR, typename XR>
static __device__ __forceinline__ void gemv_rows_nr(GemvShared<NW>& sh, const GemvSrc<NW>& src, const XR& xr) {
  float acc[NW][NR];
#pragma unroll
  for (int i = 0; i < NW; ++i)
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[i][r] = 0.0f;
  GemvStage<NW> s;
  gemv_fetch<NW, NR>(s, src, xr, 0);
  for (int k0 = 0; k0 < src.K; k0 += Gemv<NW>::TK) {
    __syncthreads();                   // the previous stage (or fold) is done with shared memory
    gemv_stash<NW, NR>(s, sh);
    __syncthreads();
    if (k0 + Gemv<NW>::TK < src.K) gemv_fetch<NW, NR>(s, src, xr, k0 + Gemv<NW>::TK);   // in flight meanwhile
    gemv_sum<NW, NR>(sh, acc, src.nrows, src.K, k0);
  }
  __syncthreads();                     // every thread has summed its last stage: the tiles may be overwritten
#pragma unroll
  for (int i = 0; i < NW; ++i)
#pragma unroll
    for (int r = 0; r < NR; ++r) sh.part[i][threadIdx.y][r][threadIdx.x] = acc[i][r];
  __syncthreads();
}

// The row bucket of nrows rows (block-uniform): the smallest of 1, 2, 4, 8, 16 holding them.  GEMV_BUCKET_ONLY
// (the speed model's compile): every call takes that one bucket, so a disassembly holds only its loop.
static __device__ __forceinline__ int gemv_bucket(int nrows) {
#ifdef GEMV_BUCKET_ONLY
  return GEMV_BUCKET_ONLY;
#else
  return nrows <= 1 ? 1 : nrows <= 2 ? 2 : nrows <= 4 ? 4 : nrows <= 8 ? 8 : 16;
#endif
}

// The block's rows (src.nrows <= GEMV_ROWS) in their row bucket: the caller reads sh.part[i][o][r] (the 16 lanes of
// row r < nrows, column o) after it returns.  xr: the x reader (src.x unused).
template <int NW, typename XR>
static __device__ __forceinline__ void gemv_rows(GemvShared<NW>& sh, const GemvSrc<NW>& src, const XR& xr) {
  switch (gemv_bucket(src.nrows)) {
    case 1: gemv_rows_nr<NW, 1>(sh, src, xr); break;
    case 2: gemv_rows_nr<NW, 2>(sh, src, xr); break;
    case 4: gemv_rows_nr<NW, 4>(sh, src, xr); break;
    case 8: gemv_rows_nr<NW, 8>(sh, src, xr); break;
    default: gemv_rows_nr<NW, GEMV_ROWS>(sh, src, xr); break;
  }
}

// The rows of x read from memory (src.x at stride K).
template <int NW>
static __device__ __forceinline__ void gemv_rows(GemvShared<NW>& sh, const GemvSrc<NW>& src) {
  const GemvXMem xr = {src.x, src.K, src.vec};
  gemv_rows(sh, src, xr);
}
