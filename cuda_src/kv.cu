// kv.cu -- rows through row ids (cupyglm/backend/numpy_ops.py: write_rows, read_rows): KV rows through page
// tables, and the token embedding gather (read_rows on the embedding table).
//
// Row ids come from the page table (kv/store.py: pages[p // page_tokens] * page_tokens + p % page_tokens).
// One block per listed row (grid = n), threads stride over the C columns.  An id outside [0, N) writes
// nothing (write) or a NaN row (read), never memory outside the store, and is counted by the kernel itself
// into guard slot `slot` of `flags` (check_flag.cuh; slot < 0: the launcher checked the ids on the host), so
// no separate check launch runs.  Duplicate write ids are refused by the launcher (guards.ids_distinct).
// Storage: every row is bf16 (latent rows, pooled keys, the embedding table), copied bit for bit.
// kv_write_rows_rmsnorm writes each row RMS-normed on its way in (norm_row.cuh: NumpyOps.rmsnorm's bits), so a
// DSA layer's latent rows need no separate norm launch; same ids, same guard.
#include "common.cuh"
#include "check_flag.cuh"
#include "norm_row.cuh"

// Row id r of block i is outside [0, N): counted once (thread 0) into the guard slot.
static __device__ __forceinline__ bool kv_bad_row(int r, int N, unsigned int* flags, int slot) {
#ifdef KV_PLANT_FLAG
  const bool flagged = r < 0 || r > N;                       // planted: the id N is skipped but not counted
#else
  const bool flagged = r < 0 || r >= N;
#endif
  if (flagged && slot >= 0 && threadIdx.x == 0) check_flag(flags, slot, blockIdx.x);
  return r < 0 || r >= N;
}

// store[rows[i], :] = values[i, :]
extern "C" __global__ void kv_write_rows(__nv_bfloat16* __restrict__ store,          // [N, C] bf16, in place
                                         const int* __restrict__ rows,               // [n] i32 row ids, distinct
                                         const __nv_bfloat16* __restrict__ values,   // [n, C] bf16
                                         int N, int C,
                                         unsigned int* __restrict__ flags,          // [slots, 2] u32 guard flags
                                         int slot) {
  const int r = rows[blockIdx.x];
  if (kv_bad_row(r, N, flags, slot)) return;
  __nv_bfloat16* dst = store + (long long)r * C;
  const __nv_bfloat16* src = values + (long long)blockIdx.x * C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
}

struct KvRowBf16 {              // row values read from bf16 memory (norm_row.cuh's reader)
  const __nv_bfloat16* xr;
  __device__ float operator()(int i) const { return ld_bf16(xr, i); }
};

// store[rows[i], :] = rmsnorm(x[i, :], w, eps); a row whose id is refused leaves the whole block (uniform).
extern "C" __global__ void kv_write_rows_rmsnorm(__nv_bfloat16* __restrict__ store,     // [N, C] bf16, in place
                                                 const int* __restrict__ rows,          // [n] i32 row ids, distinct
                                                 const __nv_bfloat16* __restrict__ x,   // [n, C] bf16 rows to norm
                                                 const __nv_bfloat16* __restrict__ w,   // [C] bf16 norm weight
                                                 int N, int C, float eps,
                                                 unsigned int* __restrict__ flags,     // [slots, 2] u32 guard flags
                                                 int slot) {
  const int r = rows[blockIdx.x];
  if (kv_bad_row(r, N, flags, slot)) return;
  const KvRowBf16 rd{x + (long long)blockIdx.x * C};
  rmsnorm_row(rd, w, store + (long long)r * C, C, eps);
}

// out[i, :] = store[rows[i], :]
extern "C" __global__ void kv_read_rows(const __nv_bfloat16* __restrict__ store,  // [N, C] bf16
                                        const int* __restrict__ rows,             // [n] i32 row ids
                                        __nv_bfloat16* __restrict__ out,          // [n, C] bf16
                                        int N, int C,
                                        unsigned int* __restrict__ flags,         // [slots, 2] u32 guard flags
                                        int slot) {
  const int r = rows[blockIdx.x];
  __nv_bfloat16* dst = out + (long long)blockIdx.x * C;
  if (kv_bad_row(r, N, flags, slot)) {
    for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = to_bf16(NAN);
    return;
  }
  const __nv_bfloat16* src = store + (long long)r * C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
}
