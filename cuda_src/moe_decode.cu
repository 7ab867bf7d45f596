// moe_decode.cu -- the routed experts of a MoE layer's decode/verify rows in two launches, after the one that
// gives the router logits and the shared expert's activation (gemv_multi.cu's gemv_multi_swiglu_lane16):
//   moe_route_swiglu_lane16: routing, the pair sort and the experts' gate/up + SwiGLU (NumpyOps.moe_route_sort,
//     then gemm_grouped_swiglu of x[src]);
//   moe_down_combine_lane16: the experts' and the shared expert's down projections and the weighted combine
//     (NumpyOps.gemm_grouped_dense, then moe_combine with pos).
// Invariants (why the bits are those of the separate ops):
// * Every block of moe_route_swiglu_lane16 routes and sorts all T rows itself in shared memory with the device
//   code of moe_route_sort (moe_route.cuh), so all blocks hold the same pairs; block (0, 0) alone writes ids,
//   weights, group and pos for the down kernel and zeroes its tickets.  Routing always picks ids in [0, E): no guard.
// * Block y of moe_route_swiglu_lane16 takes the y-th run of equal experts in sorted order (grid.y = min(T * k, E)
//   runs at most); its rows read x through src (GemvXRows), the same values as the gathered copy x[src].
// * The GEMV bodies are gemv_tc.cuh's / gemv_grouped.cuh's (the tensor core's decode order, each expert slice read
//   once per run).
// * The combine of column tile b runs in the block that finishes tile b last (a ticket counter per tile,
//   __threadfence before the ticket and volatile reads after it); it reads only finished outputs and sums in slot
//   order (moe_combine.cuh), so the bits do not depend on which block is last.
//
// Launch: block (16, GEMV_OUTS).  moe_route_swiglu_lane16: grid (ceil(N / GEMV_OUTS), min(T * k, E)), dynamic
// shared memory 6 * T * k ints, E <= MOE_ROUTE_MAX_E.  moe_down_combine_lane16: grid (ceil(N / GEMV_OUTS),
// T * k + ceil(T / GEMV_ROWS)): block y < T * k is pair y's run (gemv_grouped_run), the rest the shared expert's
// row groups; tickets [ceil(N / GEMV_OUTS)] zero at launch.
#include "common.cuh"
#include "gemv_tc.cuh"
#include "gemv_grouped.cuh"
#include "moe_combine.cuh"
#include "moe_route.cuh"
#include "swiglu.cuh"

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
  __device__ __forceinline__ uint4 load8(int c, int kk, int valid) const {
#ifdef CONTROL_MOE_ROWS                   // planted: the pairs' rows read in place, not through src
    return gemv_load8(x + (long long)c * K + kk, valid, vec);
#else
    return gemv_load8(x + (long long)rows[c] * K + kk, valid, vec);
#endif
  }
};

extern "C" __global__ void __launch_bounds__(256) moe_route_swiglu_lane16(
    const float* __restrict__ logits,      // [T, E] f32 router logits
    const float* __restrict__ bias,        // [E] fp32 (stored F32) correction bias
    const __nv_bfloat16* __restrict__ x,   // [T, K] bf16 the decode/verify rows
    const __nv_bfloat16* __restrict__ wg,  // [E, N, K] bf16 experts' gate_proj
    const __nv_bfloat16* __restrict__ wu,  // [E, N, K] bf16 experts' up_proj
    __nv_bfloat16* __restrict__ y,         // [T * k, N] bf16 activation of the expert-sorted pairs
    int* __restrict__ ids,                 // [T, k] i32 experts in pick order
    float* __restrict__ weights,           // [T, k] f32
    int* __restrict__ group,               // [T * k] i32 expert of each sorted pair
    int* __restrict__ pos,                 // [T * k] i32 sorted position of each pair
    unsigned int* __restrict__ tickets,    // [tiles] u32 set to 0 for moe_down_combine_lane16
    int tiles, int T, int E, int k, float scale, int N, int K, int has_limit, float limit) {
  __shared__ __align__(16) MoeUpShared sh;
  __shared__ int run[2];                  // this block's run [run[0], run[1]) of sorted pairs
  extern __shared__ int moe_pairs[];      // [6, T * k] i32: ids, weights (f32), order, group, src, pos
  const int P = T * k;
  int* p_ids = moe_pairs;
  float* p_w = reinterpret_cast<float*>(moe_pairs + P);
  int* p_order = moe_pairs + 2 * P;
  int* p_group = moe_pairs + 3 * P;
  int* p_src = moe_pairs + 4 * P;
  int* p_pos = moe_pairs + 5 * P;
  const int tid = threadIdx.y * 16 + threadIdx.x, warp = tid >> 5;
  float* score = sh.route + (long long)warp * 2 * E;
  for (int t = warp; t < T; t += MOE_ROUTE_WARPS)     // warp-uniform
    moe_route_token(logits, bias, p_ids, p_w, t, E, k, scale, score, tid & 31);
  __syncthreads();                                    // every pair's expert id is in shared memory
  moe_sort_block(p_ids, p_order, p_group, p_src, p_pos, P, E, k,
                 reinterpret_cast<int*>(sh.route + 2 * MOE_ROUTE_WARPS * E), tid, 256);
  if (blockIdx.x == 0 && blockIdx.y == 0) {
    for (int p = tid; p < P; p += 256) {
      ids[p] = p_ids[p];
      weights[p] = p_w[p];
      group[p] = p_group[p];
      pos[p] = p_pos[p];
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
  const int lo = run[0], hi = run[1];
  if (lo >= hi) return;                               // fewer runs than blocks: the whole block leaves together
  const int g = p_group[lo];
  const int n0 = blockIdx.x * GEMV_OUTS, lane = threadIdx.x, o = threadIdx.y, n = n0 + o;
  const long long at = ((long long)g * N + n0) * K;
  GemvSrc<2> src;
  src.w[0] = wg + at;
  src.w[1] = wu + at;
  src.x = x;
  src.ncols = min(GEMV_OUTS, N - n0);
  src.K = K;
  src.vec = gemv_aligned(x, wg, K) && gemv_aligned(wu, wu, K);
  GemvXRows xr = {x, p_src, K, src.vec};
  for (int m0 = lo; m0 < hi; m0 += GEMV_ROWS) {
    xr.rows = p_src + m0;
    src.nrows = min(GEMV_ROWS, hi - m0);
    float v[2];
    gemv_tc_rows(sh.gemv, src, xr, v);
    if (n < N && lane < src.nrows) {
      const float gv = bf16_round(v[0]);
      const float uv = bf16_round(v[1]);
      y[(long long)(m0 + lane) * N + n] = to_bf16(swiglu_f32(gv, uv, has_limit, limit));
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) moe_down_combine_lane16(
    const __nv_bfloat16* __restrict__ a,   // [P, K] bf16 the sorted pairs' activation, P = T * k
    const __nv_bfloat16* __restrict__ w,   // [E, N, K] bf16 experts' down_proj
    const int* __restrict__ group,         // [P] i32 expert of each sorted pair
    float* ys,                             // [P, N] f32 the pairs' outputs (read back by the tile's last block)
    int P, int N, int K, int E,
    const __nv_bfloat16* __restrict__ x2,  // [T, K2] bf16 the shared expert's activation
    const __nv_bfloat16* __restrict__ w2,  // [N, K2] bf16 the shared expert's down_proj
    float* y2,                             // [T, N] f32 its output (read back by the tile's last block)
    int T, int K2,
    const int* __restrict__ pos,           // [P] i32 sorted position of each pair
    const float* __restrict__ weights,     // [T, k] f32
    int k,
    unsigned int* __restrict__ tickets,    // [ceil(N / GEMV_OUTS)] u32, zero at launch
    float* __restrict__ out) {             // [T, N] f32 the combine
  __shared__ __align__(16) GemvTcShared<1> sh;
  __shared__ int last;
  if ((int)blockIdx.y < P)
    gemv_grouped_run(a, w, group, ys, P, N, K, E, nullptr, -1, sh);
  else
    gemv_dense_group(x2, w2, y2, T, N, K2, blockIdx.y - P, sh);
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
