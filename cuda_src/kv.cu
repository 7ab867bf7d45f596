// kv.cu -- rows through row ids (cupyglm/backend/numpy_ops.py: write_rows, read_rows, write_rows_rmsnorm_keys): KV
// rows through page tables, and the token embedding gather (read_rows on the embedding table).
//
// Row ids come from the page table (kv/store.py: pages[p // page_tokens] * page_tokens + p % page_tokens).
// One block per listed row (grid = n), threads stride over the C columns.  An id outside [0, N) writes
// nothing (write) or a NaN row (read), never memory outside the store, and is counted by the kernel itself
// into guard slot `slot` of `flags` (check_flag.cuh; slot < 0: the launcher checked the ids on the host), so
// no separate check launch runs.  Duplicate write ids are refused by the launcher (guards.ids_distinct).
// Storage: every row is bf16 (latent rows, pooled keys, the embedding table), copied bit for bit.
// kv_write_rows_rmsnorm_keys writes each row RMS-normed on its way in (norm_row.cuh: NumpyOps.rmsnorm's bits), so a
// DSA layer's latent rows need no separate norm launch, same ids, same guard; its second job (blockIdx.y = 1)
// layer-norms the same call rows' index keys into a new array (NumpyOps.layernorm's bits), so the indexer's key
// norm needs no launch of its own either.  Both jobs are per row, so every row role takes this one path.
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

// blockIdx.y = 0: store[rows[i], :] = rmsnorm(x[i, :], w, eps); a row whose id is refused leaves the whole block
// (uniform).  blockIdx.y = 1: keys_out[i, :] = layernorm(keys[i, :], kw, kb, keps) (no store row, no guard).
extern "C" __global__ void kv_write_rows_rmsnorm_keys(
    __nv_bfloat16* __restrict__ store,            // [N, C] bf16, in place
    const int* __restrict__ rows,                 // [n] i32 row ids, distinct
    const __nv_bfloat16* __restrict__ x,          // [n, C] bf16 rows to norm
    const __nv_bfloat16* __restrict__ w,          // [C] bf16 RMSNorm weight
    int N, int C, float eps,
    const __nv_bfloat16* __restrict__ keys,       // [n, I] bf16 index keys to layer-norm
    const __nv_bfloat16* __restrict__ kw,         // [I] bf16 LayerNorm weight
    const __nv_bfloat16* __restrict__ kb,         // [I] bf16 LayerNorm bias
    __nv_bfloat16* __restrict__ keys_out,         // [n, I] bf16 normed index keys
    int I, float keps,
    unsigned int* __restrict__ flags,             // [slots, 2] u32 guard flags
    int slot) {
  if (blockIdx.y == 1) {                          // block-uniform: the keys job never reaches the store's barriers
#ifdef KV_PLANT_KEYS_ROW
    const long long out_row = gridDim.x - 1 - blockIdx.x;    // planted: row i's keys land in row n-1-i
#else
    const long long out_row = blockIdx.x;
#endif
#ifdef KV_PLANT_KEYS_BIAS
    const __nv_bfloat16* bias = kw;                          // planted: the weight added in place of the bias
#else
    const __nv_bfloat16* bias = kb;
#endif
    const KvRowBf16 kr{keys + (long long)blockIdx.x * I};
    layernorm_row(kr, kw, bias, keys_out + out_row * I, I, keps);
    return;
  }
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
