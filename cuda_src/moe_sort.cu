// moe_sort.cu -- the MoE's (row, slot) pairs sorted by expert on the device (NumpyOps.moe_sort), and
// moe_route_sort (the decode rows' moe_route and moe_sort in one launch): pair p = (row
// p / k, slot p % k) of expert ids[p]; sorted by expert, pairs of one expert in pair order (a stable counting
// sort, so the result is unique: any correct sort gives these bits).  Ids outside [0, E) sort after every
// expert, in pair order (the grouped GEMM's guard reports them).
//
// One block, SORT_THREADS threads; dynamic shared memory (E + 1 + SORT_THREADS) ints (moe_route.cuh's
// moe_sort_block, shared with moe_decode.cu).  No host sync: the grouped GEMMs read group, the gather src and
// the combine pos on the device.
#include "common.cuh"
#include "moe_route.cuh"

extern "C" __global__ void __launch_bounds__(SORT_THREADS)
moe_sort(const int* __restrict__ ids,   // [P] i32 expert of each pair, P = T * k
         int* __restrict__ order,       // [P] i32 the pair at each sorted position
         int* __restrict__ group,       // [P] i32 its expert id
         int* __restrict__ src,         // [P] i32 its token row (pair / k)
         int* __restrict__ pos,         // [P] i32 the sorted position of each pair (order's inverse)
         int P, int E, int k) {
  extern __shared__ int moe_sort_sh[];
  moe_sort_block(ids, order, group, src, pos, P, E, k, moe_sort_sh, threadIdx.x, blockDim.x);
}

// The decode rows' routing (moe_route.cuh, one warp per token in turn) and the sort of their pairs in one block:
// the bits of moe_route then moe_sort.  Dynamic shared memory: SORT_THREADS / 32 * 2 * E floats for the warps'
// scores, then (E + 1 + SORT_THREADS) ints for the sort.
extern "C" __global__ void __launch_bounds__(SORT_THREADS)
moe_route_sort(const float* __restrict__ logits,  // [T, E] f32
               const float* __restrict__ bias,    // [E] fp32 (stored F32)
               int* ids,                          // [T, k] i32 experts in pick order (read back by the sort)
               float* __restrict__ weights,       // [T, k] f32
               int* __restrict__ order,           // [T * k] i32 as moe_sort
               int* __restrict__ group,           // [T * k] i32
               int* __restrict__ src,             // [T * k] i32
               int* __restrict__ pos,             // [T * k] i32
               int T, int E, int k, float scale) {
  extern __shared__ float moe_route_sort_sh[];
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
  float* score = moe_route_sort_sh + (long long)warp * 2 * E;
  for (int t = warp; t < T; t += warps)            // warp-uniform
    moe_route_token(logits, bias, ids, weights, t, E, k, scale, score, threadIdx.x & 31);
  __syncthreads();                                 // every pair's expert id is written
  moe_sort_block(ids, order, group, src, pos, T * k, E, k,
                 reinterpret_cast<int*>(moe_route_sort_sh + (long long)warps * 2 * E), threadIdx.x, blockDim.x);
}
