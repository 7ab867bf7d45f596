// gemm_tc_q_stage.cuh -- gemm_tc_q.cu's staged tile: a GTQ_M-row (128; -DGTQ_SMALL 64) by 128-column block of 8
// warps whose x rows and packed weights (NVFP4: and their group scale codes) of GTQ_SK k pass through shared memory
// (cp.async, two stages), so each loaded byte feeds every warp that needs it; a piece past K (a packed byte past a
// row, a group past K / 16) is zero, as the decode GEMV's loads give it.
#pragma once
#include "common.cuh"
#include "cp_async.cuh"
#include "gemv_q_tc.cuh"
#include "gemm_tc_stage.cuh"

#ifdef GTQ_SMALL                       // GPUs with 99 KB of shared memory a block: 64 rows (98 KB), the same bits
#define GTQ_M 64
#else
#define GTQ_M 128                      // rows a block
#define GTQ_VSH 1                      // FP8's slice sums in shared memory (a second GtqAcc)
#endif
#define GTQ_N 128                      // columns a block: 8 warps of 16
#define GTQ_RT (GTQ_M / 8)             // 8-row mma tiles a warp (the B operands)
#define GTQ_THREADS 256
#define GTQ_SK 128                     // k a stage: one NVFP4 block, four FP8 blocks; divides GTC_SLICE
#define GTQ_XC (GTQ_SK / 8)            // 16-byte x chunks a stage row
#define GTQ_WC (GTQ_SK / 16)           // 16-byte weight chunks a stage column (FP8; NVFP4 uses the first half)

// One stage: x rows and weight columns of GTQ_SK k, chunks placed by gtq_xat / gtq_wat (no bank conflicts in the
// lanes' 16-byte and 8-byte loads); NVFP4's group scale codes, 8 bytes a column.
struct GtqStage {
  uint4 x[GTQ_M * GTQ_XC];             // [GTQ_M][GTQ_XC] bf16 chunks
  uint4 w[GTQ_N * GTQ_WC];             // [GTQ_N][GTQ_WC] packed bytes
  unsigned s[GTQ_N * 2];               // NVFP4: [GTQ_N][8] e4m3 codes
};

// A thread's running sums of row tile r at float4 r GTQ_THREADS + threadIdx.x.
struct GtqAcc {
  float4 v[GTQ_RT * GTQ_THREADS];
};

static __device__ __forceinline__ int gtq_xat(int r, int c) {
  return r * GTQ_XC + (c ^ ((c >> 2) & 3) ^ ((r & 1) << 2));
}

template <int F>
static __device__ __forceinline__ int gtq_wat(int n, int c) {
  return n * GTQ_WC + (F == GEMV_FP8 ? c ^ ((n & 3) << 1) : c ^ ((n & 1) << 2));
}

// Where this thread's copies come from: x row chunks q of rows 16q + tid / 16 (chunk tid % 16), weight chunks of
// columns (256 q + tid) / wc (chunk tid % wc; wc = 8 FP8, 4 NVFP4), NVFP4 scale word tid % 2 of column tid / 2.
// Offsets are 32-bit, from the block's first row / column (x0, w0, s0; the launcher's limit on K): rows past M
// (columns past N) read row M - 1 (column N - 1) and are never stored.
struct GtqSrc {
  const __nv_bfloat16* x0;             // row m0: [.., K] bf16
  const unsigned char* w0;             // column n0 of expert e: [.., rb] packed bytes
  const unsigned char* s0;             // NVFP4: column n0's scale row: [.., K / 16] e4m3
  unsigned x[GTQ_M / 16], w[GTQ_WC / 2];
  unsigned s;
  int K, rb, scol;
};

template <int F>
static __device__ __forceinline__ void gtq_src(GtqSrc& s, const __nv_bfloat16* x, int m0, int n0, int M, int N,
                                               int K) {
  constexpr int WC = F == GEMV_FP8 ? GTQ_WC : GTQ_WC / 2;
  const int tid = threadIdx.x;
  s.K = K;
  s.rb = gq_row_bytes<F>(K);
  s.x0 = x + (long long)m0 * K;
#pragma unroll
  for (int q = 0; q < GTQ_M / 16; ++q) s.x[q] = (unsigned)min(16 * q + tid / GTQ_XC, M - 1 - m0) * (unsigned)K;
#pragma unroll
  for (int q = 0; q < WC / 2; ++q) s.w[q] = (unsigned)min((GTQ_THREADS * q + tid) / WC, N - 1 - n0) * (unsigned)s.rb;
  s.scol = min(tid / 2, N - 1 - n0);
  s.s = (unsigned)s.scol * (unsigned)(K / 16);
}

// 16 bytes of a packed row at byte b (valid bytes of the row left from b; those past it zero).  VEC: cp.async (the
// emulator: a plain copy), the row's bytes a multiple of 16.
template <bool VEC>
static __device__ __forceinline__ void gtq_copyw(uint4* dst, const unsigned char* row, int b, int valid) {
  if (!VEC) {                              // a word at a time (a loop: the rare path stays out of the hot loop)
#pragma unroll 1
    for (int j = 0; j < 4; ++j) {
      unsigned q = 0u;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (4 * j + i < valid) q |= (unsigned)row[b + 4 * j + i] << (8 * i);
      reinterpret_cast<unsigned*>(dst)[j] = q;
    }
    return;
  }
  const unsigned char* src = row + (valid > 0 ? b : 0);
  cp_async16(dst, src, valid > 0);
}

// NVFP4: the 4 group codes from gr of column n's scale row (those past K / 16 zero).  VEC: one 4-byte cp.async
// (K / 16 a multiple of 4); the controls' builds index each code through dequant.cuh.
template <bool VEC>
static __device__ __forceinline__ void gtq_copys(unsigned* dst, const unsigned char* row, const unsigned char* ns,
                                                 long long e, int n, int gr, int N, int K) {
  const int gk = K >> 4;
#if defined(CONTROL_SCALE_NEXT_BLOCK) || defined(CONTROL_SCALE_TRANSPOSED)
  unsigned v = 0u;
  for (int i = 0; i < 4; ++i)
    if (gr + i < gk) v |= (unsigned)ns[dq_nvfp4_scale_at(e, n, gr + i, N, K)] << (8 * i);
  *dst = v;
  (void)row;
#else
  (void)ns, (void)e, (void)n, (void)N;
  if (!VEC) {
    unsigned v = 0u;
    for (int i = 0; i < 4; ++i)
      if (gr + i < gk) v |= (unsigned)row[gr + i] << (8 * i);
    *dst = v;
    return;
  }
  const unsigned char* src = row + (gr < gk ? gr : 0);
  cp_async4(dst, src, gr < gk);
#endif
}

// Stage st (k from GTQ_SK st) into sh: this thread's chunks, one commit group.
template <int F, bool VEC>
static __device__ __forceinline__ void gtq_issue(GtqStage& sh, const GtqSrc& s, const unsigned char* ns,
                                                 long long e, int n0, int N, int st) {
  constexpr int WC = F == GEMV_FP8 ? GTQ_WC : GTQ_WC / 2;
  const int tid = threadIdx.x, k = GTQ_SK * st, cx = tid % GTQ_XC, cw = tid % WC;
  const int vx = s.K - k - 8 * cx, bw = (F == GEMV_FP8 ? k : k / 2) + 16 * cw;
#pragma unroll
  for (int q = 0; q < GTQ_M / 16; ++q)
    gts_copy<VEC>(sh.x + gtq_xat(16 * q + tid / GTQ_XC, cx), s.x0 + s.x[q] + (vx > 0 ? k + 8 * cx : 0), vx);
#pragma unroll
  for (int q = 0; q < WC / 2; ++q)
    gtq_copyw<VEC>(sh.w + gtq_wat<F>((GTQ_THREADS * q + tid) / WC, cw), s.w0 + s.w[q], bw, s.rb - bw);
  if (F == GEMV_NVFP4)
    gtq_copys<VEC>(sh.s + tid, s.s0 + s.s, ns, e, n0 + s.scol, k / 16 + 4 * (tid & 1), N, s.K);
  gts_commit();
}
