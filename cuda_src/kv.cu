// kv.cu -- rows through row ids (cupyglm/backend/numpy_ops.py: write_rows, read_rows): KV rows through page
// tables, and the token embedding gather (read_rows on the embedding table).
//
// Row ids come from the page table (kv/store.py: pages[p // page_tokens] * page_tokens + p % page_tokens).
// One block per listed row (grid = n), threads stride over the C columns.  The launchers refuse ids
// outside [0, N) and duplicate write ids (kernels/guards.py: checks.cu for device arrays); here an invalid
// id writes nothing (write) or a NaN row (read), never memory outside the store.  Storage: every row is bf16
// (latent rows, pooled keys, the embedding table), copied bit for bit.
#include "common.cuh"

// store[rows[i], :] = values[i, :]
extern "C" __global__ void kv_write_rows(__nv_bfloat16* __restrict__ store,          // [N, C] bf16, in place
                                         const int* __restrict__ rows,               // [n] i32 row ids, distinct
                                         const __nv_bfloat16* __restrict__ values,   // [n, C] bf16
                                         int N, int C) {
  const int r = rows[blockIdx.x];
  if (r < 0 || r >= N) return;
  __nv_bfloat16* dst = store + (long long)r * C;
  const __nv_bfloat16* src = values + (long long)blockIdx.x * C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
}

// out[i, :] = store[rows[i], :]
extern "C" __global__ void kv_read_rows(const __nv_bfloat16* __restrict__ store,  // [N, C] bf16
                                        const int* __restrict__ rows,             // [n] i32 row ids
                                        __nv_bfloat16* __restrict__ out,          // [n, C] bf16
                                        int N, int C) {
  const int r = rows[blockIdx.x];
  __nv_bfloat16* dst = out + (long long)blockIdx.x * C;
  if (r < 0 || r >= N) {
    for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = to_bf16(NAN);
    return;
  }
  const __nv_bfloat16* src = store + (long long)r * C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
}
