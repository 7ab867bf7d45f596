// indexer.cu -- DSA indexer: pooled keys of complete pools (index_pool; index_tail_pool: a call's index tails
// in place and the pools its segments' rows complete) and the score of every pool for every row (index_scores;
// and index_scores_rows: each row against its own pools through its segment's pooled-row table).
// Reference: NumpyOps.index_pool / index_tail_pool / index_scores / index_scores_rows in
// cupyglm/backend/numpy_ops.py; the pool members left to right; the scores' dots on the tensor core and their head
// sum in lane-16 order (index_mma.cuh, backend/tc_index.py).
// Storage: index keys, gates, ape, pooled keys and index queries are bf16; head weights and scores fp32.
#include "common.cuh"
#include "index_mma.cuh"
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

// scores[t, p] = sum_h hw[t, h] * relu(qscale * (qi[t, h] . pk[p])): the dots on the tensor core, the epilogue
// and the head sum in lane-16 order (index_mma.cuh). A block of W warps stages 32 W pools' keys in shared memory
// (dynamic: 32 W idx_ld(I) bf16) and warp w scores pools 32w .. 32w + 31 of it, row after row.
#define IDX_ROWS 16   // rows per index_scores block

// The lanes of t = 0 store the row's scores of their pools 16m + g + 8r (s from idx_row_scores).
static __device__ __forceinline__ void idx_store(float* __restrict__ out, const float s[2][2], int p0, int P) {
  const int lane = threadIdx.x & 31;
  if (lane & 3) return;
  for (int m = 0; m < 2; ++m)
    for (int r = 0; r < 2; ++r) {
      const int p = p0 + 16 * m + (lane >> 2) + 8 * r;
      if (p < P) out[p] = s[m][r];
    }
}

// A block takes 32 W pools and up to IDX_ROWS rows: the keys are read once for every head of every row of the
// block. grid (ceil(T / IDX_ROWS) * ceil(P / 32 W)) on one flat grid.x (2^31 - 1), so neither the token count nor
// the pool count meets grid.y's 65,535 limit; blockDim.x = 32 W, W <= 8.
extern "C" __global__ void __launch_bounds__(256) index_scores(
    const __nv_bfloat16* __restrict__ qi,  // [T, Hi, I] bf16
    const float* __restrict__ hw,          // [T, Hi] f32
    const __nv_bfloat16* __restrict__ pk,  // [P, I] bf16
    float* __restrict__ scores,            // [T, P] f32
    int T, int Hi, int I, int P, float qscale) {
  extern __shared__ __align__(16) unsigned char idx_sh[];
  __nv_bfloat16* kt = reinterpret_cast<__nv_bfloat16*>(idx_sh);   // [32 W, ld] the block's keys
  const int np = IDX_WARP_POOLS * (blockDim.x >> 5), ld = idx_ld(I), w = threadIdx.x >> 5;
  const int pblocks = (P + np - 1) / np;
  const int t0 = (int)(blockIdx.x / pblocks) * IDX_ROWS;
  const int pb = (int)(blockIdx.x % pblocks) * np;
  idx_stage(kt, pk, np, I, [&](int r) { return pb + r < P ? (long long)(pb + r) : -1LL; });
  __syncthreads();
  const int nt = min(IDX_ROWS, T - t0);
  for (int tt = 0; tt < nt; ++tt) {        // warp-uniform: every lane folds (full-mask shuffles, mma)
    const long long t = t0 + tt;
    float s[2][2];
    idx_row_scores(s, qi + t * Hi * I, hw + t * Hi, kt + IDX_WARP_POOLS * w * ld, ld, Hi, I, qscale, 1.0f);
    idx_store(scores + t * P, s, pb + IDX_WARP_POOLS * w, P);
  }
}

// The call's rows, each against its own pools: scores[t, p] = index_scores of row t (head weights hw[t] * hscale)
// against pooled[tables[seg[t], p]] (row t's segment's pooled-key row table, model/seg_device.py). A row index
// outside [0, R) reads a zero key (the caller pads with valid rows; the pick reads only a row's visible pools),
// and so does every entry of a row whose segment index is outside [0, S).
// One block per (row, 32 W pools): the block's keys of its row into shared memory, then the same warps and
// order as index_scores. grid (T * ceil(Pw / 32 W)) on grid.x, blockDim.x = 32 W.
extern "C" __global__ void __launch_bounds__(256) index_scores_rows(
    const __nv_bfloat16* __restrict__ qi,      // [T, Hi, I] bf16
    const float* __restrict__ hw,              // [T, Hi] f32 head weights before hscale
    const __nv_bfloat16* __restrict__ pooled,  // [R, I] bf16 the layer's pooled keys
    const int* __restrict__ tables,            // [S, Pw] int32 pooled row of segment s's pool p
    const int* __restrict__ seg,               // [T] int32 row t's segment (its row of tables)
    float* __restrict__ scores,                // [T, Pw] f32
    int T, int Hi, int I, int Pw, int R, int S, float qscale, float hscale) {
  extern __shared__ __align__(16) unsigned char idx_sh[];
  __nv_bfloat16* kt = reinterpret_cast<__nv_bfloat16*>(idx_sh);   // [32 W, ld] the block's keys of its row
  const int np = IDX_WARP_POOLS * (blockDim.x >> 5), ld = idx_ld(I), w = threadIdx.x >> 5;
  const int pblocks = (Pw + np - 1) / np;
  const long long t = blockIdx.x / pblocks;
  const int pb = (int)(blockIdx.x % pblocks) * np;
#ifdef CONTROL_ROW_TABLE  // planted: row t reads the next row's table
  const int st = seg[(t + 1) % T];
#else
  const int st = seg[t];
#endif
  const bool in = st >= 0 && st < S;
  idx_stage(kt, pooled, np, I, [&](int r) {
    const int e = in && pb + r < Pw ? tables[(long long)st * Pw + pb + r] : -1;
    return e >= 0 && e < R ? (long long)e : -1LL;
  });
  __syncthreads();
  float s[2][2];
  idx_row_scores(s, qi + t * Hi * I, hw + t * Hi, kt + IDX_WARP_POOLS * w * ld, ld, Hi, I, qscale, hscale);
  idx_store(scores + t * Pw, s, pb + IDX_WARP_POOLS * w, Pw);
}
