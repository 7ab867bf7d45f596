// pick.cu -- the DSA pick (cupyglm/backend/numpy_ops.py: pick): per row, the token list attention reads.
//
// Row t at position q sees v = (q + 1) / kpool complete pools.  v <= npools: dense, tokens 0..q.  Else the
// exact top npools pools by score, ties to the lower pool index, in ascending pool order, expanded to their
// kpool tokens each, then the tail tokens v*kpool..q of the incomplete pool; -1 after the count.
//
// Selection is an exact radix select over (score key, pool index): a score's key is a uint32 that orders as
// the score does (-0 ties +0; NaN below every number, as numpy's argsort(-s) puts NaN last).  Four passes
// of 8-bit digits, most significant first, each a 256-bin histogram (shared-memory integer atomics: order-
// free) of the keys that match the digits fixed so far, find T, the npools-th largest key, and `need`, how
// many pools of key T are picked.  One more pass over the pools in tiles of blockDim, in pool order, picks
// key > T, and key == T while fewer than `need` equal keys came before (ties to the lower index); block
// scans give each picked pool its slot.  O(v) per row, shared memory independent of v (no context cap).
//
// One block per row (grid = T), PICK_THREADS threads.  width >= npools * kpool (the launcher checks), so
// picked pools always fit; the dense list and the tail stop at width.  Scores of pools >= v (not yet
// visible; the caller leaves anything there) are never read.
//
// The row's own preconditions are checked here (no separate check launch) and counted into guard slots
// slot.. of `flags` (check_flag.cuh; slot < 0: the launcher checked them on the host): a negative position
// (slot), a list longer than width (slot + 1), a sparse row seeing more than P pools (slot + 2).  A row failing
// them still stays inside its tokens row and its scores row.
#include "common.cuh"
#include "check_flag.cuh"

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

#define PICK_THREADS 128
#define PICK_WARPS (PICK_THREADS / 32)
#define PICK_BINS 256

__device__ __forceinline__ unsigned pick_key(float s) {
  if (s != s) return 0u;                                   // NaN: below -inf (key >= 1 for every number)
  const unsigned b = __float_as_uint(s == 0.0f ? 0.0f : s);  // -0 -> +0: they tie
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix sum of x over the block (every thread calls it, blockDim == PICK_THREADS); *total: the sum.
__device__ __forceinline__ int pick_scan(int x, int* warp_tot, int* total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int inc = x;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(FULL_MASK, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) warp_tot[w] = inc;
  __syncthreads();
  int before = 0, all = 0;
  for (int i = 0; i < PICK_WARPS; ++i) {
    before += i < w ? warp_tot[i] : 0;
    all += warp_tot[i];
  }
  __syncthreads();                                         // warp_tot is rewritten by the next call
  *total = all;
  return before + inc - x;
}

extern "C" __global__ void __launch_bounds__(PICK_THREADS)
dsa_pick(const float* __restrict__ scores,    // [T, P] f32 pool scores
         const int* __restrict__ positions,   // [T] i32 position of each row
         int* __restrict__ tokens,            // [T, width] i32, -1 padded
         int* __restrict__ counts,            // [T] i32
         int P, int npools, int kpool, int width,
         unsigned int* __restrict__ flags,    // [slots, 2] u32 guard flags
         int slot) {
  __shared__ unsigned hist[PICK_BINS];
  __shared__ int warp_tot[PICK_WARPS];
  __shared__ unsigned s_digit;
  __shared__ int s_need;
  const int t = blockIdx.x;
  const int tid = threadIdx.x;
  const int q = positions[t];
  pick_guard(t, q, P, npools, kpool, width, flags, slot);
  const int v = (q + 1) / kpool;
  int* out = tokens + (long long)t * width;
  if (v <= npools) {                                   // dense: every token so far (block-uniform branch)
    for (int i = tid; i < width; i += blockDim.x) out[i] = i <= q ? i : -1;
    if (tid == 0) counts[t] = q + 1;
    return;
  }
  const float* s = scores + (long long)t * P;
  // The launcher guarantees v <= P (sim checks it on the host); never read past the row regardless.
  const int vr = min(v, P);
  unsigned prefix = 0u, mask = 0u;
  int need = npools;                                   // keys still to take among those matching prefix
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < PICK_BINS; i += blockDim.x) hist[i] = 0u;
    __syncthreads();
    for (int p = tid; p < vr; p += blockDim.x) {
      const unsigned k = pick_key(s[p]);
      if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {                                    // the digit holding the need-th largest matching key
      unsigned acc = 0u;
      int d = PICK_BINS - 1;
      for (; d > 0; --d) {
        if (acc + hist[d] >= (unsigned)need) break;
        acc += hist[d];
      }
      s_digit = (unsigned)d;
      s_need = need - (int)acc;
    }
    __syncthreads();
    prefix |= s_digit << shift;
    mask |= 255u << shift;
    need = s_need;
    __syncthreads();                                   // s_digit, s_need read before the next pass writes them
  }
  const unsigned T = prefix;
  int slot0 = 0, eq0 = 0;
  for (int base = 0; base < vr; base += blockDim.x) {  // block-uniform trip count
    const int p = base + tid;
    const unsigned k = p < vr ? pick_key(s[p]) : 0u;
    const int gt = (p < vr && k > T) ? 1 : 0;
    const int eq = (p < vr && k == T) ? 1 : 0;
    int eq_tile, n_tile;
    const int eq_rank = eq0 + pick_scan(eq, warp_tot, &eq_tile);
    const int pk = (gt || (eq && eq_rank < need)) ? 1 : 0;
    const int slot = slot0 + pick_scan(pk, warp_tot, &n_tile);
    if (pk)
      for (int i = 0; i < kpool; ++i) out[slot * kpool + i] = p * kpool + i;
    eq0 += eq_tile;
    slot0 += n_tile;
  }
  const int base = npools * kpool;
  const int ntail = q + 1 - v * kpool;
  for (int i = tid; base + i < width; i += blockDim.x) out[base + i] = i < ntail ? v * kpool + i : -1;
  if (tid == 0) counts[t] = base + ntail;
}
