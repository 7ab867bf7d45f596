// sample_tile.cuh -- the candidate-tile path of sample.cu (included by it after its key helpers).
//
// Only a prefix of the sorted order decides a sampled token, so instead of sorting all V ids this path:
//  1. selects the M = min(n, SAMPLE_TILE) smallest keys (the top of the order) with an exact radix select over
//     the 64-bit keys (8-bit digits, most significant first, 256-bin shared histograms; ties to the lower id);
//  2. gathers them into shared memory, sorts them there (bitonic, every thread), and takes the max e over the
//     ids outside the tile ("the rest", present only when n == V > M);
//  3. runs the reference's sums left to right on one thread over the tile, stopping a sum once it can no longer
//     change: acc + B == acc, where B >= every later term (a suffix max over the tile and the rest), means
//     acc == fl(acc + y) for every later y (0 <= y <= B and rounded addition is monotone), so the sequential
//     sum is final there -- the tie at half an ulp is decided by the same hardware addition;
//  4. when the rest holds terms that still change S (or q), sums them in any order, exactly: with acc in the
//     binade [2^a, 2^(a+1)) and staying there, fl(acc + y) = acc + ulp * round(y / ulp) whenever y / ulp is
//     not an odd multiple of 1/2, so the sequential result is acc + ulp * (sum of the rounded terms), an
//     integer sum; where that sum leaves the binade, a weighted radix select finds the crossing term, which is
//     added as the reference adds it, and the terms after it start over at the new ulp; a half-way term gives up.
// Whatever this path cannot decide exactly (a top-p cut, a min-p count or the draw past the tile, a tail
// that gives up, a top_k between SAMPLE_TILE and V) returns -2 and the kernel runs the sorted path instead.
//
// Controls (contract): SAMPLE_CTL_SELECT_TIES_HIGH (the select breaks ties to the higher id),
// SAMPLE_CTL_EXIT_EARLY (a sum stops one element too soon: the bound skips the next term),
// SAMPLE_CTL_NO_FALLBACK (an undecided row keeps the tile's partial answer).
#pragma once

#define SMP_BINS 256

#ifdef SAMPLE_CTL_SELECT_TIES_HIGH
#define SMP_SEL(k) ((k) ^ 0xffffffffull)
#else
#define SMP_SEL(k) (k)
#endif
#ifdef SAMPLE_CTL_EXIT_EARLY
#define SMP_EXIT_SKIP 1
#else
#define SMP_EXIT_SKIP 0
#endif

struct SmpShared {
  unsigned long long key[SAMPLE_TILE];   // the tile's keys, sorted ascending = (value desc, id asc); sorted path: scans
  float e[SAMPLE_TILE];                  // e, then p
  float b[SAMPLE_TILE + 1];              // b[i] >= every e[j], j >= i (tile), and b[M] >= every e of the rest
  float b2[SAMPLE_TILE + 1];             // the suffix max's second buffer
  unsigned hist[SMP_BINS];
  unsigned long long tail_sum;
  unsigned long long whist[SMP_BINS];    // the weighted select's bins
  unsigned emax, tail_bad;
  int count, digit, need, full, keep, token, fail, phase;
  float acc;
  int stat[8];                           // SAMPLE_STATS: S, c, min-p, q visits, select passes, tails, why undecided,
                                         // the tails' passes over V
  float stat_sq[2];                      // SAMPLE_STATS: S and q[n' - 1] as this path found them
  unsigned dlo, dhi, wsum[32];           // the sorted path (sample_sort.cuh): a pass's digit range, scan totals
  float scan_acc;                        // sample_scan.cuh: the block's running sum and next index (or first
  int scan_j;                            // term that leaves the binade)
  int stat_sort[5];                      // SAMPLE_STATS: the sorted path's radix passes, S, c and q terms, windows
};

// Suffix maxima of b[0..n] (Hillis-Steele, every thread of the block; b2 the scratch of the same size): returns
// the array holding them (b or b2), each entry the largest of itself and every entry after it.
static __device__ const float* smp_suffix_max(float* b, float* b2, int n, int tid, int nt) {
  float* src = b;
  float* dst = b2;
  for (int d = 1; d <= n; d <<= 1) {
    for (int i = tid; i <= n; i += nt) {
      const float a = src[i];
      const float c = i + d <= n ? src[i + d] : 0.0f;
      dst[i] = c > a ? c : a;
    }
    __syncthreads();
    float* w = src; src = dst; dst = w;
  }
  return src;
}

static __device__ __forceinline__ unsigned long long smp_warp_sum(unsigned long long v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
  return v;
}
static __device__ __forceinline__ unsigned smp_warp_max(unsigned v) {
  for (int off = 16; off > 0; off >>= 1) {
    const unsigned o = __shfl_xor_sync(FULL_MASK, v, off);
    v = o > v ? o : v;
  }
  return v;
}

// Step 1: (prefix, mask) such that the tile = {ids: (SMP_SEL(key) & mask) <= prefix} holds exactly M ids.
static __device__ __forceinline__ int smp_select(const float* __restrict__ x, int V, float t, int M, SmpShared& sh,
                                 unsigned long long* prefix_out, unsigned long long* mask_out) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int idbits = V > 1 ? 32 - __clz(V - 1) : 0;
  unsigned long long prefix = 0ull, mask = 0ull;
  int need = M, passes = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    if (shift < 32 && shift >= idbits) continue;       // every key holds the same digit there (ids < 2^idbits)
    for (int i = tid; i < SMP_BINS; i += nt) sh.hist[i] = 0u;
    __syncthreads();
    for (int i = tid; i < V; i += nt) {
      const unsigned long long k = SMP_SEL(smp_key(x[i] / t, i));
      if ((k & mask) == prefix) atomicAdd(&sh.hist[(unsigned)(k >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {                                   // the digit holding the need-th smallest matching key
      unsigned acc = 0u;
      int d = 0;
      for (; d < SMP_BINS - 1; ++d) {
        if (acc + sh.hist[d] >= (unsigned)need) break;
        acc += sh.hist[d];
      }
      sh.digit = d;
      sh.need = need - (int)acc;
      sh.full = sh.hist[d] == (unsigned)(need - (int)acc);
    }
    __syncthreads();
    prefix |= (unsigned long long)sh.digit << shift;
    mask |= 255ull << shift;
    need = sh.need;
    const int full = sh.full;
    ++passes;
    __syncthreads();
    if (full) break;                                  // the whole matching group is taken: the cut is exact
  }
  *prefix_out = prefix;
  *mask_out = mask;
  return passes;
}

// One rest term in units of acc's ulp (exact: a power-of-two scaling of e, or of e / S when S > 0).
static __device__ __forceinline__ float smp_units(float v, float s0, float S, float inv) {
  float y = exp_f32(v - s0);
  if (S > 0.0f) y = y / S;
  return y * inv;
}

// Step 4: acc followed by the rest's terms (e, or e / S when S > 0) in the reference's order, or acc with
// *bad set when that cannot be done exactly.  The rest: ids outside the tile with a key above `cut` once a
// binade change was found.  Where the integer sum leaves acc's binade, a weighted radix select (bins hold
// the rounded terms' sums) finds the term that crosses; every term before it rounds at the old ulp, that one
// is added as the reference adds it, and the rest after it starts over at the new ulp.  Called by the block.
static __device__ __forceinline__ float smp_tail(const float* __restrict__ x, int V, float t, float s0, float S,
                                 unsigned long long prefix, unsigned long long mask, float acc, SmpShared& sh,
                                 int* bad) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
  const int idbits = V > 1 ? 32 - __clz(V - 1) : 0;
  unsigned long long cut = 0ull;
  int after = 0;                                                         // only keys above cut are left
  for (int round = 0; round < 4; ++round) {
    const unsigned ab = __float_as_uint(acc);
    const int be = (int)((ab >> 23) & 255u);
    if (tid == 0) { sh.tail_sum = 0ull; sh.tail_bad = 0u; ++sh.stat[7]; }
    __syncthreads();
    if (!(acc > 0.0f) || be < 24 || be > 150) { *bad = 1; return acc; }  // scaling by 1/ulp must be exact
    const float ulp = __uint_as_float((unsigned)(be - 23) << 23);
    const float inv = __uint_as_float((unsigned)(277 - be) << 23);       // 1 / ulp
    unsigned long long sum = 0ull;
    unsigned flag = 0u;
    for (int i = tid; i < V; i += nt) {
      const float v = x[i] / t;
      const unsigned long long k = SMP_SEL(smp_key(v, i));
      if ((k & mask) <= prefix || (after && k <= cut)) continue;         // in the tile, or already added
      const float m = smp_units(v, s0, S, inv);
      if (m >= 0x1p24f) { flag = 1u; continue; }
      if (m - floorf(m) == 0.5f) flag = 1u;                              // half-way: the rounding needs the parity
      sum += (unsigned long long)rintf(m);
    }
    sum = smp_warp_sum(sum);
    flag = smp_warp_max(flag);
    if (lane == 0) {
      atomicAdd(&sh.tail_sum, sum);
      atomicOr(&sh.tail_bad, flag);
    }
    __syncthreads();
    const unsigned long long n0 = (unsigned long long)((ab & 0x7fffffu) | 0x800000u);   // acc / ulp
    const unsigned long long total = n0 + sh.tail_sum;
    const int tie = sh.tail_bad != 0u;
    __syncthreads();
    if (tie) { *bad = 1; return acc; }
    if (total < (1ull << 24)) return (float)total * ulp;                // exact: total < 2^24, ulp a power of two
    // the binade is left: the first key whose running sum reaches 2^24 units (every partial before it is
    // at most 2^24 - 1 units, so it rounded at this ulp)
    unsigned long long wprefix = 0ull, wmask = 0ull, before = 0ull, need = (1ull << 24) - n0;
    for (int shift = 56; shift >= 0; shift -= 8) {
      if (shift < 32 && shift >= idbits) continue;
      for (int i = tid; i < SMP_BINS; i += nt) sh.whist[i] = 0ull;
      if (tid == 0) ++sh.stat[7];
      __syncthreads();
      for (int i = tid; i < V; i += nt) {
        const float v = x[i] / t;
        const unsigned long long k = SMP_SEL(smp_key(v, i));
        if ((k & mask) <= prefix || (after && k <= cut) || (k & wmask) != wprefix) continue;
        const unsigned long long m = (unsigned long long)rintf(smp_units(v, s0, S, inv));
        if (m) atomicAdd(&sh.whist[(unsigned)(k >> shift) & 255u], m);
      }
      __syncthreads();
      if (tid == 0) {
        unsigned long long w = 0ull;
        int d = 0;
        for (; d < SMP_BINS - 1; ++d) {
          if (w + sh.whist[d] >= need) break;
          w += sh.whist[d];
        }
        sh.digit = d;
        sh.tail_sum = w;
      }
      __syncthreads();
      wprefix |= (unsigned long long)sh.digit << shift;
      wmask |= 255ull << shift;
      need -= sh.tail_sum;
      before += sh.tail_sum;
      __syncthreads();
    }
    const int id = (int)(SMP_SEL(wprefix) & ((1ull << idbits) - 1ull));  // SMP_SEL is its own inverse; the
                                                                         // skipped id digits are the same in every key
    const float vc = x[id] / t;
    float yc = exp_f32(vc - s0);
    if (S > 0.0f) yc = yc / S;
    acc = (float)(n0 + before) * ulp + yc;                               // the crossing term, as the reference adds it
    cut = wprefix;
    after = 1;
  }
  *bad = 1;
  return acc;
}

// The tile path for a sampled row: the token, or -2 when it cannot decide exactly.  n = the kept count
// (n <= SAMPLE_TILE or n == V), s0 = the largest x / t (finite), u = the draw's uniform.
static __device__ __forceinline__ int smp_tile_draw(const float* __restrict__ x, int V, int n, float t, float s0, float tp,
                                    float mp, float u, SmpShared& sh) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
  const int M = n < SAMPLE_TILE ? n : SAMPLE_TILE;
  const bool rest = n > M;
  unsigned long long prefix, mask;
  const int passes = smp_select(x, V, t, M, sh, &prefix, &mask);

  // ---- step 2: gather, sort, e, the suffix bound ------------------------------------------------------
  if (tid == 0) { sh.count = 0; sh.emax = 0u; sh.fail = 0; }
  __syncthreads();
  unsigned em = 0u;                                   // e >= 0: its bits order as its value
  for (int i = tid; i < V; i += nt) {
    const float v = x[i] / t;
    const unsigned long long k = smp_key(v, i);
    if ((SMP_SEL(k) & mask) <= prefix) {
      const int slot = atomicAdd(&sh.count, 1);
      if (slot < SAMPLE_TILE) sh.key[slot] = k;
    } else if (rest) {
      const unsigned eb = __float_as_uint(exp_f32(v - s0));
      em = eb > em ? eb : em;
    }
  }
  em = smp_warp_max(em);
  if (lane == 0) atomicMax(&sh.emax, em);
  int Mp = 1;
  while (Mp < M) Mp <<= 1;
  for (int i = M + tid; i < Mp; i += nt) sh.key[i] = ~0ull;
  __syncthreads();
  if (sh.count != M) return -2;                       // block-uniform; cannot happen when the select is exact
  for (int k = 2; k <= Mp; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int p = tid; p < (Mp >> 1); p += nt) smp_cmpx(sh.key, p, j, k, 0);
      __syncthreads();
    }
  const float rmax = __uint_as_float(sh.emax);
  for (int i = tid; i <= M; i += nt) {
    const float e = i < M ? exp_f32(smp_value(sh.key[i]) - s0) : rmax;
    if (i < M) sh.e[i] = e;
    sh.b[i] = e;
  }
  __syncthreads();
  const float* b = smp_suffix_max(sh.b, sh.b2, M, tid, nt);

  // ---- step 3: S ---------------------------------------------------------------------------------------
  if (tid == 0) {
    float S = 0.0f;
    int i = 0, done = 0;
    for (; i < M; ++i) {
      S = S + sh.e[i];
      const int nx = i + 1 + SMP_EXIT_SKIP;
      if (S + b[nx < M ? nx : M] == S) { done = 1; break; }   // no later term changes S
    }
    sh.acc = S;
    sh.phase = done;
    sh.stat[0] = i + (done ? 1 : 0);
    sh.stat[5] = sh.stat[6] = sh.stat[7] = 0;
  }
  __syncthreads();
  int fail = 0;
  float S = sh.acc;
  const int sdone = sh.phase;
  __syncthreads();
  if (!sdone) {
    S = smp_tail(x, V, t, s0, 0.0f, prefix, mask, S, sh, &fail);
    if (tid == 0) { sh.stat[5] = 1; sh.stat[6] = fail; }
  }
  for (int i = tid; i < M; i += nt) sh.e[i] = sh.e[i] / S;
  __syncthreads();

  // ---- top-p, min-p, q over the tile ----------------------------------------------------------------------
  const float* p = sh.e;
  if (tid == 0) {
    int keep = n, f = fail;
    sh.stat[1] = sh.stat[2] = 0;
    if (tp < 1.0f) {
      const int lim = n - 1 < M ? n - 1 : M;
      float c = 0.0f;
      int cnt = 0, hit = 0;
      for (int i = 0; i < lim; ++i) {
        c = c + p[i];
        if (!(c < tp)) { hit = 1; break; }
        ++cnt;
      }
      sh.stat[1] = cnt + hit;
      if (!hit && lim < n - 1) {                       // c over the rest: it stays c (< top_p) or we give up
        if (!(c + b[M] / S == c)) { f = 1; sh.stat[6] |= 2; }
        cnt = n - 1;
      }
      keep = keep < 1 + cnt ? keep : 1 + cnt;
    }
    if (mp > 0.0f) {
      const float thr = mp * p[0];
      const int lim = keep < M ? keep : M;
      int cnt = 0;
      for (int i = 0; i < lim; ++i) cnt += p[i] >= thr ? 1 : 0;
      sh.stat[2] = lim;
      if (keep > M && b[M] / S >= thr) { f = 1; sh.stat[6] |= 4; }   // a rest id might count
      cnt = cnt > 1 ? cnt : 1;
      keep = keep < cnt ? keep : cnt;
    }
    const int lim = keep < M ? keep : M;
    float q = 0.0f;
    int i = 0, done = 0;
    for (; i < lim; ++i) {
      q = q + p[i];
      const int nx = i + 1 + SMP_EXIT_SKIP;
      if (q + b[nx < M ? nx : M] / S == q) { done = 1; break; }   // b / S >= every later p
    }
    sh.stat[3] = i + (done ? 1 : 0);
    sh.keep = keep;
    sh.acc = q;
    sh.phase = done || keep <= M;
    sh.fail = f;
  }
  __syncthreads();
  fail = sh.fail;
  float q = sh.acc;
  const int keep = sh.keep;
  const int qdone = sh.phase;
  __syncthreads();                                    // read before thread 0 writes the draw's fields
  if (!qdone) {
    const int before = fail;
    q = smp_tail(x, V, t, s0, S, prefix, mask, q, sh, &fail);
    if (tid == 0) { sh.stat[5] += 2; sh.stat[6] |= fail && !before ? 8 : 0; }
  }

  // ---- the draw: the first kept i with q[i] > r -----------------------------------------------------------
  if (tid == 0) {
    sh.stat_sq[0] = S;
    sh.stat_sq[1] = q;
    const float r = u * q;
    const int lim = keep < M ? keep : M;
    float c = 0.0f;
    int idx = -1;
    for (int i = 0; i < lim; ++i) {
      c = c + p[i];
      if (c > r) { idx = i; break; }
    }
    sh.stat[3] += idx < 0 ? lim : idx + 1;
    sh.stat[4] = passes;
    if (idx < 0) {
      if (keep > M) { fail = 1; sh.stat[6] |= 16; }   // the draw lies past the tile
      idx = lim - 1;
    }
    sh.token = smp_id(sh.key[idx]);
    sh.fail = fail;
  }
  __syncthreads();
  const int token = sh.token;
#ifdef SAMPLE_CTL_NO_FALLBACK
  return token;
#else
  return sh.fail ? -2 : token;
#endif
}
