// attention_tc.cu -- absorbed MLA prefill attention on the tensor core (keys equal values): the prompt rows of the
// op attention_paged (kernels/ops_attention.py). Reference: cupyglm/backend/tc_attention.py (the exact model). A
// block of 4 warps takes one row and 16 heads (the mma tile's M; heads past H are zero queries, never stored):
// the row's positions tokens[t, :counts[t]] (strictly ascending) fall into key blocks of 64 positions aligned to
// absolute positions; each block is staged as a 64-slot tile in shared memory (absent slots zero) and merged into
// the online softmax in position order:
//   S = Q K^T   warp w the keys 16w..16w+15, a chain over R in ascending k steps of 16 from +0.0;
//   s = S * scale (absent -inf), m' = max(m, max s), P = bf16(exp_f32(s - m')) (absent 0; warp w its own keys',
//   staged in shared memory for every warp's P V), alpha = exp_f32(m - m');
//   l = chain(P, ones, C = l alpha) and o = chain(P, V, C = o alpha), warp w the columns [wR/4, (w+1)R/4).
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
#define ATC_WARPS 4
#define ATC_MAX_R 512     // the widest latent row: R / 32 output tiles of 8 columns a warp
#define ATC_PAD 8         // bf16 past each shared row, so ldmatrix's eight rows fall in different banks

#ifdef CHAIN_REVERSED
#define ATC_STEP(i, n) ((n) - 1 - (i))
#else
#define ATC_STEP(i, n) (i)
#endif

struct AtcShared {
  __nv_bfloat16* kv;   // [ATC_BLOCK, R + ATC_PAD] the block's latent rows, absent slots zero
  __nv_bfloat16* q;    // [16, R + ATC_PAD] the row's 16 heads
  __nv_bfloat16* p;    // [16, ATC_BLOCK + ATC_PAD] the block's P
  float* pmax;         // [ATC_WARPS, 16] each warp's row maxima of its keys' scores
  int* slot;           // [ATC_BLOCK] store row of each slot, -1 absent
  int* next;           // [1] the first list entry past the block
};

// The block's slots from list entries j.. (at most 64 of them share a block); sets *next past them.
static __device__ void atc_slots(const AtcShared& sh, const int* tokens, const int* table, const int* seg, int T,
                                 int t, int W, int j, int count, int width, int pt) {
  const int tid = threadIdx.x;
  if (tid < ATC_BLOCK) sh.slot[tid] = -1;
  if (tid == 0) *sh.next = j;
  __syncthreads();
#ifdef OFF_GRID
  const int base = tokens[(long long)t * W];
#else
  const int base = 0;
#endif
  const int b = (tokens[(long long)t * W + j] - base) / ATC_BLOCK;
  const int e = j + tid;
  if (tid < ATC_BLOCK && e < count) {
    const int p = tokens[(long long)t * W + e] - base;
    if (p / ATC_BLOCK == b) {
      sh.slot[p % ATC_BLOCK] = att_store_row(tokens, table, seg, T, t, W, e, width, pt);
      atomicMax(sh.next, e + 1);
    }
  }
  __syncthreads();
}

// The block's latent rows into shared memory, 8 bf16 a copy; absent slots zero.
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

// Warp w's scores S[16, keys 16w..16w+15] = Q K^T, scaled, absent -inf (this lane's: rows g, g + 8); the warp's
// row maxima into sh.pmax[w].
static __device__ void atc_scores(const AtcShared& sh, int R, float scale, float acc[2][4]) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, ld = R + ATC_PAD;
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
  const int steps = R / 32;
  for (int i = 0; i < steps; ++i) {
    const int k0 = 32 * ATC_STEP(i, steps);
    unsigned qa[2][4], kb[2][4];
    for (int h = 0; h < 2; ++h) {
      const __nv_bfloat16* qrow = sh.q + (lane & 15) * ld + k0 + 16 * h + 8 * (lane >> 4);
#ifdef TRANSPOSED_FRAGMENT
      mma_ldmatrix_x4_trans(qa[h], qrow);
#else
      mma_ldmatrix_x4(qa[h], qrow);
#endif
    }
    for (int n = 0; n < 2; ++n)
      mma_ldmatrix_x4(kb[n], sh.kv + (16 * w + 8 * n + (lane & 7)) * ld + k0 + 8 * (lane >> 3));
    for (int h = 0; h < 2; ++h) {
      const int hh = ATC_STEP(h, 2);
      for (int n = 0; n < 2; ++n) mma_m16n8k16_bf16(acc[n], qa[hh], &kb[n][2 * hh], acc[n]);
    }
  }
  float mx[2] = {-INFINITY, -INFINITY};
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 4; ++i) {
      const int key = 16 * w + 8 * n + 2 * t + (i & 1);
      acc[n][i] = sh.slot[key] >= 0 ? acc[n][i] * scale : -INFINITY;
      mx[i >> 1] = fmaxf(mx[i >> 1], acc[n][i]);
    }
  for (int hr = 0; hr < 2; ++hr) {
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(FULL_MASK, mx[hr], 1));
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(FULL_MASK, mx[hr], 2));
    if (t == 0) sh.pmax[w * 16 + g + 8 * hr] = mx[hr];
  }
}

// m' from every warp's maxima (exact in any order), alpha = exp(m - m'); warp w's P = bf16(exp(s - m')) (absent 0)
// into sh.p. m becomes m'.
static __device__ void atc_softmax(const AtcShared& sh, const float acc[2][4], float m[2], float alpha[2]) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  for (int hr = 0; hr < 2; ++hr) {
    float mx = m[hr];
    for (int v = 0; v < ATC_WARPS; ++v) mx = fmaxf(mx, sh.pmax[v * 16 + g + 8 * hr]);
    alpha[hr] = exp_f32(m[hr] - mx);
    m[hr] = mx;
  }
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 4; ++i) {
      const int key = 16 * w + 8 * n + 2 * t + (i & 1);
      const float p = sh.slot[key] >= 0 ? exp_f32(acc[n][i] - m[i >> 1]) : 0.0f;
      sh.p[(g + 8 * (i >> 1)) * (ATC_BLOCK + ATC_PAD) + key] = to_bf16(p);
    }
}

#ifdef IEEE_SUM
// d += P[rows, keys 16ks..16ks+15] V[keys, columns n0..n0+7] as fp32 IEEE sums in key order (this lane's four).
static __device__ void atc_ieee(float d[4], const AtcShared& sh, int ld, int ks, int n0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i >> 1), col = n0 + 2 * t + (i & 1);
    for (int kk = 0; kk < 16; ++kk) {
      const int key = 16 * ks + kk;
      d[i] += __bfloat162float(sh.p[r * (ATC_BLOCK + ATC_PAD) + key]) * __bfloat162float(sh.kv[key * ld + col]);
    }
  }
}
#endif

// The block merged into l and warp w's o from sh.p: l = chain(P, ones, l alpha), o = chain(P, V, o alpha).
static __device__ void atc_merge(const AtcShared& sh, int R, const float alpha[2], float l[2], float o[][2][4]) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, ld = R + ATC_PAD, pairs = R / 64;
  unsigned pa[4][4];
  for (int ks = 0; ks < 4; ++ks)
    mma_ldmatrix_x4(pa[ks], sh.p + (lane & 15) * (ATC_BLOCK + ATC_PAD) + 16 * ks + 8 * (lane >> 4));
  float lc[4] = {l[0] * alpha[0], l[0] * alpha[0], l[1] * alpha[1], l[1] * alpha[1]};
  const unsigned ones[2] = {0x3F803F80u, 0x3F803F80u};
  for (int i = 0; i < 4; ++i) mma_m16n8k16_bf16(lc, pa[ATC_STEP(i, 4)], ones, lc);
  l[0] = lc[0];
  l[1] = lc[2];
#pragma unroll
  for (int p = 0; p < ATC_MAX_R / 64; ++p)
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 4; ++i) o[p][n][i] *= alpha[i >> 1];
  for (int i = 0; i < 4; ++i) {
    const int ks = ATC_STEP(i, 4);
#pragma unroll
    for (int p = 0; p < ATC_MAX_R / 64; ++p) {
      if (p >= pairs) break;
      const int n0 = w * (R / 4) + 16 * p;
#ifdef IEEE_SUM
      atc_ieee(o[p][0], sh, ld, ks, n0);
      atc_ieee(o[p][1], sh, ld, ks, n0 + 8);
#else
      unsigned vb[4];
      mma_ldmatrix_x4_trans(vb, sh.kv + (16 * ks + (lane & 7) + 8 * ((lane >> 3) & 1)) * ld + n0 + 8 * (lane >> 4));
      mma_m16n8k16_bf16(o[p][0], pa[ks], vb, o[p][0]);
      mma_m16n8k16_bf16(o[p][1], pa[ks], vb + 2, o[p][1]);
#endif
    }
  }
}

// grid (T, ceil(H / 16)), block 128 (ATC_WARPS warps). Dynamic shared memory: atc_shared_bytes in the launcher.
extern "C" __global__ void __launch_bounds__(128) attention_tc(
    const __nv_bfloat16* __restrict__ qa,     // [T, H, R] bf16
    const __nv_bfloat16* __restrict__ store,  // [N, R] bf16 latent rows
    const int* __restrict__ tokens,           // [T, W] i32 positions, strictly ascending, -1 padded
    const int* __restrict__ table,            // [S, width] i32 page tables
    const int* __restrict__ seg,              // [T] i32 row t's table row
    const int* __restrict__ counts,           // [T] i32 positions used per row
    __nv_bfloat16* __restrict__ out,          // [T, H, R] bf16
    int T, int H, int R, int W, float scale, int width, int pt) {
  extern __shared__ __align__(16) unsigned char atc_sh[];
  const int ld = R + ATC_PAD, t = blockIdx.x, h0 = 16 * blockIdx.y, per = R / 8;
  AtcShared sh;
  sh.kv = reinterpret_cast<__nv_bfloat16*>(atc_sh);
  sh.q = sh.kv + ATC_BLOCK * ld;
  sh.p = sh.q + 16 * ld;
  sh.pmax = reinterpret_cast<float*>(sh.p + 16 * (ATC_BLOCK + ATC_PAD));
  sh.slot = reinterpret_cast<int*>(sh.pmax + ATC_WARPS * 16);
  sh.next = sh.slot + ATC_BLOCK;
  for (int i = threadIdx.x; i < 16 * per; i += blockDim.x) {
    const int hq = h0 + i / per;  // a head past H: a zero query row, its output never stored
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (hq < H) v = *reinterpret_cast<const uint4*>(qa + ((long long)t * H + hq) * R + 8 * (i % per));
    *reinterpret_cast<uint4*>(sh.q + (i / per) * ld + 8 * (i % per)) = v;
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[ATC_MAX_R / 64][2][4];
#pragma unroll
  for (int p = 0; p < ATC_MAX_R / 64; ++p)
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 4; ++i) o[p][n][i] = 0.0f;
  const int count = counts[t];
  for (int j = 0; j < count;) {
    atc_slots(sh, tokens, table, seg, T, t, W, j, count, width, pt);
    atc_stage(sh, store, R);
    float acc[2][4], alpha[2];
    atc_scores(sh, R, scale, acc);
    __syncthreads();
    atc_softmax(sh, acc, m, alpha);
    __syncthreads();
    atc_merge(sh, R, alpha, l, o);
    j = *sh.next;
    __syncthreads();  // the next block rewrites the slots, rows and scores
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tt = lane & 3;
#pragma unroll
  for (int p = 0; p < ATC_MAX_R / 64; ++p) {
    if (p >= R / 64) break;
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i >> 1), col = w * (R / 4) + 16 * p + 8 * n + 2 * tt + (i & 1);
        if (h0 + r < H) out[((long long)t * H + h0 + r) * R + col] = to_bf16(o[p][n][i] / l[i >> 1]);
      }
  }
}
