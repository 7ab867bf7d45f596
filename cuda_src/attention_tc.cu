// attention_tc.cu -- absorbed MLA prefill attention on the tensor core (keys equal values): the prompt rows of the
// op attention_paged (kernels/ops_attention.py). Reference: cupyglm/backend/tc_attention.py (the exact model). A
// block of 8 warps holds two 16-row mma tiles of (query row, head) pairs: hb = 16 (two rows of 16 heads) or 32 (one
// row of 32 heads); -DATC_ONE_TILE: 4 warps, one tile, hb = 16. Heads past H are zero queries, never stored. Each
// row's positions tokens[t, :counts[t]]
// (strictly ascending) fall into key blocks of 64 positions aligned to absolute positions; each step stages one
// key block as a 64-slot tile in shared memory (absent slots zero) for the rows that touch it and share its store
// rows (the lowest next block of any row; rows of another segment wait a step), so a block's rows read the tile
// once, and each row merges its own blocks into its online softmax in position order (a tile whose row does not
// touch the step's block skips it):
//   S = Q K^T   warp w (tile w / 4) the keys 16(w%4)..+15, a chain over R in ascending k steps of 16 from +0.0;
//   s = S * scale (absent -inf), m' = max(m, max s), P = bf16(exp_f32(s - m')) (absent 0; warp w its own keys',
//   staged in shared memory for its tile's P V), alpha = exp_f32(m - m');
//   l = chain(P, ones, C = l alpha) and o = chain(P, V, C = o alpha), warp w the columns [(w%4)R/4, (w%4+1)R/4).
// out = bf16(o / l). Positions map to store rows through the row's segment's page table (attention_rows.cuh).
// R % 64 == 0, R <= ATC_MAX_R (the launcher checks). Storage: qa, store, out bf16; m, l, o fp32.
//
// Planted controls: TRANSPOSED_FRAGMENT (Q's fragment loaded with each 8x8 quadrant transposed), CHAIN_REVERSED
// (the k steps of both chains descending), IEEE_SUM (P V as an fp32 IEEE sum in key order), OFF_GRID (blocks of 64
// counted from the row's first position instead of position 0).
#include "common.cuh"
#include "exp_f32.cuh"
#include "mma.cuh"
#include "attention_rows.cuh"

#define ATC_BLOCK 64      // key positions a block, on the absolute grid
#ifdef ATC_ONE_TILE       // GPUs with 99 KB of shared memory a block: one tile of 16 heads (hb = 16), the same bits
#define ATC_WARPS 4
#define ATC_TILES 1
#define ATC_ROWS 1
#else
#define ATC_WARPS 8       // 4 a tile: each its 16 keys of S, its quarter of the columns of o
#define ATC_TILES 2       // 16-row mma tiles a block
#define ATC_ROWS 2        // the most query rows a block (hb = 16)
#endif
#define ATC_MAX_R 512     // the widest latent row: R / 32 output tiles of 8 columns a warp
#define ATC_PAD 8         // bf16 past each shared row, so ldmatrix's eight rows fall in different banks
#define ATC_ST 5          // ints of a query row's state: entry j, next entry, count, active, grid base

#ifdef CHAIN_REVERSED
#define ATC_STEP(i, n) ((n) - 1 - (i))
#else
#define ATC_STEP(i, n) (i)
#endif

struct AtcShared {
  __nv_bfloat16* kv;   // [ATC_BLOCK, R + ATC_PAD] the step's latent rows, absent slots zero
  __nv_bfloat16* q;    // [16 ATC_TILES, R + ATC_PAD] the tiles' queries
  __nv_bfloat16* p;    // [16 ATC_TILES, ATC_BLOCK + ATC_PAD] the step's P
  float* pmax;         // [4, 16 ATC_TILES] each key quarter's row maxima of its scores
  int* slot;           // [ATC_BLOCK] store row of each slot, -1 absent
  int* pres;           // [ATC_ROWS, ATC_BLOCK] 1 where query row q lists the slot's position this step
  int* st;             // [ATC_ROWS * ATC_ST + 2] each query row's state, then the step's block and "any left"
};

// Thread 0 picks the step's key block (the lowest next block of any row) and its rows (those whose next block it
// is, of the first such row's segment and grid base); every thread clears the slots. Block-uniform barrier.
static __device__ void atc_pick(const AtcShared& sh, const int* tokens, const int* seg, int W, int t0, int qr,
                                int pt) {
  if (threadIdx.x == 0) {
    int b = 0x7fffffff, lead = 0, bq[ATC_ROWS];
#pragma unroll
    for (int q = 0; q < ATC_ROWS; ++q) {
      int* s = sh.st + ATC_ST * q;
      s[0] = s[1];
      bq[q] = q < qr && s[0] < s[2] ? (tokens[(long long)(t0 + q) * W + s[0]] - s[4]) / ATC_BLOCK : 0x7fffffff;
      if (bq[q] < b) { b = bq[q]; lead = q; }
    }
    const int any = b != 0x7fffffff, base = sh.st[ATC_ST * lead + 4], sl = pt > 0 && any ? seg[t0 + lead] : 0;
#pragma unroll
    for (int q = 0; q < ATC_ROWS; ++q) {
      int* s = sh.st + ATC_ST * q;
      s[3] = any && bq[q] == b && s[4] == base && (pt <= 0 || seg[t0 + q] == sl);
    }
    sh.st[ATC_ROWS * ATC_ST] = b;
    sh.st[ATC_ROWS * ATC_ST + 1] = any;
  }
  for (int i = threadIdx.x; i < ATC_ROWS * ATC_BLOCK; i += blockDim.x) {
    sh.pres[i] = 0;
    if (i < ATC_BLOCK) sh.slot[i] = -1;
  }
  __syncthreads();
}

// The step's slots from each active row's entries j.. (at most 64 of them share a block); moves its next entry
// past them. Rows of one segment map a position to one store row, so their writes to a slot agree.
static __device__ void atc_slots(const AtcShared& sh, const int* tokens, const int* table, const int* seg, int T,
                                 int W, int t0, int qr, int width, int pt) {
  const int tid = threadIdx.x, q = tid / ATC_BLOCK, b = sh.st[ATC_ROWS * ATC_ST];
  if (q < qr) {
    int* s = sh.st + ATC_ST * q;
    const int t = t0 + q, e = s[0] + tid % ATC_BLOCK;
    if (s[3] && e < s[2]) {
      const int p = tokens[(long long)t * W + e] - s[4];
      if (p / ATC_BLOCK == b) {
        sh.slot[p % ATC_BLOCK] = att_store_row(tokens, table, seg, T, t, W, e, width, pt);
        sh.pres[q * ATC_BLOCK + p % ATC_BLOCK] = 1;
        atomicMax(s + 1, e + 1);
      }
    }
  }
  __syncthreads();
}

// The step's latent rows into shared memory, 8 bf16 a copy; absent slots zero.
static __device__ void atc_stage(const AtcShared& sh, const __nv_bfloat16* store, int R) {
  const int per = R / 8, ld = R + ATC_PAD;
  for (int i = threadIdx.x; i < ATC_BLOCK * per; i += blockDim.x) {
    const int k = i / per, c = 8 * (i % per), row = sh.slot[k];
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row >= 0) v = *reinterpret_cast<const uint4*>(store + (long long)row * R + c);
    *reinterpret_cast<uint4*>(sh.kv + k * ld + c) = v;
  }
  __syncthreads();
}

// Warp w's scores S[tile mt's 16 rows, keys 16kw..16kw+15] = Q K^T, scaled, absent (for query row q) -inf (this
// lane's: rows g, g + 8); the warp's row maxima into sh.pmax[kw].
static __device__ void atc_scores(const AtcShared& sh, int R, float scale, int mt, int q, float acc[2][4]) {
  const int lane = threadIdx.x & 31, kw = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3, ld = R + ATC_PAD;
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
  const int steps = R / 32;
  const __nv_bfloat16* qt = sh.q + 16 * mt * ld;
  for (int i = 0; i < steps; ++i) {
    const int k0 = 32 * ATC_STEP(i, steps);
    unsigned qa[2][4], kb[2][4];
    for (int h = 0; h < 2; ++h) {
      const __nv_bfloat16* qrow = qt + (lane & 15) * ld + k0 + 16 * h + 8 * (lane >> 4);
#ifdef TRANSPOSED_FRAGMENT
      mma_ldmatrix_x4_trans(qa[h], qrow);
#else
      mma_ldmatrix_x4(qa[h], qrow);
#endif
    }
    for (int n = 0; n < 2; ++n)
      mma_ldmatrix_x4(kb[n], sh.kv + (16 * kw + 8 * n + (lane & 7)) * ld + k0 + 8 * (lane >> 3));
    for (int h = 0; h < 2; ++h) {
      const int hh = ATC_STEP(h, 2);
      for (int n = 0; n < 2; ++n) mma_m16n8k16_bf16(acc[n], qa[hh], &kb[n][2 * hh], acc[n]);
    }
  }
  float mx[2] = {-INFINITY, -INFINITY};
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 4; ++i) {
      const int key = 16 * kw + 8 * n + 2 * t + (i & 1);
      acc[n][i] = sh.pres[q * ATC_BLOCK + key] ? acc[n][i] * scale : -INFINITY;
      mx[i >> 1] = fmaxf(mx[i >> 1], acc[n][i]);
    }
  for (int hr = 0; hr < 2; ++hr) {
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(FULL_MASK, mx[hr], 1));
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(FULL_MASK, mx[hr], 2));
    if (t == 0) sh.pmax[kw * 16 * ATC_TILES + 16 * mt + g + 8 * hr] = mx[hr];
  }
}

// m' from the tile's four key quarters' maxima (exact in any order), alpha = exp(m - m'); warp w's P =
// bf16(exp(s - m')) (absent 0) into sh.p. m becomes m'.
static __device__ void atc_softmax(const AtcShared& sh, const float acc[2][4], int mt, int q, float m[2],
                                   float alpha[2]) {
  const int lane = threadIdx.x & 31, kw = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  for (int hr = 0; hr < 2; ++hr) {
    float mx = m[hr];
    for (int v = 0; v < 4; ++v) mx = fmaxf(mx, sh.pmax[v * 16 * ATC_TILES + 16 * mt + g + 8 * hr]);
    alpha[hr] = exp_f32(m[hr] - mx);
    m[hr] = mx;
  }
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 4; ++i) {
      const int key = 16 * kw + 8 * n + 2 * t + (i & 1);
      const float p = sh.pres[q * ATC_BLOCK + key] ? exp_f32(acc[n][i] - m[i >> 1]) : 0.0f;
      sh.p[(16 * mt + g + 8 * (i >> 1)) * (ATC_BLOCK + ATC_PAD) + key] = to_bf16(p);
    }
}

#ifdef IEEE_SUM
// d += P[tile rows r0.., keys 16ks..16ks+15] V[keys, columns n0..n0+7] as fp32 IEEE sums in key order (this
// lane's four).
static __device__ void atc_ieee(float d[4], const AtcShared& sh, int ld, int r0, int ks, int n0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) {
    const int r = r0 + g + 8 * (i >> 1), col = n0 + 2 * t + (i & 1);
    for (int kk = 0; kk < 16; ++kk) {
      const int key = 16 * ks + kk;
      d[i] += __bfloat162float(sh.p[r * (ATC_BLOCK + ATC_PAD) + key]) * __bfloat162float(sh.kv[key * ld + col]);
    }
  }
}
#endif

// The step merged into l and warp w's o from tile mt's rows of sh.p: l = chain(P, ones, l alpha),
// o = chain(P, V, o alpha).
static __device__ void atc_merge(const AtcShared& sh, int R, int mt, const float alpha[2], float l[2],
                                 float o[][2][4]) {
  const int lane = threadIdx.x & 31, kw = (threadIdx.x >> 5) & 3, ld = R + ATC_PAD, pairs = R / 64;
  float lc[4] = {l[0] * alpha[0], l[0] * alpha[0], l[1] * alpha[1], l[1] * alpha[1]};
  const unsigned ones[2] = {0x3F803F80u, 0x3F803F80u};
#pragma unroll
  for (int p = 0; p < ATC_MAX_R / 64; ++p)
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 4; ++i) o[p][n][i] *= alpha[i >> 1];
#pragma unroll 1
  for (int i = 0; i < 4; ++i) {  // kept a loop: one k step's loads and 17 mma an iteration
    const int ks = ATC_STEP(i, 4);
    unsigned pa[4];
    mma_ldmatrix_x4(pa, sh.p + (16 * mt + (lane & 15)) * (ATC_BLOCK + ATC_PAD) + 16 * ks + 8 * (lane >> 4));
    mma_m16n8k16_bf16(lc, pa, ones, lc);
#pragma unroll
    for (int p = 0; p < ATC_MAX_R / 64; ++p) {
      if (p >= pairs) break;
      const int n0 = kw * (R / 4) + 16 * p;
#ifdef IEEE_SUM
      atc_ieee(o[p][0], sh, ld, 16 * mt, ks, n0);
      atc_ieee(o[p][1], sh, ld, 16 * mt, ks, n0 + 8);
#else
      unsigned vb[4];
      mma_ldmatrix_x4_trans(vb, sh.kv + (16 * ks + (lane & 7) + 8 * ((lane >> 3) & 1)) * ld + n0 + 8 * (lane >> 4));
      mma_m16n8k16_bf16(o[p][0], pa, vb, o[p][0]);
      mma_m16n8k16_bf16(o[p][1], pa, vb + 2, o[p][1]);
#endif
    }
  }
  l[0] = lc[0];
  l[1] = lc[2];
}

// The tiles' queries (tile mt: query row 16 mt / hb, heads h0 + 16 mt % hb ..; zero past H or T) and each query
// row's state (OFF_GRID: its grid base the row's first position).
static __device__ void atc_init(const AtcShared& sh, const __nv_bfloat16* qa, const int* tokens, const int* counts,
                                int T, int H, int R, int W, int t0, int h0, int hb) {
  const int per = R / 8, ld = R + ATC_PAD;
  for (int i = threadIdx.x; i < 16 * ATC_TILES * per; i += blockDim.x) {
    const int r = i / per, t = t0 + r / hb, hq = h0 + r % hb;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (hq < H && t < T) v = *reinterpret_cast<const uint4*>(qa + ((long long)t * H + hq) * R + 8 * (i % per));
    *reinterpret_cast<uint4*>(sh.q + r * ld + 8 * (i % per)) = v;
  }
  if (threadIdx.x < ATC_ROWS) {
    int* s = sh.st + ATC_ST * threadIdx.x;
    const int t = t0 + threadIdx.x, n = t < T && (int)threadIdx.x < 16 * ATC_TILES / hb ? counts[t] : 0;
    s[0] = s[1] = s[3] = 0;
    s[2] = n;
#ifdef OFF_GRID
    s[4] = n > 0 ? tokens[(long long)t * W] : 0;
#else
    s[4] = 0;
#endif
  }
  __syncthreads();
}

// grid (ceil(T / (16 ATC_TILES / hb)), ceil(H / hb)), block 32 ATC_WARPS; hb 16 or 16 ATC_TILES heads a block
// (the launcher's). Dynamic shared memory: atc_shared_bytes in the launcher.
extern "C" __global__ void __launch_bounds__(32 * ATC_WARPS, 2) attention_tc(
    const __nv_bfloat16* __restrict__ qa,     // [T, H, R] bf16
    const __nv_bfloat16* __restrict__ store,  // [N, R] bf16 latent rows
    const int* __restrict__ tokens,           // [T, W] i32 positions, strictly ascending, -1 padded
    const int* __restrict__ table,            // [S, width] i32 page tables
    const int* __restrict__ seg,              // [T] i32 row t's table row
    const int* __restrict__ counts,           // [T] i32 positions used per row
    __nv_bfloat16* __restrict__ out,          // [T, H, R] bf16
    int T, int H, int R, int W, float scale, int width, int pt, int hb) {
  extern __shared__ __align__(16) unsigned char atc_sh[];
  const int ld = R + ATC_PAD, qr = 16 * ATC_TILES / hb, t0 = qr * blockIdx.x, h0 = hb * blockIdx.y;
  AtcShared sh;
  sh.kv = reinterpret_cast<__nv_bfloat16*>(atc_sh);
  sh.q = sh.kv + ATC_BLOCK * ld;
  sh.p = sh.q + 16 * ATC_TILES * ld;
  sh.pmax = reinterpret_cast<float*>(sh.p + 16 * ATC_TILES * (ATC_BLOCK + ATC_PAD));
  sh.slot = reinterpret_cast<int*>(sh.pmax + 4 * 16 * ATC_TILES);
  sh.pres = sh.slot + ATC_BLOCK;
  sh.st = sh.pres + ATC_ROWS * ATC_BLOCK;
  atc_init(sh, qa, tokens, counts, T, H, R, W, t0, h0, hb);
  const int w = threadIdx.x >> 5, mt = w >> 2, q = 16 * mt / hb, hm = h0 + 16 * mt % hb;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[ATC_MAX_R / 64][2][4];
#pragma unroll
  for (int p = 0; p < ATC_MAX_R / 64; ++p)
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 4; ++i) o[p][n][i] = 0.0f;
  for (;;) {
    atc_pick(sh, tokens, seg, W, t0, qr, pt);
    if (!sh.st[ATC_ROWS * ATC_ST + 1]) break;
    atc_slots(sh, tokens, table, seg, T, W, t0, qr, width, pt);
    atc_stage(sh, store, R);
    const bool on = sh.st[ATC_ST * q + 3] && hm < H;  // warp-uniform: this tile's row touches the step's block
    float acc[2][4], alpha[2];
    if (on) atc_scores(sh, R, scale, mt, q, acc);
    __syncthreads();
    if (on) atc_softmax(sh, acc, mt, q, m, alpha);
    __syncthreads();
    if (on) atc_merge(sh, R, mt, alpha, l, o);
    __syncthreads();  // the next step rewrites the slots, rows and scores
  }
  const int lane = threadIdx.x & 31, kw = w & 3, g = lane >> 2, tt = lane & 3, t = t0 + q;
  if (t >= T) return;
#pragma unroll
  for (int p = 0; p < ATC_MAX_R / 64; ++p) {
    if (p >= R / 64) break;
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i >> 1), col = kw * (R / 4) + 16 * p + 8 * n + 2 * tt + (i & 1);
        if (hm + r < H) out[((long long)t * H + hm + r) * R + col] = to_bf16(o[p][n][i] / l[i >> 1]);
      }
  }
}
