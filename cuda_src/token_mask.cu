// token_mask.cu -- structured output: a grammar's allowed-token bitmask applied to logits rows in place.
// Reference: cupyglm.backend.numpy_token_mask.mask_rows (NumpyOps.mask_tokens), the same steps:
//
//  for each masked row m (logits row row[m]) and id v < V:
//    allowed = (bits[m, v / 32] >> (v % 32)) & 1      (llguidance's layout: bit v % 32 of int32 word v / 32)
//    not allowed and x not NaN: logits[row[m], v] = -inf (a NaN stays NaN, so a NaN row is still refused)
//
// One thread per (m, v): grid (ceil(V / TM_THREADS), M); every thread writes its own element only.
// Planted control (contract): -DTOKEN_MASK_CTL_MSB_FIRST reads the bits of a word from the top (bit 31 - v % 32).
#include "common.cuh"

#define TM_THREADS 256

extern "C" __global__ void __launch_bounds__(TM_THREADS) mask_rows(
    float* __restrict__ logits,                      // [R, V] f32, edited in place
    const int* __restrict__ row,                     // [M] i32, the logits row of mask m (distinct)
    const int* __restrict__ bits,                    // [M, W] i32, W = ceil(V / 32); bit set = allowed
    int M, int V, int W) {
  const int v = blockIdx.x * TM_THREADS + threadIdx.x;
  const int m = blockIdx.y;
  if (v >= V || m >= M) return;
  const unsigned w = (unsigned)bits[(long long)m * W + (v >> 5)];
#ifdef TOKEN_MASK_CTL_MSB_FIRST
  const unsigned allowed = (w >> (31 - (v & 31))) & 1u;
#else
  const unsigned allowed = (w >> (v & 31)) & 1u;
#endif
  if (allowed) return;
  float* p = logits + (long long)row[m] * V + v;
  const float x = *p;
  if (x == x) *p = -INFINITY;
}
