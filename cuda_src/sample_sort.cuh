// sample_sort.cuh -- the sorted path of sample.cu (included by it after sample_tile.cuh): every kept id in
// the order (x / t desc, id asc), then the reference's sums left to right with the exact early exit.
//
//  1. Sort: a stable LSD radix sort of the row's keys (smp_key) over their high word (the ordered value bits),
//     8-bit digits, starting from id order, so equal values keep ascending ids and the result is the full
//     64-bit key order.  Each thread owns a contiguous segment of the row; a pass counts its segment's digits
//     into counts[digit][thread], an exclusive scan in (digit, thread) order gives each segment's first slot
//     for each digit, and each thread scatters its segment in order (stable).  A pass whose digit is the same
//     in every key is skipped: the order already holds.
//  2. e = exp_f32(s - s0) over the first n, a bound per chunk of the sorted order (bsuf[c] >= every e in
//     chunks c, c + 1, ...), so that from index j on no term exceeds B(j) = bsuf[j / C].
//  3. S, the top-p prefix c and the draw's q as exact block scans (sample_scan.cuh: the sequential float32
//     sums' bits), each stopped once acc + B == acc (then no later term changes it: rounded addition is
//     monotone and 0 <= term <= B); c's and q's prefixes are kept, so the top-p cut and the draw (the first i
//     with c[i] >= top_p, q[i] > r) are parallel searches and the min-p count a parallel count.
//
// Controls (contract): SAMPLE_CTL_SORT_UNSTABLE (each segment scatters last to first: equal values go to the
// higher id first), SAMPLE_CTL_SORT_SKIP_LOW (the lowest digit's pass is skipped: values that differ only
// there stay in id order), SAMPLE_CTL_SORT_EXIT_EARLY (the bound leaves out the rest of the current chunk).
#pragma once

#include "sample_scan.cuh"

#define SMP_CHUNKS 2048                 // bound chunks (fit sh.b): C = max(256, ceil(n / SMP_CHUNKS)) ids each

#ifdef SAMPLE_CTL_SORT_EXIT_EARLY
#define SMP_SORT_SKIP 1
#else
#define SMP_SORT_SKIP 0
#endif

// Exclusive prefix sum of v over the block in thread order (blockDim.x a multiple of 32); wsum: [32] shared.
static __device__ __forceinline__ unsigned smp_block_exscan(unsigned v, unsigned* wsum) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  unsigned s = v;
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned o = __shfl_up_sync(FULL_MASK, s, off);
    if (lane >= off) s += o;
  }
  if (lane == 31) wsum[warp] = s;
  __syncthreads();
  if (warp == 0) {
    unsigned w = lane < nw ? wsum[lane] : 0u;
    for (int off = 1; off < 32; off <<= 1) {
      const unsigned o = __shfl_up_sync(FULL_MASK, w, off);
      if (lane >= off) w += o;
    }
    wsum[lane] = w;                                   // inclusive over warps
  }
  __syncthreads();
  const unsigned r = (warp ? wsum[warp - 1] : 0u) + s - v;
  __syncthreads();                                    // wsum is reused by the next call
  return r;
}

// Step 1: the row's V keys sorted ascending; returns the buffer holding them (buf or buf + V).  buf: [2, V]
// u64, counts: [256, blockDim.x] u32, both this row's global scratch.  Called by the whole block.
static __device__ unsigned long long* smp_radix_sort(const float* __restrict__ x, int V, float t,
                                                     unsigned long long* buf, unsigned* counts, SmpShared& sh,
                                                     int* passes) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int L = (V + nt - 1) / nt;
  const int lo = tid * L < V ? tid * L : V, hi = lo + L < V ? lo + L : V;   // this thread's segment
  unsigned long long* src = buf;
  unsigned long long* dst = buf + V;
  for (int i = lo; i < hi; ++i) src[i] = smp_key(x[i] / t, i);
  int run = 0;
  for (int shift = 32; shift < 64; shift += 8) {
#ifdef SAMPLE_CTL_SORT_SKIP_LOW
    if (shift == 32) continue;
#endif
    unsigned* col = counts + tid;                     // counts[d * nt + tid]
    for (int d = 0; d < SMP_BINS; ++d) col[d * nt] = 0u;
    unsigned dmin = 255u, dmax = 0u;
    for (int i = lo; i < hi; ++i) {
      const unsigned d = (unsigned)(src[i] >> shift) & 255u;
      col[d * nt] += 1u;
      dmin = d < dmin ? d : dmin;
      dmax = d > dmax ? d : dmax;
    }
    if (tid == 0) { sh.dlo = 255u; sh.dhi = 0u; }
    __syncthreads();
    if (lo < hi) { atomicMin(&sh.dlo, dmin); atomicMax(&sh.dhi, dmax); }
    __syncthreads();
    const int same = sh.dlo == sh.dhi;          // one digit everywhere: the pass changes nothing
    __syncthreads();
    if (same) continue;                               // block-uniform
    // exclusive scan of counts in (digit, thread) order: thread j owns the flat entries [j * 256, j * 256 + 256)
    unsigned* mine = counts + (long long)tid * SMP_BINS;
    unsigned part = 0u;
    for (int e = 0; e < SMP_BINS; ++e) part += mine[e];
    unsigned run_off = smp_block_exscan(part, sh.wsum);
    for (int e = 0; e < SMP_BINS; ++e) {
      const unsigned c = mine[e];
      mine[e] = run_off;
      run_off += c;
    }
    __syncthreads();
#ifdef SAMPLE_CTL_SORT_UNSTABLE
    for (int i = hi - 1; i >= lo; --i) {
#else
    for (int i = lo; i < hi; ++i) {
#endif
      const unsigned long long k = src[i];
      unsigned* slot = col + (((unsigned)(k >> shift) & 255u) * nt);
      dst[*slot] = k;
      *slot += 1u;
    }
    __syncthreads();
    unsigned long long* w = src; src = dst; dst = w;
    ++run;
  }
  *passes = run;
  return src;
}

// Steps 2-3: the token of a sampled row from its sorted keys (key[0..V), ascending = the reference's order).
// n = the kept count, u = the draw's uniform; p: [V] f32 scratch, cbuf: [V] f32 scratch (top-p's prefix).
// Called by the whole block.
static __device__ int smp_sorted_draw(const unsigned long long* __restrict__ key, int n, float tp, float mp,
                                      float u, float* p, float* cbuf, SmpShared& sh) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const float s0 = smp_value(key[0]);
  for (int i = tid; i < n; i += nt) p[i] = exp_f32(smp_value(key[i]) - s0);
  int C = (n + SMP_CHUNKS - 1) / SMP_CHUNKS;
  C = C < 256 ? 256 : C;
  const int nc = (n + C - 1) / C;
  __syncthreads();
  for (int c = tid; c <= nc; c += nt) {               // chunk maxima; b[nc] = 0 (nothing after the last)
    float m = 0.0f;
    const int end = (c + 1) * C < n ? (c + 1) * C : n;
    for (int i = c * C; i < end; ++i) m = p[i] > m ? p[i] : m;
    sh.b[c] = m;
  }
  __syncthreads();
  const float* bsuf = smp_suffix_max(sh.b, sh.b2, nc, tid, nt);     // suffix max over the chunk maxima
  auto bound = [&](int j) {                           // >= every e[i], i >= j (0 past the kept ids)
    const int c = (j < n ? j / C : nc) + SMP_SORT_SKIP;
    return bsuf[c < nc ? c : nc];
  };

#ifdef SAMPLE_CTL_REVERSED_SUMS
  if (tid == 0) {
    float S = 0.0f;
    for (int i = n - 1; i >= 0; --i) S = S + p[i];
    sh.acc = S;
  }
#else
  int reached, windows;
  const float Ssum = smp_scan(p, n, (float*)nullptr, INFINITY, bound, 1.0f, sh, &reached, &windows);
  if (tid == 0) { sh.acc = Ssum; sh.stat_sort[1] = reached; sh.stat_sort[4] = windows; }
#endif
  __syncthreads();
  const float S = sh.acc;
  for (int i = tid; i < n; i += nt) p[i] = p[i] / S;
  if (tid == 0) { sh.count = 0; sh.stat_sort[2] = 0; }
  __syncthreads();

  // ---- top-p and min-p: parallel counts over the prefix sums and p ------------------------------------------
  int keep = n;
  if (tp < 1.0f) {                   // 1 + #{i < n - 1: c[i] < top_p}; c never decreases: the first c[i] >= top_p
#ifdef SAMPLE_CTL_REVERSED_SUMS
    if (tid == 0) {
      float c = 0.0f;
      int cnt = 0;
      for (int i = 0; i < n - 1; ++i) {
        c = c + p[i];
        if (!(c < tp)) break;
        ++cnt;
      }
      sh.keep = cnt;
    }
#else
    int rc, wc;
    smp_scan(p, n - 1, cbuf, tp, bound, S, sh, &rc, &wc);
    if (tid == 0) { sh.keep = n - 1; sh.stat_sort[2] = rc; sh.stat_sort[4] += wc; }
    __syncthreads();
    for (int i = tid; i < rc; i += nt)
      if (!(cbuf[i] < tp)) atomicMin(&sh.keep, i);   // past rc every c equals c[rc - 1] (or the scan reached n - 1)
#endif
    __syncthreads();
    keep = 1 + sh.keep < keep ? 1 + sh.keep : keep;
    __syncthreads();
  }
  if (mp > 0.0f) {                   // #{i < keep: p[i] >= min_p * p[0]} (a count: exp_f32 need not be monotonic)
    const float thr = mp * p[0];
    int cnt = 0;
    for (int i = tid; i < keep; i += nt) cnt += p[i] >= thr ? 1 : 0;
    if (cnt) atomicAdd(&sh.count, cnt);
    __syncthreads();
    keep = keep < (sh.count > 1 ? sh.count : 1) ? keep : (sh.count > 1 ? sh.count : 1);
  }
  __syncthreads();

  // ---- q (its prefix kept in p), then the draw as a parallel search ------------------------------------------
#ifdef SAMPLE_CTL_REVERSED_SUMS
  if (tid == 0) {
    float q = 0.0f;
    for (int i = keep - 1; i >= 0; --i) q = q + p[i];
    const float r = u * q;
    q = 0.0f;
    int idx = keep;
    for (int i = keep - 1; i >= 0; --i) {
      q = q + p[i];
      if (q > r) { idx = i; break; }
    }
    sh.token = smp_id(key[idx < keep - 1 ? idx : keep - 1]);
  }
  __syncthreads();
  return sh.token;
#else
  int last, wq;
  const float q = smp_scan(p, keep, p, INFINITY, bound, S, sh, &last, &wq);   // p[0..last) := the prefix q[i]
  if (tid == 0) {
    sh.acc = u * q;
    sh.stat_sq[0] = S;
    sh.stat_sq[1] = q;
    sh.token = keep;
    sh.stat_sort[3] = last;
    sh.stat_sort[4] += wq;
  }
  __syncthreads();
  const float r = sh.acc;
  for (int i = tid; i < last; i += nt)
    if (p[i] > r) atomicMin(&sh.token, i);            // the first i with q[i] > r (q never decreases)
  __syncthreads();
  const int idx = sh.token;
  __syncthreads();
  return smp_id(key[idx < keep - 1 ? idx : keep - 1]);
#endif
}
