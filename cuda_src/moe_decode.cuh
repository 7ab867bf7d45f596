// moe_decode.cuh -- the parts of moe_decode.cu's kernels that do not depend on how the experts are stored: the
// routing prologue of the gate/up launch, the gathered x reader, the quantised experts' block bodies (gemv_q.cu's
// grouped and dense forms, run inside the fused launches) and the down launch's ticketed combine.
#pragma once
#include "common.cuh"
#include "gemv_tc.cuh"
#include "gemv_q_block.cuh"
#include "moe_combine.cuh"
#include "moe_route.cuh"

#define MOE_ROUTE_FLOATS (2 * GEMV_OUTS * GEMV_ROWS * 17)   // ops_moe_decode.ROUTE_FLOATS: fixes MOE_ROUTE_MAX_E
#define MOE_ROUTE_WARPS 8                 // warps of a (16, GEMV_OUTS) block, each routing rows in turn
#define MOE_ROUTE_MAX_E ((MOE_ROUTE_FLOATS - 1 - SORT_THREADS) / (2 * MOE_ROUTE_WARPS + 1))

// The routing scratch (the warps' scores, then the sort's counts) lives where the GEMV's tiles later do.
union MoeUpShared {
  GemvTcShared<2> gemv;
  float route[MOE_ROUTE_FLOATS];          // [MOE_ROUTE_WARPS, 2, E] f32 scores, then (E + 1 + SORT_THREADS) i32
};

// The x reader of the experts' GEMV: block row c is x's row rows[c] (the pair's token row, moe_sort's src).
struct GemvXRows {
  const __nv_bfloat16* x;                 // [T, K] bf16 token rows
  const int* rows;                        // [nrows] i32 token rows (shared memory)
  int K;
  bool vec;
  __device__ __forceinline__ const __nv_bfloat16* row(int c) const {
#ifdef CONTROL_MOE_ROWS                   // planted: the pairs' rows read in place, not through src
    return x + (long long)c * K;
#else
    return x + (long long)rows[c] * K;
#endif
  }
  __device__ __forceinline__ uint4 load8(int c, int kk, int valid) const { return gemv_load8(row(c) + kk, valid, vec); }
};

// Routes and sorts all T rows in shared memory (every block holds the same pairs: pairs [6, T * k] i32 ids,
// weights, order, group, src, pos); block (0, 0) writes ids, weights, group and pos and zeroes the tickets.
// run[0..2) becomes this block's run of equal experts in sorted order (the blockIdx.y-th; empty: none).
static __device__ __forceinline__ void moe_route_block(MoeUpShared& sh, int* pairs, int* run, const float* logits,
                                                       const float* bias, int* ids, float* weights, int* group,
                                                       int* pos, unsigned int* tickets, int tiles, int T, int E,
                                                       int k, float scale) {
  const int P = T * k;
  int* p_ids = pairs;
  float* p_w = reinterpret_cast<float*>(pairs + P);
  int* p_group = pairs + 3 * P;
  const int tid = threadIdx.y * 16 + threadIdx.x, warp = tid >> 5;
  float* score = sh.route + (long long)warp * 2 * E;
  for (int t = warp; t < T; t += MOE_ROUTE_WARPS)     // warp-uniform
    moe_route_token(logits, bias, p_ids, p_w, t, E, k, scale, score, tid & 31);
  __syncthreads();                                    // every pair's expert id is in shared memory
  moe_sort_block(p_ids, pairs + 2 * P, p_group, pairs + 4 * P, pairs + 5 * P, P, E, k,
                 reinterpret_cast<int*>(sh.route + 2 * MOE_ROUTE_WARPS * E), tid, 256);
  if (blockIdx.x == 0 && blockIdx.y == 0) {
    for (int p = tid; p < P; p += 256) {
      ids[p] = p_ids[p];
      weights[p] = p_w[p];
      group[p] = p_group[p];
      pos[p] = pairs[5 * P + p];
    }
    for (int b = tid; b < tiles; b += 256) tickets[b] = 0u;
  }
  if (tid == 0) {                                     // the blockIdx.y-th run of equal experts, or none
    int lo = P, hi = P, r = -1;
    for (int m = 0; m < P && hi == P; ++m) {
      const bool start = m == 0 || p_group[m] != p_group[m - 1];
      if (start && ++r == (int)blockIdx.y) lo = m;
      else if (start && r > (int)blockIdx.y) hi = m;
    }
    run[0] = lo;
    run[1] = hi;
  }
  __syncthreads();
}

// gemv_q.cu's grouped body (gemv_grouped_{fmt}_lane16, fp32) in a caller's shared memory: the run of rows of
// equal expert id starting at blockIdx.y (other blocks leave at once); an id outside [0, E) gives NaN rows.
template <int F>
static __device__ __forceinline__ void moe_q_grouped_run(const __nv_bfloat16* x, const GemvQw& wq, const int* group,
                                                         float* y, int M, int N, int K, int E,
                                                         GemvTcShared<1>& sh) {
  const int m = blockIdx.y, g = group[m];
  if (m > 0 && group[m - 1] == g) return;            // not the start of a run: the whole block leaves together
  int end = m + 1;
  while (end < M && group[end] == g) ++end;
  const bool valid = g >= 0 && g < E;
  const int n0 = blockIdx.x * GEMV_OUTS;
  const GemvQw w[1] = {wq};
  GemvQSrc<1> src;
  gemv_q_src<1, F>(src, w, valid ? g : 0, n0, valid ? min(GEMV_OUTS, N - n0) : 0, N, K, x);
  for (int m0 = m; m0 < end; m0 += GEMV_ROWS) gemv_q_group<F>(sh, src, x, y, N, K, m0, min(GEMV_ROWS, end - m0), valid);
}

// gemv_q.cu's dense body (gemv_{fmt}_lane16, fp32) for row group gi of M rows, column block blockIdx.x.
template <int F>
static __device__ __forceinline__ void moe_q_dense_group(const __nv_bfloat16* x, const GemvQw& wq, float* y, int M,
                                                         int N, int K, int gi, GemvTcShared<1>& sh) {
  const int n0 = blockIdx.x * GEMV_OUTS, m0 = gi * GEMV_ROWS;
  const GemvQw w[1] = {wq};
  GemvQSrc<1> src;
  gemv_q_src<1, F>(src, w, 0, n0, min(GEMV_OUTS, N - n0), N, K, x);
  gemv_q_group<F>(sh, src, x, y, N, K, m0, min(GEMV_ROWS, M - m0), true);
}

// After a block's outputs: the block that finishes column tile blockIdx.x last (tickets, zero at launch) combines
// the tile in slot order from the finished ys and y2.  Every thread calls it; last is the kernel's shared flag.
static __device__ __forceinline__ void moe_combine_tile(const float* ys, const float* y2, const int* pos,
                                                        const float* weights, unsigned int* tickets, int T, int k,
                                                        int N, float* out, int& last) {
  __threadfence();                                    // this thread's outputs are visible before the ticket
  __syncthreads();
  const int tid = threadIdx.y * 16 + threadIdx.x;
#ifdef CONTROL_MOE_FIRST_DONE             // planted: the tile's first block combines (before the others finish)
  if (tid == 0) last = atomicAdd(&tickets[blockIdx.x], 1u) == 0u;
#else
  if (tid == 0) last = atomicAdd(&tickets[blockIdx.x], 1u) == gridDim.y - 1;
#endif
  __syncthreads();
  if (!last) return;                                  // block-uniform
  __threadfence();
  const volatile float* yv = ys;
  const volatile float* sv = y2;
  const int n0 = blockIdx.x * GEMV_OUTS;
  for (int i = tid; i < T * GEMV_OUTS; i += 256) {
    const int t = i / GEMV_OUTS, n = n0 + i % GEMV_OUTS;
    if (n < N) out[(long long)t * N + n] = moe_combine_at(yv, pos, weights, sv, T, k, N, t, n);
  }
}
