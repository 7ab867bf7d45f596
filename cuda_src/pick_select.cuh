// pick_select.cuh -- the exact radix select both pick kernels run (pick.cu), over a list of uint32 keys in pool
// order: find T, the npools-th largest key, and `need`, how many keys equal to T are picked (the first `need` of
// them in list order: ties to the lower pool), then number the picked keys in list order.
//
// Blocks of PICK_THREADS threads.  Four passes of 8-bit digits, most significant first, each a PICK_BINS-bin
// histogram (shared-memory integer atomics: order-free) of the keys that match the digits fixed so far; the
// digit is found by one block scan over the bins (PICK_BINS == PICK_THREADS: a bin a thread).
#pragma once

#define PICK_THREADS 256
#define PICK_WARPS (PICK_THREADS / 32)
#define PICK_BINS 256
static_assert(PICK_BINS == PICK_THREADS, "pick_hist_clear and pick_digit: one bin a thread");

struct PickShared {
  unsigned hist[PICK_BINS];
  int warp_tot[PICK_WARPS];
  unsigned digit;                                // the pass's digit of T
  int need;                                      // keys equal to T still to take after that digit
  int ties;                                      // keys in the digit's bin (after the last pass: keys == T)
  int run_gt[PICK_WARPS], run_eq[PICK_WARPS];    // pick_warp_base: each warp's run counts
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

// Numbering: a block's list is split into one run a warp, in list order (warp w's run before warp w + 1's); a
// warp walks its run 32 keys a step, lanes in list order.  pick_ballot counts a step's keys > T and == T before
// each lane (ballots: no barrier); pick_warp_base gives each warp the counts of the runs before its own.

struct PickCount {
  int gt, eq;                                    // keys > T and == T before (the step, the run, ...)
};

// This lane's key in a step (in = it is in the list): its slot among the picked keys (list order) or -1, given
// *c, the counts before the step (advanced past it).  ties: the list's keys equal to T.
__device__ __forceinline__ int pick_ballot(bool in, unsigned k, unsigned T, int need, int ties, PickCount* c) {
  const bool gt = in && k > T, eq = in && k == T;
  const unsigned gm = __ballot_sync(FULL_MASK, gt), em = __ballot_sync(FULL_MASK, eq);
  const unsigned below = (1u << (threadIdx.x & 31)) - 1u;
  const int gt_b = c->gt + __popc(gm & below), eq_b = c->eq + __popc(em & below);
  c->gt += __popc(gm);
  c->eq += __popc(em);
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

// run: this warp's counts over its whole run (lane-uniform) -> the counts of the runs of the warps before it.
__device__ __forceinline__ PickCount pick_warp_base(PickShared& sh, PickCount run) {
  const int w = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    sh.run_gt[w] = run.gt;
    sh.run_eq[w] = run.eq;
  }
  __syncthreads();
  PickCount b = {0, 0};
  for (int i = 0; i < w; ++i) {
    b.gt += sh.run_gt[i];
    b.eq += sh.run_eq[i];
  }
  __syncthreads();                                         // read before the arrays are written again
  return b;
}
