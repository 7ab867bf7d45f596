// pick.cu -- the DSA pick (cupyglm/backend/numpy_ops.py: pick): per row, the token list attention reads.
//
// Row t at position q sees v = (q + 1) / kpool complete pools.  v <= npools: dense, tokens 0..q.  Else the
// exact top npools pools by score, ties to the lower pool index, in ascending pool order, expanded to their
// kpool tokens each, then the tail tokens v*kpool..q of the incomplete pool; -1 after the count.
//
// Selection is exact (pick_select.cuh: a radix select over (score key, pool index), ties to the earlier key in
// list order).  The row's pools are split into parts of PICK_PART pools by pool index alone (part b: pools
// b*PICK_PART.., never depending on the batch or the grid): dsa_pick runs one block a (row, part), holding its
// part's keys in registers.  A row of one part (v <= PICK_PART) is finished there.  A longer row's part keeps
// its top min(npools, PICK_PART) pools (all of them when it has no more), ascending, as (key, pool) candidates
// at a fixed place in the row's scratch; every pool of the row's top npools is among its part's kept pools
// (the same order ranks it within the part), so dsa_pick_merge (one block a row) selects the row's top npools
// from the candidates read in part order, which is pool order: the same ids as a select over all v pools.
// Shared memory is independent of v (no context cap); only the launcher's grid depends on P.
//
// width >= npools * kpool (the launcher checks), so picked pools always fit; the dense list and the tail stop
// at width.  Scores of pools >= v (not yet visible; the caller leaves anything there) are never read.
//
// The row's own preconditions are checked by dsa_pick's part-0 block (no separate check launch) and counted
// into guard slots slot.. of `flags` (check_flag.cuh; slot < 0: the launcher checked them on the host): a
// negative position (slot), a list longer than width (slot + 1), a sparse row seeing more than P pools
// (slot + 2).  A row failing them still stays inside its tokens row, its scores row and its scratch row.
#include "common.cuh"
#include "check_flag.cuh"
#include "pick_select.cuh"

// Thread 0 of row t's block: count its failed preconditions (kernels/guards.py: PICK_MESSAGES).
static __device__ __forceinline__ void pick_guard(int t, int q, int P, int npools, int kpool, int width,
                                                  unsigned int* flags, int slot) {
  if (slot < 0 || threadIdx.x != 0) return;
  if (q < 0) {
    check_flag(flags, slot, t);
    return;
  }
  const long long v = ((long long)q + 1) / kpool;
  const bool sparse = v > npools;
  const long long need = sparse ? (long long)npools * kpool + ((long long)q + 1 - v * kpool) : (long long)q + 1;
#ifdef PICK_PLANT_FLAG
  if (need > width + 1) check_flag(flags, slot + 1, t);         // planted: one slot too many passes
#else
  if (need > width) check_flag(flags, slot + 1, t);
#endif
  if (sparse && v > P) check_flag(flags, slot + 2, t);
}

#define PICK_PER 16                                  // keys a thread holds in dsa_pick
#define PICK_PART (PICK_THREADS * PICK_PER)          // pools a part: cupyglm/kernels/ops_pick.py PART

// Candidates a part of a multi-part row keeps (its scratch stride): min(npools, PICK_PART).
__device__ __forceinline__ int pick_keep(int npools) { return min(npools, PICK_PART); }

__device__ __forceinline__ void pick_emit(int* out, int slot, int pool, int kpool) {
  for (int i = 0; i < kpool; ++i) out[slot * kpool + i] = pool * kpool + i;
}

// After the picked pools: the tail tokens of the incomplete pool, -1 to width, and the row's count.
__device__ __forceinline__ void pick_tail(int* out, int* counts, int t, int q, int v, int npools, int kpool,
                                          int width) {
  const int base = npools * kpool;
  const int ntail = q + 1 - v * kpool;
  for (int i = threadIdx.x; base + i < width; i += blockDim.x) out[base + i] = i < ntail ? v * kpool + i : -1;
  if (threadIdx.x == 0) counts[t] = base + ntail;
}

// Grid (T, parts): part b of row t selects among pools [b * PICK_PART, min(v, (b + 1) * PICK_PART)).
extern "C" __global__ void __launch_bounds__(PICK_THREADS)
dsa_pick(const float* __restrict__ scores,    // [T, P] f32 pool scores
         const int* __restrict__ positions,   // [T] i32 position of each row
         int* __restrict__ tokens,            // [T, width] i32, -1 padded
         int* __restrict__ counts,            // [T] i32
         unsigned* __restrict__ cand_keys,    // [T, stride] u32: part b's kept keys at b * keep (multi-part rows)
         int* __restrict__ cand_pools,        // [T, stride] i32: their pool ids
         int P, int npools, int kpool, int width,
         int stride,                          // parts * keep, parts = ceil(P / PICK_PART) (0 when parts == 1)
         unsigned int* __restrict__ flags,    // [slots, 2] u32 guard flags
         int slot) {
  __shared__ PickShared sh;
  const int t = blockIdx.x, part = blockIdx.y, tid = threadIdx.x;
  const int q = positions[t];
  if (part == 0) pick_guard(t, q, P, npools, kpool, width, flags, slot);
  const int v = (q + 1) / kpool;
  int* out = tokens + (long long)t * width;
  if (v <= npools) {                                   // dense: every token so far (block-uniform branch)
    if (part != 0) return;
    for (int i = tid; i < width; i += blockDim.x) out[i] = i <= q ? i : -1;
    if (tid == 0) counts[t] = q + 1;
    return;
  }
  // The launcher guarantees v <= P (sim checks it on the host); never read past the row regardless.
  const int vr = min(v, P);
#ifdef PICK_PLANT_RANGE
  const int lo = part * PICK_PART + (part > 0 ? 1 : 0);   // planted: a later part's range starts one pool late
#else
  const int lo = part * PICK_PART;
#endif
  if (lo >= vr) return;                                // block-uniform: this row has fewer parts
  const int n = min(vr - lo, PICK_PART);
  const float* s = scores + (long long)t * P + lo;
  const int r0 = (tid >> 5) * (32 * PICK_PER) + (tid & 31);   // a warp's run: 32 * PICK_PER pools in a row
  unsigned key[PICK_PER];                              // key j: pool lo + r0 + 32 j (coalesced)
#pragma unroll
  for (int j = 0; j < PICK_PER; ++j) {
    const int i = r0 + 32 * j;
    key[j] = i < n ? pick_key(s[i]) : 0u;
  }
  unsigned T = 0u;                                     // a part of at most npools pools keeps them all
  int need = n, ties = n;
  if (n > npools) {
    unsigned prefix = 0u, mask = 0u;
    need = npools;
    for (int shift = 24; shift >= 0; shift -= 8) {
      pick_hist_clear(sh);
#pragma unroll
      for (int j = 0; j < PICK_PER; ++j)
        if (r0 + 32 * j < n) pick_count(sh, key[j], prefix, mask, shift);
      __syncthreads();
      pick_digit(sh, shift, &prefix, &mask, &need, &ties);
    }
    T = prefix;
  }
  const bool single = vr <= PICK_PART;                 // the row's only part: its picks are the row's
  const long long c0 = (long long)t * stride + (long long)part * pick_keep(npools);
  PickCount c = {0, 0};
#pragma unroll
  for (int j = 0; j < PICK_PER; ++j) pick_ballot(r0 + 32 * j < n, key[j], T, need, ties, &c);
  c = pick_warp_base(sh, c);
#pragma unroll
  for (int j = 0; j < PICK_PER; ++j) {
    const int i = r0 + 32 * j;
    const int sl = pick_ballot(i < n, key[j], T, need, ties, &c);
    if (sl < 0) continue;
    if (single) {
      pick_emit(out, sl, lo + i, kpool);
    } else {
      cand_keys[c0 + sl] = key[j];
      cand_pools[c0 + sl] = lo + i;
    }
  }
  if (single) pick_tail(out, counts, t, q, v, npools, kpool, width);
}

// Where candidate i of a row (in part order) sits in its scratch row: part i / keep, place i % keep.
__device__ __forceinline__ int pick_at(int i, int parts, int keep, int last) {
#ifdef PICK_PLANT_MERGE_ORDER
  if (i < last) return (parts - 1) * keep + i;         // planted: the parts merged last part first
  const int r = i - last;
  return (parts - 2 - r / keep) * keep + r % keep;
#else
  (void)parts, (void)keep, (void)last;
  return i;
#endif
}

// Grid (T,): a multi-part row's top npools among its parts' candidates, read in part order (= pool order).
extern "C" __global__ void __launch_bounds__(PICK_THREADS)
dsa_pick_merge(const unsigned* __restrict__ cand_keys,   // [T, stride] u32 (dsa_pick's)
               const int* __restrict__ cand_pools,       // [T, stride] i32
               const int* __restrict__ positions,        // [T] i32
               int* __restrict__ tokens,                 // [T, width] i32, -1 padded
               int* __restrict__ counts,                 // [T] i32
               int P, int npools, int kpool, int width, int stride) {
  __shared__ PickShared sh;
  const int t = blockIdx.x, tid = threadIdx.x;
  const int q = positions[t];
  const int v = (q + 1) / kpool;
  if (v <= npools) return;                             // dense: dsa_pick wrote it
  const int vr = min(v, P);
  if (vr <= PICK_PART) return;                         // one part: dsa_pick wrote it
  const int keep = pick_keep(npools);
  const int parts = (vr + PICK_PART - 1) / PICK_PART;
  const int last = min(vr - (parts - 1) * PICK_PART, keep);   // the last part's candidates
  const int n = (parts - 1) * keep + last;             // >= npools: every part but the last keeps keep
  const unsigned* ck = cand_keys + (long long)t * stride;
  const int* cp = cand_pools + (long long)t * stride;
  unsigned prefix = 0u, mask = 0u;
  int need = npools, ties = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    pick_hist_clear(sh);
#pragma unroll 8
    for (int i = tid; i < n; i += PICK_THREADS)          // any order: the histogram is order-free
      pick_count(sh, ck[pick_at(i, parts, keep, last)], prefix, mask, shift);
    __syncthreads();
    pick_digit(sh, shift, &prefix, &mask, &need, &ties);
  }
  int* out = tokens + (long long)t * width;
  const int run = (n + PICK_WARPS - 1) / PICK_WARPS;   // warp w numbers candidates [w * run, (w + 1) * run)
  const int r0 = (tid >> 5) * run, r1 = min(n, r0 + run);
  PickCount c = {0, 0};
#pragma unroll 8
  for (int i0 = r0; i0 < r1; i0 += 32) {               // warp-uniform trip count
    const int i = i0 + (tid & 31);
    pick_ballot(i < r1, i < r1 ? ck[pick_at(i, parts, keep, last)] : 0u, prefix, need, ties, &c);
  }
  c = pick_warp_base(sh, c);
#pragma unroll 8
  for (int i0 = r0; i0 < r1; i0 += 32) {
    const int i = i0 + (tid & 31);
    const int at = i < r1 ? pick_at(i, parts, keep, last) : 0;
    const int sl = pick_ballot(i < r1, i < r1 ? ck[at] : 0u, prefix, need, ties, &c);
    if (sl >= 0) pick_emit(out, sl, cp[at], kpool);
  }
  pick_tail(out, counts, t, q, v, npools, kpool, width);
}
