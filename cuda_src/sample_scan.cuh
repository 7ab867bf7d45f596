// sample_scan.cuh -- the left-to-right float32 prefix sums of sample_sort.cuh computed by the whole block, bit
// for bit the sequential ones (acc = fl(acc + y[i]), i = 0, 1, ...; every y[i] >= 0).
//
// While acc stays in one binade [2^a, 2^(a+1)) with ulp u, acc = A u with A an integer in [2^23, 2^24), and
// fl(acc + y) = (A + c) u where, with y / u = M + f (M an integer, 0 <= f < 1): c = M for f < 1/2, M + 1 for
// f > 1/2, and for f = 1/2 the even one of A + M, A + M + 1 (round half to even: the parity of A decides).
// This holds whenever the exact sum stays below 2^24 u, i.e. A + M <= 2^24 - 1 (a result of 2^24 u is then
// exact too).  So each term is a map a -> a + c[a & 1] on the integer running sum; these maps compose to maps of
// the same form, and a block scan of them over a window of blockDim.x terms gives every prefix exactly.  The
// first term whose prefix would leave the binade (A + M >= 2^24, or a y / u too large to scale) is added by one
// thread as the reference adds it, and the next window starts after it at the new ulp.
//
// Controls: SAMPLE_CTL_SCAN_RESUME_LATE (contract: the window after a binade change starts one term late);
// SAMPLE_CTL_SCAN_HALF_UP (tests: a half-way term always rounds up, ignoring the parity).
#pragma once

#ifdef SAMPLE_CTL_SCAN_RESUME_LATE
#define SMP_SCAN_LATE 1
#else
#define SMP_SCAN_LATE 0
#endif

struct SmpMap {                         // a -> a + c0 for even a, a + c1 for odd a
  unsigned long long c0, c1;
};

// f, then g.
static __device__ __forceinline__ SmpMap smp_then(SmpMap f, SmpMap g) {
  SmpMap h;
  h.c0 = f.c0 + ((f.c0 & 1ull) ? g.c1 : g.c0);     // an even a becomes a + f.c0, of f.c0's parity
  h.c1 = f.c1 + ((f.c1 & 1ull) ? g.c0 : g.c1);     // an odd a becomes a + f.c1, odd iff f.c1 is even
  return h;
}

static __device__ __forceinline__ SmpMap smp_shfl_up(SmpMap v, int off) {
  SmpMap o;
  o.c0 = __shfl_up_sync(FULL_MASK, v.c0, off);
  o.c1 = __shfl_up_sync(FULL_MASK, v.c1, off);
  return o;
}

// The inclusive composition of the block's maps in thread order; wmap: [32] shared.
static __device__ __forceinline__ SmpMap smp_block_compose(SmpMap v, SmpMap* wmap) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int off = 1; off < 32; off <<= 1) {
    const SmpMap o = smp_shfl_up(v, off);
    if (lane >= off) v = smp_then(o, v);
  }
  if (lane == 31) wmap[warp] = v;
  __syncthreads();
  if (warp == 0) {
    SmpMap w = lane < nw ? wmap[lane] : SmpMap{0ull, 0ull};
    for (int off = 1; off < 32; off <<= 1) {
      const SmpMap o = smp_shfl_up(w, off);
      if (lane >= off) w = smp_then(o, w);
    }
    wmap[lane] = w;
  }
  __syncthreads();
  const SmpMap r = warp ? smp_then(wmap[warp - 1], v) : v;
  __syncthreads();                                    // wmap is reused by the next call
  return r;
}

// The sequential sum of y[0..m) from 0, stopped at a window's start once acc >= stop_at or acc + bound(j) / div
// == acc (bound(j) / div >= every y[i], i >= j: no later term changes acc); out (nullable, may be y) receives
// the prefix sums out[i], i < *reached.  Called by the whole block; returns acc (block-uniform).
template <class Bound>
static __device__ float smp_scan(const float* y, int m, float* out, float stop_at, const Bound& bound, float div,
                                 SmpShared& sh, int* reached, int* windows) {
  const int tid = threadIdx.x, nt = blockDim.x;
  float acc = 0.0f;
  int j = 0, win = 0;
  while (j < m) {                                     // acc, j: block-uniform
    if (acc >= stop_at || acc + bound(j) / div == acc) break;
    const unsigned ab = __float_as_uint(acc);
    const int be = (int)((ab >> 23) & 255u);
    if (be < 24 || be == 255) {                       // 0, tiny or not finite: one thread adds until acc scales
      if (tid == 0) {
        float a = acc;
        int i = j;
        do {
          a = a + y[i];
          if (out) out[i] = a;
          ++i;
        } while (i < m && !(a >= 0x1p-103f && a < INFINITY) && !(a >= stop_at));
        sh.scan_acc = a;
        sh.scan_j = i;
      }
      __syncthreads();
      acc = sh.scan_acc;
      j = sh.scan_j;
      __syncthreads();
      continue;
    }
    ++win;
    const float ulp = __uint_as_float((unsigned)(be - 23) << 23);
    const float inv = __uint_as_float((unsigned)(277 - be) << 23);   // 1 / ulp
    const unsigned long long A0 = (unsigned long long)((ab & 0x7fffffu) | 0x800000u);
    const int k = j + tid;
    const float yv = k < m ? y[k] : 0.0f;
    const float mf = yv * inv;                        // exact (a power-of-two scaling) unless it underflows
    const int big = !(mf < 0x1p24f);                  // too large to scale, or not finite
    const float fl = big ? 0.0f : floorf(mf);
    const unsigned long long M = big ? (1ull << 24) : (unsigned long long)fl;
    const float f = big ? 0.0f : mf - fl;             // exact
    SmpMap map{0ull, 0ull};
    if (k < m) {
      if (f < 0.5f) map = SmpMap{M, M};
      else if (f > 0.5f) map = SmpMap{M + 1ull, M + 1ull};
#ifdef SAMPLE_CTL_SCAN_HALF_UP
      else map = SmpMap{M + 1ull, M + 1ull};
#else
      else map = SmpMap{M + (M & 1ull), M + 1ull - (M & 1ull)};   // the even one of a + M, a + M + 1
#endif
    }
    const SmpMap inc = smp_block_compose(map, reinterpret_cast<SmpMap*>(sh.whist));   // whist: 256 u64, free here
    const unsigned long long after = A0 + ((A0 & 1ull) ? inc.c1 : inc.c0);
    sh.key[tid] = after;
    if (tid == 0) sh.scan_j = nt;
    __syncthreads();
    const unsigned long long before = tid ? sh.key[tid - 1] : A0;
    const int bad = k < m && (big || before + M >= (1ull << 24));
    if (bad) atomicMin(&sh.scan_j, tid);
    __syncthreads();
    const int ks = sh.scan_j;                          // the first term that leaves the binade, or nt
    if (out && tid < ks && k < m) out[k] = (float)after * ulp;   // after <= 2^24: exact
    if (tid == ks) {                                  // added as the reference adds it
      const float a = (float)before * ulp + yv;
      if (out) out[k] = a;
      sh.scan_acc = a;
    }
    __syncthreads();
    if (ks < nt) {
      acc = sh.scan_acc;
      j += ks + 1 + SMP_SCAN_LATE;
    } else {
      const int last = m - j < nt ? m - j : nt;
      acc = (float)sh.key[last - 1] * ulp;
      j += last;
    }
    __syncthreads();                                  // sh.key, sh.scan_* are rewritten by the next window
  }
  *reached = j;
  *windows = win;
  return acc;
}
