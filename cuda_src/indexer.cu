// indexer.cu -- DSA indexer: pooled keys of complete pools (index_pool; index_tail_pool: a call's index tails
// in place and the pools its segments' rows complete) and the score of every pool for every row (index_scores;
// and index_scores_rows: each row against its own pools through its segment's pooled-row table).
// Reference: NumpyOps.index_pool / index_tail_pool / index_scores / index_scores_rows in
// cupyglm/backend/numpy_ops.py; the dots over the index head dimension and the sum over heads run in lane-16
// order, the 4 pool members left to right.
// Storage: index keys, gates, ape, pooled keys and index queries are bf16; head weights and scores fp32.
#include "common.cuh"
#include "index_pool.cuh"

// Per pool p and channel d: pk[p, d] = bf16(idx_pool_channel(members of pool p)).  One thread per (p, d).
extern "C" __global__ void index_pool(const __nv_bfloat16* __restrict__ ik,   // [P, KP, I] bf16
                                      const __nv_bfloat16* __restrict__ ig,   // [P, KP, I] bf16
                                      const __nv_bfloat16* __restrict__ ape,  // [KP, I] bf16
                                      __nv_bfloat16* __restrict__ pk,         // [P, I] bf16
                                      int P, int KP, int I) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)P * I) return;
  const long long p = i / I;
  const int d = (int)(i % I);
  float k[IDX_MAX_KPOOL], g[IDX_MAX_KPOOL];
  for (int j = 0; j < KP; ++j) {
    k[j] = ld_bf16(ik, (p * KP + j) * I + d);
    g[j] = ld_bf16(ig, (p * KP + j) * I + d);
  }
  pk[i] = to_bf16(idx_pool_channel(k, g, ape, KP, I, d));
}

// A forward call's index tails, in place, and the pools its segments' rows complete: one launch per layer call.
// Segment s = seg[s] (row0, n, start, slot, done0): rows row0..row0+n-1 of ik/ig are positions start..start+n-1
// of the sequence whose tail is tails_*[slot] (its row q holds the latest written position = q mod KP, so its
// leading (start + n) % KP rows are the incomplete pool's members after the launch); distinct segments hold
// distinct slots. Its C = (start + n) / KP - start / KP complete pools: pool c's members are positions
// (start / KP + c) * KP + j, read from the tail before start and from the rows after; its key goes to
// pooled[done[done0 + c]] (-1: none). Work items: max(C, 1) per segment with n > 0, in segment order; item (s, c)
// pools pool c of segment s, and item (s, 0) also writes the segment's tail after its pool (only pool 0 can read
// tail members, in the same thread: no race). grid (ceil(I / 128), any y >= 1): block y takes items y, y +
// gridDim.y, ... (so a captured launch may fix grid.y); block 128: thread d handles channel d.
#define TAIL_SEG_COLS 5
extern "C" __global__ void __launch_bounds__(128) index_tail_pool(
    const __nv_bfloat16* __restrict__ ik,   // [T, I] bf16 the call's index keys
    const __nv_bfloat16* __restrict__ ig,   // [T, I] bf16 the call's index gates
    const __nv_bfloat16* __restrict__ ape,  // [KP, I] bf16
    __nv_bfloat16* __restrict__ tails_ik,   // [NS, KP, I] bf16 the layer's tails, one slot per sequence, in place
    __nv_bfloat16* __restrict__ tails_ig,   // [NS, KP, I] bf16
    __nv_bfloat16* __restrict__ pooled,     // [R, I] bf16 the layer's pooled keys
    const int* __restrict__ seg,            // [S, 5] int32 (row0, n, start, slot, done0) per segment
    const int* __restrict__ done,           // [D] int32 pooled rows of the completed pools, -1 = none
    int S, int T, int KP, int I, int NS, int D, int R) {
  const int d = blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= I) return;
  for (int item = blockIdx.y;; item += gridDim.y) {
    int s = 0, base = 0, C = 0;
    for (; s < S; ++s) {                     // the segment of this item: items in segment order
      const int n = seg[s * TAIL_SEG_COLS + 1], start = seg[s * TAIL_SEG_COLS + 2];
      if (n <= 0) continue;
      C = (start + n) / KP - start / KP;
      const int m = C > 1 ? C : 1;
      if (item < base + m) break;
      base += m;
    }
    if (s >= S) return;                      // past the call's last item
    const int* e = seg + s * TAIL_SEG_COLS;
    const int r0 = e[0], n = e[1], start = e[2], slot = e[3], done0 = e[4];
    const int c = item - base;
    if (slot < 0 || slot >= NS || r0 < 0 || r0 + n > T) continue;   // the host checked the table (CallMaps)
    __nv_bfloat16* tk = tails_ik + (long long)slot * KP * I;
    __nv_bfloat16* tg = tails_ig + (long long)slot * KP * I;
#ifdef CONTROL_TAIL_EARLY  // planted: the tail written before pool 0 reads its members
    if (c == 0)
      for (int j = max(0, n - KP); j < n; ++j) {
        const int q = (start + j) % KP;
        tk[(long long)q * I + d] = ik[(long long)(r0 + j) * I + d];
        tg[(long long)q * I + d] = ig[(long long)(r0 + j) * I + d];
      }
#endif
    if (c < C) {
      const int pos0 = (start / KP + c) * KP;
      float k[IDX_MAX_KPOOL], g[IDX_MAX_KPOOL];
      for (int j = 0; j < KP; ++j) {
        const int pos = pos0 + j;
        const bool old = pos < start;
        const long long at = old ? (long long)(pos % KP) * I + d : (long long)(r0 + pos - start) * I + d;
        k[j] = ld_bf16(old ? tk : ik, at);
        g[j] = ld_bf16(old ? tg : ig, at);
      }
      const int pr = done0 + c < D ? done[done0 + c] : -1;
      if (pr >= 0 && pr < R) pooled[(long long)pr * I + d] = to_bf16(idx_pool_channel(k, g, ape, KP, I, d));
    }
#ifndef CONTROL_TAIL_EARLY
    if (c == 0)
      for (int j = max(0, n - KP); j < n; ++j) {   // the last KP rows: each slot's latest position
        const int q = (start + j) % KP;
        tk[(long long)q * I + d] = ik[(long long)(r0 + j) * I + d];
        tg[(long long)q * I + d] = ig[(long long)(r0 + j) * I + d];
      }
#endif
  }
}

// scores[t, p] = sum_h hw[t, h] * relu(qscale * (qi[t, h] . pk[p])), heads summed in lane-16 order (head h
// in lane h % 16), each dot over I in lane-16 order (16 partials per thread, folded 8, 4, 2, 1).
#define IDX_POOLS 16
#define IDX_ROWS 16
#define IDX_MAX_I 256  // index head dimension <= 256 (the model has 128)

// Lane `lane`'s partial of one (row, pool) score: heads h = lane, lane + 16, ... of the row's queries qt
// [Hi, I] bf16 against one key (I bf16 bit patterns), each head's weight hwt[h] * hscale (hscale 1: hw as
// given, x * 1 exact). The caller folds the 16 lanes (lane16_fold) with every thread of the group converged.
static __device__ __forceinline__ float idx_score_lane(const __nv_bfloat16* __restrict__ qt,  // [Hi, I] bf16
                                                       const float* __restrict__ hwt,         // [Hi] f32
                                                       const unsigned short* key,             // [I] bf16 bits
                                                       int Hi, int I, float qscale, float hscale, int lane) {
  float acc = 0.0f;
  for (int h = lane; h < Hi; h += 16) {
    const __nv_bfloat16* qr = qt + (long long)h * I;
    float a[16];
#pragma unroll
    for (int m = 0; m < 16; ++m) a[m] = 0.0f;
    for (int k0 = 0; k0 < I; k0 += 16) {
#pragma unroll
      for (int m = 0; m < 16; ++m)
        if (k0 + m < I) a[m] += ld_bf16(qr, k0 + m) * __bfloat162float(__ushort_as_bfloat16(key[k0 + m]));
    }
#pragma unroll
    for (int w = 8; w > 0; w >>= 1)
#pragma unroll
      for (int m = 0; m < w; ++m) a[m] = a[m] + a[m + w];
    float z = a[0] * qscale;
    z = (z < 0.0f) ? 0.0f : z;  // np.maximum(z, 0): NaN stays NaN
    acc += z * (hwt[h] * hscale);
  }
  return acc;
}

// A block takes IDX_POOLS pools and up to IDX_ROWS rows: the pools' keys are read once into shared memory and
// serve every head of every row of the block (a verify call's 16 rows share one read); a group of 16 threads
// per pool, lane l computing the dots of heads l, l+16, ..., the group folding, row after row.
// grid (ceil(T / IDX_ROWS) * ceil(P / IDX_POOLS)): one flat grid.x (2^31 - 1) over (row group, pool block), so
// neither the token count nor the pool count meets grid.y's 65,535 limit; blockDim.x = 16 * IDX_POOLS.
extern "C" __global__ void __launch_bounds__(16 * IDX_POOLS) index_scores(
    const __nv_bfloat16* __restrict__ qi,  // [T, Hi, I] bf16
    const float* __restrict__ hw,          // [T, Hi] f32
    const __nv_bfloat16* __restrict__ pk,  // [P, I] bf16
    float* __restrict__ scores,            // [T, P] f32
    int T, int Hi, int I, int P, float qscale) {
  __shared__ unsigned short kt[IDX_POOLS][IDX_MAX_I];   // the block's pooled keys, bf16 bit patterns
  const int pblocks = (P + IDX_POOLS - 1) / IDX_POOLS;
  const int t0 = (int)(blockIdx.x / pblocks) * IDX_ROWS;
  const int pb = (int)(blockIdx.x % pblocks) * IDX_POOLS;
  const int g = threadIdx.x >> 4, lane = threadIdx.x & 15;
  const int p = pb + g;
  for (int i = threadIdx.x; i < IDX_POOLS * I; i += blockDim.x) {
    const int gg = i / I, d = i % I;
    kt[gg][d] = pb + gg < P ? __bfloat16_as_ushort(pk[(long long)(pb + gg) * I + d]) : (unsigned short)0;
  }
  __syncthreads();
  const int nt = min(IDX_ROWS, T - t0);
  for (int tt = 0; tt < nt; ++tt) {        // block-uniform: every group folds (full-mask shuffles)
    const int t = t0 + tt;
    float acc = 0.0f;
    if (p < P) acc = idx_score_lane(qi + (long long)t * Hi * I, hw + (long long)t * Hi, kt[g], Hi, I, qscale, 1.0f,
                                    lane);
    acc = lane16_fold(acc);
    if (p < P && lane == 0) scores[(long long)t * P + p] = acc;
  }
}

// The call's rows, each against its own pools: scores[t, p] = index_scores of row t (head weights hw[t] * hscale)
// against pooled[tables[seg[t], p]] (row t's segment's pooled-key row table, model/seg_device.py). A row index
// outside [0, R) reads a zero key (the caller pads with valid rows; the pick reads only a row's visible pools),
// and so does every entry of a row whose segment index is outside [0, S).
// One block per (row, IDX_POOLS pools): the block's keys of its row into shared memory, then the same groups,
// lanes and fold as index_scores. grid (T * ceil(Pw / IDX_POOLS)) on grid.x, blockDim.x = 16 * IDX_POOLS.
extern "C" __global__ void __launch_bounds__(16 * IDX_POOLS) index_scores_rows(
    const __nv_bfloat16* __restrict__ qi,      // [T, Hi, I] bf16
    const float* __restrict__ hw,              // [T, Hi] f32 head weights before hscale
    const __nv_bfloat16* __restrict__ pooled,  // [R, I] bf16 the layer's pooled keys
    const int* __restrict__ tables,            // [S, Pw] int32 pooled row of segment s's pool p
    const int* __restrict__ seg,               // [T] int32 row t's segment (its row of tables)
    float* __restrict__ scores,                // [T, Pw] f32
    int T, int Hi, int I, int Pw, int R, int S, float qscale, float hscale) {
  __shared__ unsigned short kt[IDX_POOLS][IDX_MAX_I];   // the block's keys of its row, bf16 bit patterns
  const int pblocks = (Pw + IDX_POOLS - 1) / IDX_POOLS;
  const int t = (int)(blockIdx.x / pblocks);
  const int pb = (int)(blockIdx.x % pblocks) * IDX_POOLS;
  const int g = threadIdx.x >> 4, lane = threadIdx.x & 15;
  const int p = pb + g;
#ifdef CONTROL_ROW_TABLE  // planted: row t reads the next row's table
  const int st = seg[(t + 1) % T];
#else
  const int st = seg[t];
#endif
  const bool in = st >= 0 && st < S;
  for (int i = threadIdx.x; i < IDX_POOLS * I; i += blockDim.x) {
    const int gg = i / I, d = i % I;
    const int r = in && pb + gg < Pw ? tables[(long long)st * Pw + pb + gg] : -1;
    kt[gg][d] = r >= 0 && r < R ? __bfloat16_as_ushort(pooled[(long long)r * I + d]) : (unsigned short)0;
  }
  __syncthreads();
  float acc = 0.0f;
  if (p < Pw) acc = idx_score_lane(qi + (long long)t * Hi * I, hw + (long long)t * Hi, kt[g], Hi, I, qscale, hscale,
                                   lane);
  acc = lane16_fold(acc);
  if (p < Pw && lane == 0) scores[(long long)t * Pw + p] = acc;
}
