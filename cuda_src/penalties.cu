// penalties.cu -- presence / frequency / repetition penalties and logit_bias as edits of the logits in place.
// Reference: cupyglm.backend.numpy_penalties.penalize_rows (NumpyOps.penalize), the same float32 steps:
//
//  for each edit j (a distinct (row, id) pair; the host lists only the ids a request has seen or biased):
//    x = logits[row, id]; a NaN stays NaN
//    seen (in the prompt or the output) and repetition != 1:  x = x > 0 ? x / repetition : x * repetition
//    count (times in the output) > 0:                          x = (x - frequency * count) - presence
//    x = x + bias
//
// One thread per edit (the pairs are distinct: no two threads touch one element), PN_THREADS per block.
// Planted control (contract): -DPENALTIES_CTL_BIAS_FIRST adds the bias before the penalties.
#include "common.cuh"

#define PN_THREADS 256

extern "C" __global__ void __launch_bounds__(PN_THREADS) penalize_rows(
    float* __restrict__ logits,                      // [R, V] f32, edited in place
    const int* __restrict__ row,                     // [N] i32, the edit's row
    const int* __restrict__ id,                      // [N] i32, the edit's token id
    const int* __restrict__ count,                   // [N] i32, times id is in the row's output
    const int* __restrict__ seen,                    // [N] i32, 1: id is in the row's prompt or output
    const float* __restrict__ bias,                  // [N] f32, logit_bias (0 when none)
    const float* __restrict__ repetition,            // [R] f32, 1 = off
    const float* __restrict__ frequency,             // [R] f32
    const float* __restrict__ presence,              // [R] f32
    int N, int V) {
  const int j = blockIdx.x * PN_THREADS + threadIdx.x;
  if (j >= N) return;
  const int r = row[j];
  float* p = logits + (long long)r * V + id[j];
  float x = *p;
  if (x != x) return;
#ifdef PENALTIES_CTL_BIAS_FIRST
  x = x + bias[j];
#endif
  const float rp = repetition[r];
  if (seen[j] && rp != 1.0f) x = x > 0.0f ? x / rp : x * rp;
  const int c = count[j];
  if (c > 0) x = (x - frequency[r] * (float)c) - presence[r];
#ifndef PENALTIES_CTL_BIAS_FIRST
  x = x + bias[j];
#endif
  *p = x;
}
