// sample.cu -- sampling one token per row of logits.  Reference: cupyglm.backend.numpy_sample.draw (NumpyOps.sample,
// the algorithm in the docstring of cupyglm/backend/numpy_sample.py), followed step for step so the token ids are
// identical on GPU, emulator and NumPy:
//
//  * NaN anywhere in the row: token -1 (the engine reports it).
//  * greedy (temperature < 1e-5f): argmax, ties to the lower id (block reduction with a total order).
//  * sampled: x = logits / temperature (IEEE division); the ids ordered by (x desc, id asc) as 64-bit keys
//    (ordered value bits, id; -0 and +0 tie as they do in NumPy); keep the first top_k; e = exp_f32(s - s[0])
//    (the same bits as lanes.exp_f32), p = e / S.  Every sum that the reference takes with np.cumsum in
//    float32 (S, the top-p prefix sums c, the draw's q) gives the bits of a strictly left-to-right sum in
//    sorted order.
//  * the RNG: u64 splitmix64(splitmix64(seed) + position), u = float(bits >> 40) * 2**-24, r = u * q[n'-1];
//    the token is the first kept id with q[i] > r, else the last kept one (np.searchsorted(side="right")).
//
// Two paths for a sampled row, the same token: the candidate tile (sample_tile.cuh: a radix select of the
// top min(n, SAMPLE_TILE) keys, sorted in shared memory, sums that stop once exact) decides every row with
// top_k <= SAMPLE_TILE and the peaked ones; every other row (flat, or top_k between SAMPLE_TILE and V) takes
// the sorted path (sample_sort.cuh: a stable radix sort of all V keys by the whole block in global scratch,
// then the sums as exact block scans (sample_scan.cuh) with the same early exit, the counts and the draw's
// search parallel).
//
// One block per row (blockDim.x a multiple of 32, power of two, <= 1024).  Scratch (the launcher allocates it):
// keys [R, 2, V] u64 (the sort's two buffers), counts [R, 256, blockDim.x] u32 (its digit counts), probs [R, V]
// f32 (e, p, then the draw's prefix q).
//
// Planted control (contract): -DSAMPLE_CTL_REVERSED_SUMS runs every cumulative sum right to left (smallest
// probability first), the "wrong cumsum order" the contract must catch; it sends every row to the sorted path.
// -DSAMPLE_FULL_SORT sends every row there (the cost baseline); -DSAMPLE_STATS writes both paths' counters,
// S and q into probs[row, 0..15] instead of the token (bench/sample_cost.py).
#include "common.cuh"
#include "exp_f32.cuh"

#define SAMPLE_TILE 2048  // keys per shared-memory tile of the sort (16 KiB)

static __device__ __forceinline__ unsigned long long smp_splitmix64(unsigned long long x) {
  x += 0x9E3779B97F4A7C15ull;
  unsigned long long z = x;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Sort key: ascending keys = (value desc, id asc).  High word: the float's bits mapped to an unsigned order
// (ascending with the value), complemented; low word: the id.  -0 is made +0 first (NumPy's order ties them).
// No NaN reaches here (the row is refused first).
static __device__ __forceinline__ unsigned long long smp_key(float v, int id) {
  if (v == 0.0f) v = 0.0f;
  unsigned u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)(~u) << 32) | (unsigned long long)(unsigned)id;
}

// The value of a key (exact; a -0 comes back as +0, which changes no later step: s - s0 and exp_f32 give
// the same bits for either sign of zero).
static __device__ __forceinline__ float smp_value(unsigned long long key) {
  unsigned u = ~(unsigned)(key >> 32);
  u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
  return __uint_as_float(u);
}

static __device__ __forceinline__ int smp_id(unsigned long long key) { return (int)(unsigned)(key & 0xffffffffull); }

// Argmax order: larger value first, ties to the lower id.  NaN never enters.
static __device__ __forceinline__ bool smp_better(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}

// One compare-exchange of the bitonic network on pair index p of stage k, stride j (pairs i, i + j with
// bit j of i clear); the direction comes from the global index (ascending when bit k of it is clear).
static __device__ __forceinline__ void smp_cmpx(unsigned long long* a, int p, int j, int k, int base) {
  const int i = ((p / j) * 2 * j) + (p % j);
  const int l = i + j;
  const bool up = ((base + i) & k) == 0;
  const unsigned long long x = a[i], y = a[l];
  if ((x > y) == up && x != y) {
    a[i] = y;
    a[l] = x;
  }
}

#ifdef SAMPLE_CTL_REVERSED_SUMS
#define SAMPLE_FULL_SORT                              // the planted order lives in the sorted path
#endif
#include "sample_tile.cuh"
#include "sample_sort.cuh"

extern "C" __global__ void __launch_bounds__(1024) sample_rows(
    const float* __restrict__ logits,                // [R, V] f32
    const float* __restrict__ temperature,           // [R] f32, < 1e-5 = greedy
    const int* __restrict__ top_k,                   // [R] i32, 0 = off
    const float* __restrict__ top_p,                 // [R] f32, >= 1 = off
    const float* __restrict__ min_p,                 // [R] f32, 0 = off
    const unsigned long long* __restrict__ seed,     // [R] u64
    const int* __restrict__ position,                // [R] i32, the drawn token's position
    unsigned long long* __restrict__ keys,           // [R, 2, V] u64 scratch
    unsigned* __restrict__ counts,                   // [R, 256, blockDim.x] u32 scratch
    float* __restrict__ probs,                       // [R, V] f32 scratch
    int* __restrict__ tokens,                        // [R] i32 out (-1: the row holds NaN)
    int V) {
  __shared__ SmpShared smp_sh;
  __shared__ float smp_wv[32];
  __shared__ int smp_wi[32];
  __shared__ int smp_wn[32];
  __shared__ int smp_best_i, smp_nan;

  const int row = blockIdx.x;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5;
  const float* x = logits + (long long)row * V;

  // ---- NaN check and argmax (ties to the lower id) -------------------------------------------------------
  float bv = -INFINITY;
  int bi = 0x7fffffff, nan = 0;
  for (int i = tid; i < V; i += nt) {
    const float v = x[i];
    if (v != v) nan = 1;
    else if (smp_better(v, i, bv, bi)) { bv = v; bi = i; }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(FULL_MASK, bv, off);
    const int oi = __shfl_xor_sync(FULL_MASK, bi, off);
    const int on = __shfl_xor_sync(FULL_MASK, nan, off);
    if (smp_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    nan |= on;
  }
  if (lane == 0) { smp_wv[warp] = bv; smp_wi[warp] = bi; smp_wn[warp] = nan; }
  __syncthreads();
  if (tid == 0) {
    float v = smp_wv[0];
    int id = smp_wi[0], n = smp_wn[0];
    for (int w = 1; w < (nt >> 5); ++w) {
      if (smp_better(smp_wv[w], smp_wi[w], v, id)) { v = smp_wv[w]; id = smp_wi[w]; }
      n |= smp_wn[w];
    }
    smp_best_i = id;
    smp_nan = n;
  }
  __syncthreads();
  const float t = temperature[row];
  if (smp_nan) {                                      // block-uniform exits
    if (tid == 0) tokens[row] = -1;
    return;
  }
  if (t < 1e-5f) {
    if (tid == 0) tokens[row] = smp_best_i;
    return;
  }

  const int kk = top_k[row];
  const int n = (kk > 0 && kk < V) ? kk : V;
  const float tp = top_p[row], mp = min_p[row];
  const unsigned long long bits =
      smp_splitmix64(smp_splitmix64(seed[row]) + (unsigned long long)(long long)position[row]);
  const float u = (float)(unsigned)(bits >> 40) * 0x1p-24f;
  const float s0 = smp_value(smp_key(x[smp_best_i] / t, smp_best_i));   // the largest x / t (division is monotone)
  int token = -2;
#ifndef SAMPLE_FULL_SORT
  if ((n <= SAMPLE_TILE || n == V) && s0 - s0 == 0.0f)                 // a finite top: the tile path
    token = smp_tile_draw(x, V, n, t, s0, tp, mp, u, smp_sh);
#endif
  const int fell = token == -2;
  if (fell) {                                         // the sorted path
    int passes = 0;
    unsigned long long* buf = keys + (long long)row * 2 * V;
    const unsigned long long* key =
        smp_radix_sort(x, V, t, buf, counts + (long long)row * SMP_BINS * nt, smp_sh, &passes);
    float* cbuf = reinterpret_cast<float*>(key == buf ? buf + V : buf);   // the sort's other buffer, free now
    if (tid == 0) smp_sh.stat_sort[0] = passes;
    token = smp_sorted_draw(key, n, tp, mp, u, probs + (long long)row * V, cbuf, smp_sh);
  }
#ifdef SAMPLE_STATS
  __syncthreads();
  if (tid == 0 && V >= 16) {                          // counters into the probs scratch: visits, passes, path
    for (int i = 0; i < 7; ++i) probs[(long long)row * V + i] = (float)smp_sh.stat[i];
    probs[(long long)row * V + 7] = fell ? 1.0f : 0.0f;
    probs[(long long)row * V + 8] = smp_sh.stat_sq[0];
    probs[(long long)row * V + 9] = smp_sh.stat_sq[1];
    probs[(long long)row * V + 10] = (float)smp_sh.stat[7];
    for (int i = 0; i < 5; ++i) probs[(long long)row * V + 11 + i] = fell ? (float)smp_sh.stat_sort[i] : -1.0f;
  }
  if (V >= 16) return;
#endif
  if (tid == 0) tokens[row] = token;
}
