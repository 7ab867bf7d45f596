// gemv.cu -- the decode/verify GEMM (DESIGN §3b): y[h, m, n] = sum_k x[h, m, k] * w[h, n, k] for the leading
// `rows` rows of a call, the rows whose role is decode or verify (at most GEMV_ROWS per block), streaming each
// bf16 weight from memory once per call for all of them.  gemv_grouped_lane16 (at the end) is the MoE form:
// y[m, n] = sum_k x[m, k] * w[group[m], n, k], a weight slice read once per run of rows of one expert.
//
// Same bits as gemm.cu (lane-16 order, cupyglm/backend/lanes.py): term k goes to lane k % 16, each lane adds
// its terms in increasing k from +0.0, the lanes fold i += i+8, +4, +2, +1.  Only the way the weights reach
// the threads differs: a stage of GEMV_TK k values of GEMV_OUTS columns (and of the block's x rows) is read with
// 16-byte loads, coalesced along k, into shared memory; thread (lane, o) then reads back exactly its lane's
// terms k = lane, lane + 16, ... of column o, in increasing k, so the 16-byte load never reorders a lane's sum.
// The loads of stage s + 1 are issued into registers before stage s is summed (GEMV_VECS weight and x loads in
// flight per thread).  The grid splits N (and rows, heads) only, never K.
//
// Launch: block (16, GEMV_OUTS) = 256 threads; grid (ceil(N / GEMV_OUTS), ceil(rows / GEMV_ROWS), H).
// Grouped: grid (ceil(N / GEMV_OUTS), M): block y = m works only if row m starts a run of equal expert ids
// (m = 0 or group[m - 1] != group[m]); it takes the run GEMV_ROWS rows at a time.
#include "common.cuh"
#include "gemm_tile.cuh"

#define GEMV_OUTS 16                   // output columns per block (threadIdx.y)
#define GEMV_ROWS 16                   // rows per block: a call's decode/verify rows of one block
#define GEMV_TK 512                    // k values per stage (per column and per row)
#define GEMV_CHUNKS (GEMV_TK / 8)      // 16-byte chunks (8 bf16) per column per stage
#define GEMV_VECS (GEMV_OUTS * GEMV_CHUNKS / 256)   // 16-byte weight loads per thread per stage (4)
#define GEMV_PITCH (GEMV_TK + 16)      // shared row pitch in bf16: columns o and o+1 of a warp on other banks

// Shared memory: a stage's tiles while summing, then (after a barrier) the lane partials for the fold.
union GemvShared {
  struct {
    unsigned short w[GEMV_OUTS][GEMV_PITCH];  // [columns, k of the stage] bf16 bit patterns
    unsigned short x[GEMV_ROWS][GEMV_PITCH];  // [rows, k of the stage] bf16 bit patterns
  } tile;
  float part[GEMV_OUTS][GEMV_ROWS][GEMM_LANES + 1];   // [column, row, lane] fp32 lane partials
};

// What one block reads: column n0's weight row w (the next columns follow at stride K; ncols of them lie inside
// N), row m0 of x (nrows rows at stride K); vec: 16-byte loads are aligned.
struct GemvSrc {
  const __nv_bfloat16* w;
  const __nv_bfloat16* x;
  int ncols, nrows, K;
  bool vec;
};

// 8 bf16 values at p[0..8) of which `valid` (0..8) lie inside the row; the rest read as +0.0 (never summed).
// `vec`: p is 16-byte aligned and valid == 8 whenever valid > 0, so one 16-byte load does.
// The weight load: a quantised weight (dequant.cuh) plugs in here, unpacking to the same bf16 values in
// registers; nothing after this load depends on how the weight is stored.
static __device__ __forceinline__ uint4 gemv_load8(const __nv_bfloat16* p, int valid, bool vec) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (valid <= 0) return v;
  if (vec) return *reinterpret_cast<const uint4*>(p);
  unsigned short h[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = i < valid ? __bfloat16_as_ushort(p[i]) : (unsigned short)0;
  v.x = h[0] | ((unsigned)h[1] << 16);
  v.y = h[2] | ((unsigned)h[3] << 16);
  v.z = h[4] | ((unsigned)h[5] << 16);
  v.w = h[6] | ((unsigned)h[7] << 16);
  return v;
}

// The registers holding one stage on its way to shared memory: thread t takes chunks t, t + 256, ... of the
// [GEMV_OUTS or GEMV_ROWS, GEMV_CHUNKS] chunk grid, i.e. column (row) t / GEMV_CHUNKS + 4 q, chunk t % GEMV_CHUNKS.
struct GemvStage {
  uint4 w[GEMV_VECS];
  uint4 x[GEMV_VECS];
};

static __device__ __forceinline__ void gemv_fetch(GemvStage& s, const GemvSrc& src, int k0) {
  const int t = threadIdx.y * 16 + threadIdx.x;
  const int kk = k0 + 8 * (t % GEMV_CHUNKS);
  const int valid = min(8, src.K - kk);
#pragma unroll
  for (int q = 0; q < GEMV_VECS; ++q) {
    const int c = t / GEMV_CHUNKS + (256 / GEMV_CHUNKS) * q;
    s.w[q] = c < src.ncols ? gemv_load8(src.w + (long long)c * src.K + kk, valid, src.vec) : make_uint4(0u, 0u, 0u, 0u);
    s.x[q] = c < src.nrows ? gemv_load8(src.x + (long long)c * src.K + kk, valid, src.vec) : make_uint4(0u, 0u, 0u, 0u);
  }
}

static __device__ __forceinline__ void gemv_stash(const GemvStage& s, GemvShared& sh) {
  const int t = threadIdx.y * 16 + threadIdx.x;
  const int kk = 8 * (t % GEMV_CHUNKS);
#pragma unroll
  for (int q = 0; q < GEMV_VECS; ++q) {
    const int c = t / GEMV_CHUNKS + (256 / GEMV_CHUNKS) * q;
    *reinterpret_cast<uint4*>(&sh.tile.w[c][kk]) = s.w[q];
    *reinterpret_cast<uint4*>(&sh.tile.x[c][kk]) = s.x[q];
  }
}

// Lane `lane` of column o: terms k0 + lane, k0 + lane + 16, ... (< K) of the stage, in increasing k, per row.
static __device__ __forceinline__ void gemv_sum(const GemvShared& sh, float* acc, int nrows, int K, int k0) {
  const int lane = threadIdx.x, o = threadIdx.y;
  const int kend = min(GEMV_TK, K - k0);
  for (int kk = lane; kk < kend; kk += GEMM_LANES) {
    const float wv = __bfloat162float(__ushort_as_bfloat16(sh.tile.w[o][kk]));
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) {
      if (r < nrows) {
        const float p = __bfloat162float(__ushort_as_bfloat16(sh.tile.x[r][kk])) * wv;
        acc[r] = acc[r] + p;
      }
    }
  }
}

// One block's rows against its columns: the lane partials of every (row, column) in acc, summed over all K.
// Every thread of the block takes part (barriers).
static __device__ __forceinline__ void gemv_rows(GemvShared& sh, const GemvSrc& src, float* acc) {
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; ++r) acc[r] = 0.0f;
  GemvStage s;
  gemv_fetch(s, src, 0);
  for (int k0 = 0; k0 < src.K; k0 += GEMV_TK) {
    __syncthreads();                   // the previous stage (or fold) is done with shared memory
    gemv_stash(s, sh);
    __syncthreads();
    if (k0 + GEMV_TK < src.K) gemv_fetch(s, src, k0 + GEMV_TK);   // in flight while this stage is summed
    gemv_sum(sh, acc, src.nrows, src.K, k0);
  }
}

static __device__ __forceinline__ void gemv_store(float* y, long long i, float v) { y[i] = v; }
static __device__ __forceinline__ void gemv_store(__nv_bfloat16* y, long long i, float v) { y[i] = to_bf16(v); }

// The lane partials of each (row, column) through shared memory, folded by one thread in the butterfly order.
template <typename Out>
static __device__ __forceinline__ void gemv_fold_store(GemvShared& sh, const float* acc,
                                                       Out* yr0, int nrows, int N, int n, bool nan_out) {
  const int lane = threadIdx.x, o = threadIdx.y;
  __syncthreads();                     // every thread has summed its last stage: the tiles may be overwritten
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; ++r) sh.part[o][r][lane] = acc[r];
  __syncthreads();
  if (n < N && lane < nrows) gemv_store(yr0, (long long)lane * N + n, nan_out ? NAN : gemm_fold16(sh.part[o][lane]));
}

static __device__ __forceinline__ bool gemv_aligned(const void* a, const void* b, int K) {
  return (K % 8) == 0 && ((((unsigned long long)a) | ((unsigned long long)b)) & 15ull) == 0;
}

template <typename Out>
static __device__ __forceinline__ void gemv_body(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    Out* __restrict__ y,                   // [H, M, N] fp32 or bf16
    int M, int N, int K, int rows) {
  __shared__ __align__(16) GemvShared sh;
  const int n0 = blockIdx.x * GEMV_OUTS;
  const int m0 = blockIdx.y * GEMV_ROWS;
  const long long h = blockIdx.z;
  GemvSrc src;
  src.w = w + (h * N + n0) * (long long)K;
  src.x = x + (h * M + m0) * (long long)K;
  src.ncols = min(GEMV_OUTS, N - n0);
  src.nrows = min(GEMV_ROWS, rows - m0);
  src.K = K;
  src.vec = gemv_aligned(x, w, K);
  float acc[GEMV_ROWS];
  gemv_rows(sh, src, acc);
  gemv_fold_store(sh, acc, y + (h * M + m0) * (long long)N, src.nrows, N, n0 + threadIdx.y, false);
}

extern "C" __global__ void __launch_bounds__(256) gemv_lane16(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    float* __restrict__ y,                 // [H, M, N] f32: rows [0, rows) of each head written
    int M, int N, int K, int rows) {       // rows <= M: the call's leading decode/verify rows
  gemv_body(x, w, y, M, N, K, rows);
}

extern "C" __global__ void __launch_bounds__(256) gemv_lane16_bf16(
    const __nv_bfloat16* __restrict__ x,   // [H, M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [H, N, K] bf16
    __nv_bfloat16* __restrict__ y,         // [H, M, N] bf16 (the fp32 sum rounded once): rows [0, rows)
    int M, int N, int K, int rows) {
  gemv_body(x, w, y, M, N, K, rows);
}

// Grouped: row m against expert group[m]'s [N, K] slice; an id outside [0, E) reads nothing and gets NaN.
template <typename Out>
static __device__ __forceinline__ void gemv_grouped_body(
    const __nv_bfloat16* __restrict__ x,   // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,   // [E, N, K] bf16
    const int* __restrict__ group,         // [M] int32: expert id of each row
    Out* __restrict__ y,                   // [M, N] fp32 or bf16
    int M, int N, int K, int E) {
  __shared__ __align__(16) GemvShared sh;
  const int m = blockIdx.y;
  const int g = group[m];
  if (m > 0 && group[m - 1] == g) return;          // not the start of a run: the whole block leaves together
  int end = m + 1;
  while (end < M && group[end] == g) ++end;
  const bool valid = g >= 0 && g < E;
  const int n0 = blockIdx.x * GEMV_OUTS;
  GemvSrc src;
  src.w = w + ((long long)(valid ? g : 0) * N + n0) * K;
  src.ncols = valid ? min(GEMV_OUTS, N - n0) : 0;
  src.K = valid ? K : 0;
  src.vec = gemv_aligned(x, w, K);
  for (int m0 = m; m0 < end; m0 += GEMV_ROWS) {
    src.x = x + (long long)m0 * K;
    src.nrows = valid ? min(GEMV_ROWS, end - m0) : 0;
    float acc[GEMV_ROWS];
    gemv_rows(sh, src, acc);
    gemv_fold_store(sh, acc, y + (long long)m0 * N, min(GEMV_ROWS, end - m0), N, n0 + threadIdx.y, !valid);
  }
}

extern "C" __global__ void __launch_bounds__(256) gemv_grouped_lane16(
    const __nv_bfloat16* __restrict__ x,     // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,     // [E, N, K] bf16
    const int* __restrict__ group,           // [M] int32: expert id of each row (sorted: each slice read once)
    float* __restrict__ y,                   // [M, N] f32
    int M, int N, int K, int E) {
  gemv_grouped_body(x, w, group, y, M, N, K, E);
}

extern "C" __global__ void __launch_bounds__(256) gemv_grouped_lane16_bf16(
    const __nv_bfloat16* __restrict__ x,     // [M, K] bf16
    const __nv_bfloat16* __restrict__ w,     // [E, N, K] bf16
    const int* __restrict__ group,           // [M] int32
    __nv_bfloat16* __restrict__ y,           // [M, N] bf16 (the fp32 sum rounded once)
    int M, int N, int K, int E) {
  gemv_grouped_body(x, w, group, y, M, N, K, E);
}
