// embed.cu -- token embedding: a row gather (cupyglm/backend/numpy_ops.py: embed).
//
// One block per token (grid = T), threads stride over the D columns.  An id outside [0, V) (the launcher
// refuses those on the host; this is the device's last line) gives a NaN row, never a read out of bounds.
#include "common.cuh"

extern "C" __global__ void embed_rows(const float* __restrict__ table,  // [V, D] f32 (bf16 values)
                                      const int* __restrict__ ids,      // [T] i32 token ids
                                      float* __restrict__ out,          // [T, D] f32 (bf16 values)
                                      int V, int D) {
  const int id = ids[blockIdx.x];
  float* orow = out + (long long)blockIdx.x * D;
  if (id < 0 || id >= V) {
    for (int i = threadIdx.x; i < D; i += blockDim.x) orow[i] = NAN;
    return;
  }
  const float* src = table + (long long)id * D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) orow[i] = src[i];
}
