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
// Quantised experts (FP8 block-scaled, NVFP4: the _fp8 / _nvfp4 entry points) run the same two launches with
// gemv_q.cu's bodies (gemv_q_block.cuh: the bytes as stored made exact bf16, the same tensor-core order), the bits of
// gemv_grouped_swiglu_{fmt}_lane16, gemv_grouped_{fmt}_lane16 and (shared down quantised) gemv_{fmt}_lane16; a bf16
// shared down (sh_q = 0) runs gemv_lane16's body.
//
// Launch: block (16, GEMV_OUTS).  moe_route_swiglu_lane16: grid (ceil(N / GEMV_OUTS), min(T * k, E)), dynamic
// shared memory 6 * T * k ints, E <= MOE_ROUTE_MAX_E.  moe_down_combine_lane16: grid (ceil(N / GEMV_OUTS),
// T * k + ceil(T / GEMV_ROWS)): block y < T * k is pair y's run (gemv_grouped_run), the rest the shared expert's
// row groups; tickets [ceil(N / GEMV_OUTS)] zero at launch.  The _fp8 / _nvfp4 forms: the same grids and shared
// memory.
#include "common.cuh"
#include "gemv_grouped.cuh"
#include "moe_decode.cuh"
#include "swiglu.cuh"

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
  moe_route_block(sh, moe_pairs, run, logits, bias, ids, weights, group, pos, tickets, tiles, T, E, k, scale);
  const int lo = run[0], hi = run[1], P = T * k;
  if (lo >= hi) return;                               // fewer runs than blocks: the whole block leaves together
  const int* p_src = moe_pairs + 4 * P;
  const int g = moe_pairs[3 * P + lo];
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

// The quantised experts' gate/up SwiGLU of this block's run (after moe_route_block): gemv_q.cu's grouped SwiGLU
// body with the rows read through src.
template <int F>
static __device__ __forceinline__ void moe_q_swiglu_run(MoeUpShared& sh, const int* pairs, const int* run,
                                                        const __nv_bfloat16* x, const GemvQw& wg, const GemvQw& wu,
                                                        __nv_bfloat16* y, int P, int N, int K, int has_limit,
                                                        float limit) {
  const int lo = run[0], hi = run[1];
  if (lo >= hi) return;                               // fewer runs than blocks: the whole block leaves together
  const int* p_src = pairs + 4 * P;
  const int n0 = blockIdx.x * GEMV_OUTS, lane = threadIdx.x, n = n0 + threadIdx.y;
  const GemvQw w[2] = {wg, wu};
  GemvQSrc<2> src;
  gemv_q_src<2, F>(src, w, pairs[3 * P + lo], n0, min(GEMV_OUTS, N - n0), N, K, x);
  GemvXRows xr = {x, p_src, K, src.xvec};
  for (int m0 = lo; m0 < hi; m0 += GEMV_ROWS) {
    xr.rows = p_src + m0;
    src.nrows = min(GEMV_ROWS, hi - m0);
    float v[2];
    gemv_q_rows_x<2, F>(sh.gemv, src, xr, v);
    if (n < N && lane < src.nrows)
      y[(long long)(m0 + lane) * N + n] = to_bf16(swiglu_f32(bf16_round(gemv_q_out<2, F>(src, v, 0)),
                                                             bf16_round(gemv_q_out<2, F>(src, v, 1)), has_limit,
                                                             limit));
  }
}

// Every quantised form: 2 blocks an SM, as gemv_q.cu's.
extern "C" __global__ void __launch_bounds__(256, 2) moe_route_swiglu_fp8_lane16(
    const float* __restrict__ logits,      // [T, E] f32 router logits
    const float* __restrict__ bias,        // [E] fp32 (stored F32) correction bias
    const __nv_bfloat16* __restrict__ x,   // [T, K] bf16 the decode/verify rows
    const unsigned char* __restrict__ wgv, // gate [E, N, K] e4m3 codes
    const float* __restrict__ wgs,         // gate [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const unsigned char* __restrict__ wuv, // up [E, N, K] e4m3 codes
    const float* __restrict__ wus,         // up [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    __nv_bfloat16* __restrict__ y,         // [T * k, N] bf16 activation of the expert-sorted pairs
    int* __restrict__ ids,                 // [T, k] i32 experts in pick order
    float* __restrict__ weights,           // [T, k] f32
    int* __restrict__ group,               // [T * k] i32 expert of each sorted pair
    int* __restrict__ pos,                 // [T * k] i32 sorted position of each pair
    unsigned int* __restrict__ tickets,    // [tiles] u32 set to 0 for moe_down_combine_fp8_lane16
    int tiles, int T, int E, int k, float scale, int N, int K, int bn, int bk, int has_limit, float limit) {
  __shared__ __align__(16) MoeUpShared sh;
  __shared__ int run[2];                  // this block's run [run[0], run[1]) of sorted pairs
  extern __shared__ int moe_pairs_fp8[];  // [6, T * k] i32: ids, weights (f32), order, group, src, pos
  moe_route_block(sh, moe_pairs_fp8, run, logits, bias, ids, weights, group, pos, tickets, tiles, T, E, k, scale);
  const GemvQw wg = {wgv, wgs, nullptr, nullptr, bn, bk}, wu = {wuv, wus, nullptr, nullptr, bn, bk};
  moe_q_swiglu_run<GEMV_FP8>(sh, moe_pairs_fp8, run, x, wg, wu, y, T * k, N, K, has_limit, limit);
}

extern "C" __global__ void __launch_bounds__(256, 2) moe_route_swiglu_nvfp4_lane16(
    const float* __restrict__ logits,      // [T, E] f32 router logits
    const float* __restrict__ bias,        // [E] fp32 (stored F32) correction bias
    const __nv_bfloat16* __restrict__ x,   // [T, K] bf16 the decode/verify rows
    const unsigned char* __restrict__ wgv, // gate [E, N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ wgs, // gate [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ wgs2,        // gate [E] fp32 weight_scale_2
    const unsigned char* __restrict__ wuv, // up [E, N, K / 2] packed e2m1 (element 2i low nibble)
    const unsigned char* __restrict__ wus, // up [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ wus2,        // up [E] fp32 weight_scale_2
    __nv_bfloat16* __restrict__ y,         // [T * k, N] bf16 activation of the expert-sorted pairs
    int* __restrict__ ids,                 // [T, k] i32 experts in pick order
    float* __restrict__ weights,           // [T, k] f32
    int* __restrict__ group,               // [T * k] i32 expert of each sorted pair
    int* __restrict__ pos,                 // [T * k] i32 sorted position of each pair
    unsigned int* __restrict__ tickets,    // [tiles] u32 set to 0 for moe_down_combine_nvfp4_lane16
    int tiles, int T, int E, int k, float scale, int N, int K, int has_limit, float limit) {
  __shared__ __align__(16) MoeUpShared sh;
  __shared__ int run[2];                  // this block's run [run[0], run[1]) of sorted pairs
  extern __shared__ int moe_pairs_nvfp4[];   // [6, T * k] i32: ids, weights (f32), order, group, src, pos
  moe_route_block(sh, moe_pairs_nvfp4, run, logits, bias, ids, weights, group, pos, tickets, tiles, T, E, k, scale);
  const GemvQw wg = {wgv, nullptr, wgs, wgs2, 1, 16}, wu = {wuv, nullptr, wus, wus2, 1, 16};
  moe_q_swiglu_run<GEMV_NVFP4>(sh, moe_pairs_nvfp4, run, x, wg, wu, y, T * k, N, K, has_limit, limit);
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
  moe_combine_tile(ys, y2, pos, weights, tickets, T, k, N, out, last);
}

// The quantised down launch's GEMV blocks: pair runs, then the shared expert's row groups (quantised as the
// experts when sh_q, else bf16 w2b).
template <int F>
static __device__ __forceinline__ void moe_q_down(GemvTcShared<1>& sh, const __nv_bfloat16* a, const GemvQw& w,
                                                  const int* group, float* ys, int P, int N, int K, int E,
                                                  const __nv_bfloat16* x2, const GemvQw& w2, const __nv_bfloat16* w2b,
                                                  int sh_q, float* y2, int T, int K2) {
  if ((int)blockIdx.y < P)
    moe_q_grouped_run<F>(a, w, group, ys, P, N, K, E, sh);
  else if (sh_q)
    moe_q_dense_group<F>(x2, w2, y2, T, N, K2, blockIdx.y - P, sh);
  else
    gemv_dense_group(x2, w2b, y2, T, N, K2, blockIdx.y - P, sh);
}

extern "C" __global__ void __launch_bounds__(256, 2) moe_down_combine_fp8_lane16(
    const __nv_bfloat16* __restrict__ a,   // [P, K] bf16 the sorted pairs' activation, P = T * k
    const unsigned char* __restrict__ wv,  // [E, N, K] e4m3 codes: experts' down_proj
    const float* __restrict__ ws,          // [E, ceil(N / bn), ceil(K / bk)] fp32 weight_scale_inv
    const int* __restrict__ group,         // [P] i32 expert of each sorted pair
    float* ys,                             // [P, N] f32 the pairs' outputs (read back by the tile's last block)
    int P, int N, int K, int E, int bn, int bk,
    const __nv_bfloat16* __restrict__ x2,  // [T, K2] bf16 the shared expert's activation
    const unsigned char* __restrict__ w2v, // sh_q: [N, K2] e4m3 codes of the shared down_proj (else unread)
    const float* __restrict__ w2s,         // sh_q: [ceil(N / bn2), ceil(K2 / bk2)] fp32 weight_scale_inv
    int bn2, int bk2,
    const __nv_bfloat16* __restrict__ w2b, // !sh_q: [N, K2] bf16 the shared down_proj (else unread)
    int sh_q,
    float* y2,                             // [T, N] f32 its output (read back by the tile's last block)
    int T, int K2,
    const int* __restrict__ pos,           // [P] i32 sorted position of each pair
    const float* __restrict__ weights,     // [T, k] f32
    int k,
    unsigned int* __restrict__ tickets,    // [ceil(N / GEMV_OUTS)] u32, zero at launch
    float* __restrict__ out) {             // [T, N] f32 the combine
  __shared__ __align__(16) GemvTcShared<1> sh;
  __shared__ int last;
  const GemvQw w = {wv, ws, nullptr, nullptr, bn, bk}, w2 = {w2v, w2s, nullptr, nullptr, bn2, bk2};
  moe_q_down<GEMV_FP8>(sh, a, w, group, ys, P, N, K, E, x2, w2, w2b, sh_q, y2, T, K2);
  moe_combine_tile(ys, y2, pos, weights, tickets, T, k, N, out, last);
}

extern "C" __global__ void __launch_bounds__(256, 2) moe_down_combine_nvfp4_lane16(
    const __nv_bfloat16* __restrict__ a,   // [P, K] bf16 the sorted pairs' activation, P = T * k
    const unsigned char* __restrict__ wv,  // [E, N, K / 2] packed e2m1: experts' down_proj
    const unsigned char* __restrict__ ws,  // [E, N, K / 16] e4m3 weight_scale
    const float* __restrict__ ws2,         // [E] fp32 weight_scale_2
    const int* __restrict__ group,         // [P] i32 expert of each sorted pair
    float* ys,                             // [P, N] f32 the pairs' outputs (read back by the tile's last block)
    int P, int N, int K, int E,
    const __nv_bfloat16* __restrict__ x2,  // [T, K2] bf16 the shared expert's activation
    const unsigned char* __restrict__ w2v, // sh_q: [N, K2 / 2] packed e2m1 of the shared down_proj (else unread)
    const unsigned char* __restrict__ w2s, // sh_q: [N, K2 / 16] e4m3 weight_scale
    const float* __restrict__ w2s2,        // sh_q: [1] fp32 weight_scale_2
    const __nv_bfloat16* __restrict__ w2b, // !sh_q: [N, K2] bf16 the shared down_proj (else unread)
    int sh_q,
    float* y2,                             // [T, N] f32 its output (read back by the tile's last block)
    int T, int K2,
    const int* __restrict__ pos,           // [P] i32 sorted position of each pair
    const float* __restrict__ weights,     // [T, k] f32
    int k,
    unsigned int* __restrict__ tickets,    // [ceil(N / GEMV_OUTS)] u32, zero at launch
    float* __restrict__ out) {             // [T, N] f32 the combine
  __shared__ __align__(16) GemvTcShared<1> sh;
  __shared__ int last;
  const GemvQw w = {wv, nullptr, ws, ws2, 1, 16}, w2 = {w2v, nullptr, w2s, w2s2, 1, 16};
  moe_q_down<GEMV_NVFP4>(sh, a, w, group, ys, P, N, K, E, x2, w2, w2b, sh_q, y2, T, K2);
  moe_combine_tile(ys, y2, pos, weights, tickets, T, k, N, out, last);
}
