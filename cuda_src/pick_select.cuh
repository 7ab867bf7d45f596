// pick_select.cuh -- the exact radix select both pick kernels run (pick.cu), over a list of uint32 keys in pool
// order: find T, the npools-th largest key, and `need`, how many keys equal to T are picked (the first `need` of
// them in list order: ties to the lower pool), then number the picked keys in list order, tile by tile.
//
// Blocks of PICK_THREADS threads.  Four passes of 8-bit digits, most significant first, each a PICK_BINS-bin
// histogram (shared-memory integer atomics: order-free) of the keys that match the digits fixed so far; the
// digit is found by one block scan over the bins (PICK_BINS == PICK_THREADS: a bin a thread).
#pragma once

#define PICK_THREADS 256
#define PICK_WARPS (PICK_THREADS / 32)
#define PICK_BINS 256

struct PickShared {
  unsigned hist[PICK_BINS];
  int warp_tot[PICK_WARPS];
  unsigned digit;                                // the pass's digit of T
  int need;                                      // keys equal to T still to take after that digit
  int ties;                                      // keys in the digit's bin (after the last pass: keys == T)
};

// A uint32 that orders as the score does: -0 ties +0; NaN below every number (numpy's argsort(-s) puts NaN last).
__device__ __forceinline__ unsigned pick_key(float s) {
  if (s != s) return 0u;                                   // NaN: below -inf (key >= 1 for every number)
  const unsigned b = __float_as_uint(s == 0.0f ? 0.0f : s);  // -0 -> +0: they tie
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix sum of x over the block in thread order (every thread calls it); *total: the block's sum.
__device__ __forceinline__ int pick_scan(int x, PickShared& sh, int* total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int inc = x;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(FULL_MASK, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) sh.warp_tot[w] = inc;
  __syncthreads();
  int before = 0, all = 0;
  for (int i = 0; i < PICK_WARPS; ++i) {
    before += i < w ? sh.warp_tot[i] : 0;
    all += sh.warp_tot[i];
  }
  __syncthreads();                                         // warp_tot is rewritten by the next call
  *total = all;
  return before + inc - x;
}

__device__ __forceinline__ void pick_hist_clear(PickShared& sh) {
  sh.hist[threadIdx.x] = 0u;
  __syncthreads();
}

// After a pass's histogram: the digit whose bin holds the need-th largest matching key (bins summed from the
// top, one bin a thread); updates prefix/mask/need for the next pass and *ties, the keys in that digit's bin (after
// the last pass: the keys equal to T).  Needs need <= the keys counted.
__device__ __forceinline__ void pick_digit(PickShared& sh, int shift, unsigned* prefix, unsigned* mask,
                                           int* need, int* ties) {
  const int d = PICK_BINS - 1 - (int)threadIdx.x;
  const int c = (int)sh.hist[d];
  int tot;
  const int above = pick_scan(c, sh, &tot);                // keys in bins above d
  if (above < *need && above + c >= *need) {               // exactly one thread
    sh.digit = (unsigned)d;
    sh.need = *need - above;
    sh.ties = c;
  }
  __syncthreads();
  *prefix |= sh.digit << shift;
  *mask |= 255u << shift;
  *need = sh.need;
  *ties = sh.ties;
  __syncthreads();                                         // read before the next pass writes them
}

__device__ __forceinline__ void pick_count(PickShared& sh, unsigned k, unsigned prefix, unsigned mask, int shift) {
  if ((k & mask) == prefix) atomicAdd(&sh.hist[(k >> shift) & 255u], 1u);
}

// One tile of the numbering pass: this thread's key (in = it is in the list) against T; ties: the list's keys equal
// to T; *gt0, *eq0: keys > T and == T before the tile (updated).  Returns the key's slot among the picked keys
// (list order), or -1 when it is not picked.
__device__ __forceinline__ int pick_slot(PickShared& sh, bool in, unsigned k, unsigned T, int need, int ties,
                                         int* gt0, int* eq0) {
  const int gt = (in && k > T) ? 1 : 0, eq = (in && k == T) ? 1 : 0;
  int tot;
  const int ex = pick_scan(gt | (eq << 16), sh, &tot);     // a tile holds < 2^16 keys: two counts in one scan
  const int gt_b = *gt0 + (ex & 0xffff), eq_b = *eq0 + (ex >> 16);
  *gt0 += tot & 0xffff;
  *eq0 += tot >> 16;
#ifdef PICK_PLANT_TIE_HIGH
  const int skip = ties - need;                            // planted: the last `need` equal keys are taken
  if (gt) return gt_b + max(0, eq_b - skip);
  return (eq && eq_b >= skip) ? gt_b + eq_b - skip : -1;
#else
  (void)ties;
  if (gt) return gt_b + min(eq_b, need);
  return (eq && eq_b < need) ? gt_b + eq_b : -1;
#endif
}
