// moe_route.cuh -- one token's routing (NumpyOps.moe_route): sigmoid scores + correction bias, top-k with ties
// to the lower id, weights renormalised in pick order; and the sort of the pairs by expert by one block
// (NumpyOps.moe_sort).  Shared by moe.cu's moe_route, moe_sort.cu's moe_sort / moe_route_sort and
// moe_decode.cu's moe_route_swiglu_lane16, so all give the same bits.
#pragma once
#include "common.cuh"
#include "exp_f32.cuh"

#define MOE_MAX_K 32  // moe_route: experts per token <= 32 (the model has 8)

// Total order of the pick: larger value first, NaN after every number, ties to the lower id; id < 0 is
// "nothing yet".  The same order as numpy's stable argsort of -(score + bias).
static __device__ __forceinline__ bool moe_better(float a, int ia, float b, int ib) {
  if (ia < 0) return false;
  if (ib < 0) return true;
  const bool na = a != a, nb = b != b;
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// Token t by one whole warp (lane = its lane); score: 2 * E floats of shared memory of this warp.
static __device__ __forceinline__ void moe_route_token(const float* __restrict__ logits, const float* __restrict__ bias,
                                                       int* ids, float* weights, int t, int E, int k, float scale,
                                                       float* score, int lane) {
  float* sel = score + E;
  for (int e = lane; e < E; e += 32) {
    const float s = sigmoid_f32(logits[(long long)t * E + e]);
    score[e] = s;
    sel[e] = s + bias[e];
  }
  __syncwarp();
  int pick[MOE_MAX_K];
  for (int r = 0; r < k; ++r) {
    float bv = 0.0f;
    int bi = -1;
    for (int e = lane; e < E; e += 32) {
      bool taken = false;
      for (int q = 0; q < r; ++q) taken = taken || pick[q] == e;
      if (!taken && moe_better(sel[e], e, bv, bi)) { bv = sel[e]; bi = e; }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(FULL_MASK, bv, off);
      const int oi = __shfl_xor_sync(FULL_MASK, bi, off);
      if (moe_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    pick[r] = bi;
  }
  if (lane == 0) {
    float total = 0.0f;
    for (int r = 0; r < k; ++r) total = (r == 0) ? score[pick[r]] : total + score[pick[r]];
    total = total + 1e-20f;
    for (int r = 0; r < k; ++r) {
      ids[(long long)t * k + r] = pick[r];
      weights[(long long)t * k + r] = score[pick[r]] / total * scale;
    }
  }
  __syncwarp();                     // the warp's scores are read before its next token overwrites them
}

#define SORT_THREADS 256  // threads of a block that sorts (moe_sort_block's tile)

static __device__ __forceinline__ int moe_bucket(int id, int E) { return (id >= 0 && id < E) ? id : E; }

// The sort by one whole block of `nthreads` (<= SORT_THREADS) threads, this one `tid`; sh: (E + 1 + SORT_THREADS)
// ints of shared memory.  Expert counts by shared-memory integer atomics (order-free), their exclusive scan by
// one thread, then the pairs in tiles of nthreads in pair order: a pair's slot is its expert's running base plus
// the pairs of its expert earlier in the tile (a stable counting sort: the result is unique).  ids is read with
// plain (coherent) loads: the same block may have written it in this launch.
static __device__ __forceinline__ void moe_sort_block(const int* ids, int* __restrict__ order, int* __restrict__ group,
                                                      int* __restrict__ src, int* __restrict__ pos, int P, int E,
                                                      int k, int* sh, int tid, int nthreads) {
  int* base = sh;               // [E + 1] running first slot of each bucket
  int* tile = sh + E + 1;       // [SORT_THREADS] buckets of the current tile
  for (int e = tid; e <= E; e += nthreads) base[e] = 0;
  __syncthreads();
  for (int p = tid; p < P; p += nthreads) atomicAdd(&base[moe_bucket(ids[p], E)], 1);
  __syncthreads();
  if (tid == 0) {
    int acc = 0;
    for (int e = 0; e <= E; ++e) {
      const int c = base[e];
      base[e] = acc;
      acc += c;
    }
  }
  __syncthreads();
  for (int b0 = 0; b0 < P; b0 += nthreads) {       // block-uniform trip count
    const int p = b0 + tid;
    const int id = p < P ? ids[p] : -1;
    const int e = p < P ? moe_bucket(id, E) : -1;
    tile[tid] = e;
    __syncthreads();
    if (p < P) {
      int before = 0;
      for (int j = 0; j < tid; ++j) before += tile[j] == e ? 1 : 0;
      const int at = base[e] + before;
      order[at] = p;
      group[at] = id;
      src[at] = p / k;
      pos[p] = at;
    }
    __syncthreads();                               // every slot read from base before it moves on
    if (p < P) atomicAdd(&base[e], 1);
    __syncthreads();
  }
}
