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

// ---- the row cache of decode and verify segments (<= 16 rows): each layer keeps the rows its recent such
// segments gathered, direct-mapped: row r may only sit in entry r % C.  Per layer: cache [C, words] u32 rows,
// cache_rows [C] i32 (-1 empty), cmark [N] i32 (a row's entry, else -1; cmark[r] = e exactly when
// cache_rows[e] = r).  A segment's misses take their entries (of a clash the largest row wins), evicting the
// rows there; hits stay.  What the cache holds after a call depends on the rows alone, not on the atomics'
// order.  A cached row always holds its store row's bytes: the cache is forgotten whenever pages change hands,
// and the rows a call writes leave the cache before its gather (invalidate), so they never hit.  Order per
// segment: mark, invalidate, copy_cached, remap, evict, claim, keep, unmark.

// invalidate: the rows this call wrote leave the cache.  grid: ceil(n / blockDim.x), one thread a row.
extern "C" __global__ void gather_invalidate(const int* __restrict__ written,  // [n] i32 store rows written
                                             int* __restrict__ cache_rows,     // [C] i32
                                             int* __restrict__ cmark,          // [N] i32
                                             int n, int N, int C) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
#ifdef GATHER_CONTROL_WRITTEN_HIT
  return;  // a written row stays cached with its old bytes
#endif
  if (i >= n) return;
  const int r = written[i];
  if (r < 0 || r >= N) return;
  const int c = cmark[r];
  if (c < 0 || c >= C) return;
  cache_rows[c] = GATHER_FREE;
  cmark[r] = GATHER_FREE;
}

// copy_cached: like gather_copy, but a row the cache holds comes from the cache (device memory);
// slot_miss[s] = 1 for a miss, 0 for a hit; hits and misses counted in stats[0], stats[1].
extern "C" __global__ void gather_copy_cached(const unsigned int* __restrict__ store,  // [N, words] u32
                                              const int* __restrict__ slot_row,        // [S] i32
                                              const int* __restrict__ used,            // [1] i32
                                              const unsigned int* __restrict__ cache,  // [C, words] u32
                                              const int* __restrict__ cmark,           // [N] i32
                                              unsigned int* __restrict__ slots,        // [S, words] u32
                                              int* __restrict__ stats,                 // [2] i32 hits, misses
                                              int* __restrict__ slot_miss,             // [S] i32
                                              int N, int S, int C, int words) {
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int n = min(*used, S);
  if (warp >= n) return;
  const int r = slot_row[warp];
  if (r < 0 || r >= N) {
    if (lane == 0) slot_miss[warp] = 0;
    return;
  }
  int c = cmark[r];
#ifdef GATHER_CONTROL_CACHE_SWAP
  if (c >= 0) c = c ^ 1;  // a neighbouring cache entry
#endif
  const bool hit = c >= 0 && c < C;
  const unsigned int* src = hit ? cache + (long long)c * words : store + (long long)r * words;
  unsigned int* dst = slots + warp * words;
  for (int i = lane; i < words; i += 32) dst[i] = src[i];
  if (lane == 0) {
    atomicAdd(&stats[hit ? 0 : 1], 1);
    slot_miss[warp] = hit ? 0 : 1;
  }
}

// evict: the entry of every miss gives up its row.  grid: ceil(G / blockDim.x), a thread a slot.
extern "C" __global__ void gather_evict(const int* __restrict__ slot_row,   // [S] i32
                                        const int* __restrict__ used,       // [1] i32
                                        const int* __restrict__ slot_miss,  // [S] i32
                                        int* __restrict__ cache_rows,       // [C] i32
                                        int* __restrict__ cmark,            // [N] i32
                                        int N, int S, int C) {
  const long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= min(*used, S) || !slot_miss[s]) return;
  const int r = slot_row[s];
  if (r < 0 || r >= N) return;
  const int e = r % C;
  const int old = cache_rows[e];  // every thread of this entry reads a row it evicts, or -1
#ifndef GATHER_CONTROL_EVICT_STALE
  if (old >= 0 && old < N) cmark[old] = GATHER_FREE;
#endif
  cache_rows[e] = GATHER_FREE;
}

// claim: every miss bids for its entry; the largest row wins (after evict).  A thread a slot.
extern "C" __global__ void gather_claim(const int* __restrict__ slot_row,   // [S] i32
                                        const int* __restrict__ used,       // [1] i32
                                        const int* __restrict__ slot_miss,  // [S] i32
                                        int* __restrict__ cache_rows,       // [C] i32
                                        int N, int S, int C) {
  const long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= min(*used, S) || !slot_miss[s]) return;
  const int r = slot_row[s];
  if (r < 0 || r >= N) return;
  atomicMax(&cache_rows[r % C], r);
}

// keep: each miss that won its entry copies its slot there and marks its row (after claim).  One warp a slot.
extern "C" __global__ void gather_keep(const unsigned int* __restrict__ slots,  // [S, words] u32
                                       const int* __restrict__ slot_row,        // [S] i32
                                       const int* __restrict__ used,            // [1] i32
                                       const int* __restrict__ slot_miss,       // [S] i32
                                       unsigned int* __restrict__ cache,        // [C, words] u32
                                       const int* __restrict__ cache_rows,      // [C] i32
                                       int* __restrict__ cmark,                 // [N] i32
                                       int N, int S, int C, int words) {
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= min(*used, S) || !slot_miss[warp]) return;
  const int r = slot_row[warp];
  if (r < 0 || r >= N) return;
  const int e = r % C;
#ifdef GATHER_CONTROL_KEEP_DROP
  if (e & 1) return;  // misses of odd entries are not copied
#endif
  if (cache_rows[e] != r) return;  // another miss won the entry
  const unsigned int* src = slots + warp * words;
  unsigned int* dst = cache + (long long)e * words;
  for (int k = lane; k < words; k += 32) dst[k] = src[k];
  if (lane == 0) cmark[r] = e;
}
