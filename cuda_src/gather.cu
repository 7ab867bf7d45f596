// gather.cu -- KV rows in host memory (CUPYGLM_KV_HOST=1): the latent rows one call segment picked, copied
// once each from the host store (pinned, mapped into the device) into device slots, and its token lists
// rewritten to slot ids in the same order, so the unchanged attention kernel reads the slots.
// Reference: cupyglm/backend/numpy_gather.py.  Four launches per (segment, layer), in stream order:
//   gather_mark    every listed row claims one slot (atomicCAS free -> claimed, then a slot from the counter);
//                  a row past the S slots goes back to free and raises flag[which]: no row is left claimed.
//   gather_copy    one warp a used slot: its row's bytes from the host store into the slot.
//   gather_remap   out[t, j] = mark[rows[t, j]] for j < counts[t], -1 after; a row without a slot (the call
//                  ran out of slots and is refused) names slot 0, so the attention stays inside the slots.
//   gather_unmark  every used slot's row back to free: between calls every mark is free.
// Slot numbers follow the atomics' order; what a token reads (slots[out[t, j]]) does not.  Storage: the store
// and the slots are bf16 rows copied as 32-bit words (R even); marks, slot rows, counts and ids int32.
#include "common.cuh"

#define GATHER_FREE (-1)
#define GATHER_CLAIMED (-2)

// grid (T): one block per token row, threads stride over the row's first counts[t] ids.
extern "C" __global__ void gather_mark(const int* __restrict__ rows,    // [T, W] i32 store row ids, -1 padded
                                       const int* __restrict__ counts,  // [T] i32 ids used per row
                                       int* __restrict__ mark,          // [N] i32 slot of a row, free between calls
                                       int* __restrict__ slot_row,      // [S] i32 row of each used slot
                                       int* __restrict__ used,          // [1] i32 slots claimed (from 0)
                                       int* __restrict__ flag,          // [F] i32 (mapped host memory on cuda)
                                       int T, int W, int N, int S, int which) {
  const int t = blockIdx.x;
  const int count = min(counts[t], W);
  for (int j = threadIdx.x; j < count; j += blockDim.x) {
    const int r = rows[(long long)t * W + j];
    if (r < 0 || r >= N) continue;
    if (atomicCAS(&mark[r], GATHER_FREE, GATHER_CLAIMED) != GATHER_FREE) continue;
    const int s = atomicAdd(used, 1);
    if (s < S) {
      slot_row[s] = r;
      mark[r] = s;
    } else {
#ifndef GATHER_CONTROL_LEAVE_CLAIMED
      mark[r] = GATHER_FREE;
#endif
      flag[which] = 1;  // every writer stores the same value
    }
  }
}

// grid: ceil(G * 32 / blockDim.x) with G >= the slots a call can use; one warp a slot, lanes over the words.
extern "C" __global__ void gather_copy(const unsigned int* __restrict__ store,  // [N, words] u32 (bf16 pairs)
                                       const int* __restrict__ slot_row,        // [S] i32
                                       const int* __restrict__ used,            // [1] i32
                                       unsigned int* __restrict__ slots,        // [S, words] u32
                                       int N, int S, int words) {
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  int n = min(*used, S);
#ifdef GATHER_CONTROL_DROP_ROW
  n = n - 1;  // the last used slot is never filled
#endif
  if (warp >= n) return;
  const int r = slot_row[warp];
  if (r < 0 || r >= N) return;
  const unsigned int* src = store + (long long)r * words;
  unsigned int* dst = slots + warp * words;
  for (int i = lane; i < words; i += 32) dst[i] = src[i];
}

// grid (T): out[t, j] = the slot of rows[t, j] for j < counts[t], -1 after (the same padding as rows).
extern "C" __global__ void gather_remap(const int* __restrict__ rows,    // [T, W] i32
                                        const int* __restrict__ counts,  // [T] i32
                                        const int* __restrict__ mark,    // [N] i32
                                        int* __restrict__ out,           // [T, W] i32 slot ids, -1 padded
                                        int T, int W, int N) {
  const int t = blockIdx.x;
  const int count = min(counts[t], W);
  for (int j = threadIdx.x; j < W; j += blockDim.x) {
    int v = -1;
    if (j < count) {
      const int r = rows[(long long)t * W + j];
      const int s = (r >= 0 && r < N) ? mark[r] : GATHER_FREE;
      v = s >= 0 ? s : 0;
#ifdef GATHER_CONTROL_SWAP_SLOT
      if (v >= 0) v = v ^ 1;  // neighbouring slots swapped
#endif
    }
    out[(long long)t * W + j] = v;
  }
}

// grid: ceil(G / blockDim.x); one thread a used slot.
extern "C" __global__ void gather_unmark(const int* __restrict__ slot_row,  // [S] i32
                                         const int* __restrict__ used,      // [1] i32
                                         int* __restrict__ mark,            // [N] i32
                                         int N, int S) {
  const long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  int n = min(*used, S);
#ifdef GATHER_CONTROL_STALE_MARK
  n = n - 1;  // the last used slot's row stays marked
#endif
  if (s >= n) return;
  const int r = slot_row[s];
  if (r >= 0 && r < N) mark[r] = GATHER_FREE;
}

// ---- the row cache of decode and verify segments (<= 16 rows): each layer keeps the rows its last such
// segment gathered.  Per layer: cache [C, words] u32 rows, cache_rows [C] i32 (-1 empty), cmark [N] i32 (a
// row's cache entry, else -1).  A cached row always holds its store row's bytes: the cache is forgotten
// whenever pages change hands, and a row is written before any call can pick it.  Order per segment:
// mark, copy_cached, remap, forget, keep, unmark.

// copy_cached: like gather_copy, but a row the cache holds comes from the cache (device memory); hits and
// misses counted in stats[0], stats[1].
extern "C" __global__ void gather_copy_cached(const unsigned int* __restrict__ store,  // [N, words] u32
                                              const int* __restrict__ slot_row,        // [S] i32
                                              const int* __restrict__ used,            // [1] i32
                                              const unsigned int* __restrict__ cache,  // [C, words] u32
                                              const int* __restrict__ cmark,           // [N] i32
                                              unsigned int* __restrict__ slots,        // [S, words] u32
                                              int* __restrict__ stats,                 // [2] i32 hits, misses
                                              int N, int S, int C, int words) {
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int n = min(*used, S);
  if (warp >= n) return;
  const int r = slot_row[warp];
  if (r < 0 || r >= N) return;
  int c = cmark[r];
#ifdef GATHER_CONTROL_CACHE_SWAP
  if (c >= 0) c = c ^ 1;  // a neighbouring cache entry
#endif
  const bool hit = c >= 0 && c < C;
  const unsigned int* src = hit ? cache + (long long)c * words : store + (long long)r * words;
  unsigned int* dst = slots + warp * words;
  for (int i = lane; i < words; i += 32) dst[i] = src[i];
  if (lane == 0) atomicAdd(&stats[hit ? 0 : 1], 1);
}

// forget: every cache entry emptied and its row unmarked.  grid: ceil(C / blockDim.x).
extern "C" __global__ void gather_forget(int* __restrict__ cache_rows,  // [C] i32
                                         int* __restrict__ cmark,       // [N] i32
                                         int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
#ifdef GATHER_CONTROL_FORGET_STALE
  if (c == 0) return;  // entry 0 stays marked
#endif
  if (c >= C) return;
  const int r = cache_rows[c];
  if (r >= 0 && r < N) cmark[r] = GATHER_FREE;
  cache_rows[c] = GATHER_FREE;
}

// keep: the first min(used, C) slots become the cache (after forget).  One warp a slot.
extern "C" __global__ void gather_keep(const unsigned int* __restrict__ slots,  // [S, words] u32
                                       const int* __restrict__ slot_row,        // [S] i32
                                       const int* __restrict__ used,            // [1] i32
                                       unsigned int* __restrict__ cache,        // [C, words] u32
                                       int* __restrict__ cache_rows,            // [C] i32
                                       int* __restrict__ cmark,                 // [N] i32
                                       int N, int S, int C, int words) {
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  int n = min(min(*used, S), C);
#ifdef GATHER_CONTROL_KEEP_DROP
  n = n - 1;  // the last slot is not kept
#endif
  if (warp >= n) return;
  const int r = slot_row[warp];
  if (r < 0 || r >= N) return;
  const unsigned int* src = slots + warp * words;
  unsigned int* dst = cache + warp * words;
  for (int i = lane; i < words; i += 32) dst[i] = src[i];
  if (lane == 0) {
    cache_rows[warp] = r;
    cmark[r] = (int)warp;
  }
}
