// attention_split.cu -- attention.cu's arithmetic for decode/verify rows, split so that all heads of a block share
// each latent row and the chunks of a row's list run in parallel (FlashMLA-style), with the same bits:
//
//   1. attention_chunk_scores  block (t, chunk c, head group): each of the chunk's latent rows is read once into
//      shared memory for ATT_HG heads; s = (q . k) * scale (lane-16 over R, as attention.cu); writes s and the
//      chunk max cm[t, h, c] (fmaxf from -inf: NaN dropped, as attention.cu's warp max).
//   2. attention_chunk_pv      block (t, c, head group): m_c = the running max after chunk c (fmaxf of cm[0..c]
//      from -inf: the value attention.cu's m_new has there), P = bf16(exp(s - m_c)), ps = lane-16 sum of P, and
//      pv[r] = sum_j P_j v_j[r] in 16 partials (key j in partial j % 16, increasing j) folded -- each latent
//      element read once for the block's heads.  Then the merge, by the last block of (t, head group) to finish
//      (__threadfence, then an atomic count in done[t, g], zeroed by the scores kernel): m, l, o merged chunk by
//      chunk in list order exactly as attention.cu (alpha = exp(m - m_new), l = l alpha + ps, o = o alpha + pv),
//      out = bf16(o / l).  The merge reads every chunk in list order, so its bits do not depend on which block
//      finishes last.
//
// A max is exact in any order, so m_c equals the sequential running max (a zero's sign aside, which changes no
// exp); every other value is computed by the same operations in the same order as attention.cu.
// Scratch (fp32): s [T, H, W], cm / ps [T, H, C], pv [T, H, C, R], C = ceil(W / chunk): sized for decode rows;
// done [T, G] u32 the pv blocks' count per (row, head group).
#include "common.cuh"
#include "exp_f32.cuh"
#include "attention_rows.cuh"

#define ATT_HG 4          // heads per block sharing each latent row
#define ATT_KT 16         // keys per shared-memory tile of latent rows in the scores kernel
#define ATT_SPLIT_RT 4    // output columns per thread in the pv kernel: R <= ATT_SPLIT_RT * 256

// grid (T, C, ceil(H / ATT_HG)), block 256. Dynamic shared memory: ATT_KT * R bf16 (the key tile) +
// ATT_HG * chunk floats (the block's scores).
extern "C" __global__ void __launch_bounds__(256) attention_chunk_scores(
    const __nv_bfloat16* __restrict__ qa,     // [T, H, R] bf16
    const __nv_bfloat16* __restrict__ store,  // [N, R] bf16
    const int* __restrict__ rows,             // [T, W] i32 store row ids or positions (pt > 0), -1 padded
    const int* __restrict__ table,            // [S, width] i32 each segment's page table (pt > 0, attention_rows.cuh)
    const int* __restrict__ seg,              // [T] i32 row t's segment, its row of table (pt > 0)
    const int* __restrict__ counts,           // [T] i32 ids used per row
    float* __restrict__ s,                    // [T, H, W] f32 scores (entries < counts[t] written)
    float* __restrict__ cm,                   // [T, H, C] f32 chunk max (chunks inside counts[t] written)
    unsigned int* __restrict__ done,          // [T, G] u32 finished pv blocks, G = ceil(H / ATT_HG): zeroed here
    int T, int H, int R, int W, int C, float scale, int chunk, int width, int pt) {
  extern __shared__ float att_split_sh[];
  __nv_bfloat16* kt = (__nv_bfloat16*)att_split_sh;            // [ATT_KT, R] bf16 latent rows of the tile
  float* sp = att_split_sh + (ATT_KT * R + 1) / 2;             // [ATT_HG, chunk] scores
  __shared__ int kid[ATT_KT];                                  // store rows of the tile's keys
  const int t = blockIdx.x, c = blockIdx.y, h0 = blockIdx.z * ATT_HG;
  if (c == 0 && threadIdx.x == 0) done[(long long)t * gridDim.z + blockIdx.z] = 0u;   // before the pv kernel runs
  const int count = counts[t];
  const int c0 = c * chunk;
  if (c0 >= count) return;                                     // the whole block leaves together
  const int n = min(chunk, count - c0);
  const int nh = min(ATT_HG, H - h0);
  const int tid = threadIdx.x, lane = tid & 15, grp = tid >> 4;
  for (int j0 = 0; j0 < n; j0 += ATT_KT) {
    const int nk = min(ATT_KT, n - j0);
    __syncthreads();                                           // the previous tile is no longer read
    if (tid < nk) kid[tid] = att_store_row(rows, table, seg, T, t, W, c0 + j0 + tid, width, pt);
    __syncthreads();
    for (int i = tid; i < nk * R; i += 256) {
      const int j = i / R, r = i % R;
      kt[i] = store[(long long)kid[j] * R + r];
    }
    __syncthreads();
    // (head, key) pairs of the tile, one group of 16 threads each; rounds are block-uniform (convergent shuffles)
    for (int p0 = 0; p0 < ATT_HG * ATT_KT; p0 += 16) {
      const int p = p0 + grp, hh = p / ATT_KT, j = p % ATT_KT;
      const bool on = hh < nh && j < nk;
      float acc = 0.0f;
      if (on) {
        const __nv_bfloat16* q = qa + ((long long)t * H + h0 + hh) * R;
        for (int r = lane; r < R; r += 16) acc += ld_bf16(q, r) * __bfloat162float(kt[j * R + r]);
      }
      acc = lane16_fold(acc);
      if (on && lane == 0) sp[hh * chunk + j0 + j] = acc * scale;
    }
  }
  __syncthreads();
  const int warp = tid >> 5, wl = tid & 31;
  if (warp < nh) {                                             // warp hh: head hh's chunk max and its scores out
    float mx = -INFINITY;
    for (int j = wl; j < n; j += 32) {
      const float v = sp[warp * chunk + j];
      mx = fmaxf(mx, v);
      s[((long long)t * H + h0 + warp) * W + c0 + j] = v;
    }
    mx = warp_max(mx);
    if (wl == 0) cm[((long long)t * H + h0 + warp) * C + c] = mx;
  }
}

// The chunks of (t, heads h0..h0+nh-1) merged in list order, by every thread of one block; ps and pv are read
// through volatile (other blocks wrote them in this launch: no stale cached copy).
static __device__ void att_merge(const int* __restrict__ counts, const float* __restrict__ cm, const float* ps,
                                 const float* pv, __nv_bfloat16* __restrict__ out, int t, int h0, int nh, int H,
                                 int R, int C, int chunk) {
  const volatile float* vps = ps;
  const volatile float* vpv = pv;
  const int count = counts[t];
  for (int i = threadIdx.x; i < nh * R; i += blockDim.x) {
    const int hh = i / R, r = i % R;
    const long long th = (long long)t * H + h0 + hh;
    float m = -INFINITY, l = 0.0f, o = 0.0f;
    for (int c = 0; c * chunk < count; ++c) {
      const float m_new = fmaxf(m, cm[th * C + c]);
      const float alpha = exp_f32(m - m_new);
      l = l * alpha + vps[th * C + c];
      o = o * alpha + vpv[(th * C + c) * R + r];
      m = m_new;
    }
    out[th * R + r] = to_bf16(o / l);
  }
}

// grid (T, C, ceil(H / ATT_HG)), block 256. Dynamic shared memory: ATT_HG * chunk floats (P) + chunk ints (ids).
extern "C" __global__ void __launch_bounds__(256) attention_chunk_pv(
    const __nv_bfloat16* __restrict__ store,  // [N, R] bf16
    const int* __restrict__ rows,             // [T, W] i32 (as the scores kernel's)
    const int* __restrict__ table,            // [S, width] i32 (as the scores kernel's)
    const int* __restrict__ seg,              // [T] i32
    const int* __restrict__ counts,           // [T] i32
    const float* __restrict__ s,              // [T, H, W] f32 scores
    const float* __restrict__ cm,             // [T, H, C] f32 chunk max
    float* ps,                                // [T, H, C] f32 lane-16 sum of the chunk's P (read by the merge)
    float* pv,                                // [T, H, C, R] f32 the chunk's P.V (read by the merge)
    unsigned int* __restrict__ done,          // [T, G] u32 finished blocks per (t, head group), zero on entry
    __nv_bfloat16* __restrict__ out,          // [T, H, R] bf16
    int T, int H, int R, int W, int C, int chunk, int width, int pt) {
  extern __shared__ float att_pv_sh[];
  float* p = att_pv_sh;                                        // [ATT_HG, chunk] P (bf16 values)
  int* ids = (int*)(att_pv_sh + ATT_HG * chunk);               // [chunk] row ids
  __shared__ unsigned int last;                                // this block finished (t, g) last
  const int t = blockIdx.x, c = blockIdx.y, h0 = blockIdx.z * ATT_HG;
  const int count = counts[t];
  const int c0 = c * chunk;
  const int nh = min(ATT_HG, H - h0);
  if (c0 >= count) {
    if (c == 0) att_merge(counts, cm, ps, pv, out, t, h0, nh, H, R, C, chunk);   // an empty list: o / l as ever
    return;
  }
  const int n = min(chunk, count - c0);
  const int tid = threadIdx.x;
  for (int j = tid; j < n; j += 256) ids[j] = att_store_row(rows, table, seg, T, t, W, c0 + j, width, pt);
  for (int i = tid; i < nh * n; i += 256) {
    const int hh = i / n, j = i % n;
    const long long th = (long long)t * H + h0 + hh;
    float m = -INFINITY;                                       // the running max after chunk c
    for (int cc = 0; cc <= c; ++cc) m = fmaxf(m, cm[th * C + cc]);
    p[hh * chunk + j] = bf16_round(exp_f32(s[th * W + c0 + j] - m));
  }
  __syncthreads();
  const int lane = tid & 15, grp = tid >> 4;
  {                                                            // group hh: the lane-16 sum of head hh's P
    float a = 0.0f;
    if (grp < nh)
      for (int j = lane; j < n; j += 16) a += p[grp * chunk + j];
    a = lane16_fold(a);                                        // every warp whole (full-mask shuffles)
    if (grp < nh && lane == 0) ps[((long long)t * H + h0 + grp) * C + c] = a;
  }
#pragma unroll
  for (int cc = 0; cc < ATT_SPLIT_RT; ++cc) {
    const int r = tid + cc * 256;
    if (r < R) {
      float a[ATT_HG][16];
#pragma unroll
      for (int hh = 0; hh < ATT_HG; ++hh)
#pragma unroll
        for (int u = 0; u < 16; ++u) a[hh][u] = 0.0f;
      for (int j0 = 0; j0 < n; j0 += 16) {
#pragma unroll
        for (int u = 0; u < 16; ++u) {
          if (j0 + u < n) {
            const float v = ld_bf16(store, (long long)ids[j0 + u] * R + r);   // one read for the block's heads
#pragma unroll
            for (int hh = 0; hh < ATT_HG; ++hh) a[hh][u] += p[hh * chunk + j0 + u] * v;
          }
        }
      }
#pragma unroll
      for (int hh = 0; hh < ATT_HG; ++hh) {
        if (hh < nh) {
#pragma unroll
          for (int w = 8; w > 0; w >>= 1)
#pragma unroll
            for (int u = 0; u < w; ++u) a[hh][u] = a[hh][u] + a[hh][u + w];
          pv[(((long long)t * H + h0 + hh) * C + c) * R + r] = a[hh][0];
        }
      }
    }
  }
  __threadfence();                                             // ps / pv visible before the count says so
  __syncthreads();
  if (tid == 0) {
    const unsigned int chunks = (unsigned int)((count + chunk - 1) / chunk);
#ifdef ATT_PLANT_FIRST_DONE
    last = atomicAdd(&done[(long long)t * gridDim.z + blockIdx.z], 1u) == 0u;   // planted: the first block merges
#else
    last = atomicAdd(&done[(long long)t * gridDim.z + blockIdx.z], 1u) == chunks - 1u;
#endif
  }
  __syncthreads();
  if (!last) return;
  __threadfence();                                             // the other blocks' ps / pv, after their counts
  att_merge(counts, cm, ps, pv, out, t, h0, nh, H, R, C, chunk);
}
