// pick.cu -- the DSA pick (cupyglm/backend/numpy_ops.py: pick): per row, the token list attention reads.
//
// Row t at position q sees v = (q + 1) / kpool complete pools.  v <= npools: dense, tokens 0..q.  Else the
// exact top npools pools by score, ties to the lower pool index, in ascending pool order, expanded to their
// kpool tokens each, then the tail tokens v*kpool..q of the incomplete pool; -1 after the count.
//
// Selection is rank-by-counting: pool p is picked iff fewer than npools pools beat it, where j beats p when
// s_j > s_p, or s_j == s_p and j < p.  Exact, no sort, no atomics; O(v^2) per row (fine at the contexts
// the tiny model and the contract run; a radix select is the long-context upgrade).  A pool's slot in the
// ascending list is the number of picked pools below it, counted over the block's shared flags.
//
// One block per row (grid = T), dynamic shared memory: P bytes of flags.  width >= npools * kpool (the
// launcher checks), so picked pools always fit; the dense list and the tail stop at width.  Scores of pools >= v (not yet
// visible; the caller leaves anything there) are never read.
#include "common.cuh"

extern "C" __global__ void dsa_pick(const float* __restrict__ scores,    // [T, P] f32 pool scores
                                    const int* __restrict__ positions,   // [T] i32 position of each row
                                    int* __restrict__ tokens,            // [T, width] i32, -1 padded
                                    int* __restrict__ counts,            // [T] i32
                                    int P, int npools, int kpool, int width) {
  extern __shared__ unsigned char picked[];
  const int t = blockIdx.x;
  const int tid = threadIdx.x;
  const int q = positions[t];
  const int v = (q + 1) / kpool;
  int* out = tokens + (long long)t * width;
  if (v <= npools) {                                   // dense: every token so far
    for (int i = tid; i < width; i += blockDim.x) out[i] = i <= q ? i : -1;
    if (tid == 0) counts[t] = q + 1;
    return;
  }
  const float* s = scores + (long long)t * P;
  // The launcher guarantees v <= P (sim checks it on the host); never read past the row regardless.
  const int vr = min(v, P);
  for (int p = tid; p < vr; p += blockDim.x) {
    const float sp = s[p];
    int beat = 0;
    for (int j = 0; j < vr && beat < npools; ++j) {
      const float sj = s[j];
      beat += (sj > sp || (sj == sp && j < p)) ? 1 : 0;
    }
    picked[p] = beat < npools ? 1 : 0;
  }
  __syncthreads();
  for (int p = tid; p < vr; p += blockDim.x) {
    if (!picked[p]) continue;
    int slot = 0;
    for (int j = 0; j < p; ++j) slot += picked[j];
    for (int i = 0; i < kpool; ++i) out[slot * kpool + i] = p * kpool + i;
  }
  const int base = npools * kpool;
  const int ntail = q + 1 - v * kpool;
  for (int i = tid; base + i < width; i += blockDim.x) out[base + i] = i < ntail ? v * kpool + i : -1;
  if (tid == 0) counts[t] = base + ntail;
}
