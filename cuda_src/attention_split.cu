// attention_split.cu -- attention.cu's arithmetic for decode/verify rows, split so that every loaded latent row and
// query element is reused from registers by several heads and keys, with the same bits:
//
//   1. attention_chunk_scores  block (t, key tile y of ATT_SKT keys inside chunk y / tpc, head group of ATT_SHG):
//      the tile's latent rows and the group's queries are staged as fp32 in slices of ATT_SRS columns; a thread
//      holds 4 of the 16 lanes (columns 16 i + 4 b .. + 3, one 16-byte shared load) of ATT_SNH x ATT_SNK dots, so
//      each lane sums its columns in increasing order; the four threads of a dot fold as the reference's
//      butterfly (+8, +4 across threads, +2, +1 inside). s = dot * scale; the tile max goes to cm[t, h, y]
//      (fmaxf from -inf over the tile's keys, -inf for a tile past the count).
//   2. attention_chunk_pv      block (t, c, head group of ATT_PHG x column slice of ATT_PRB): m_c = fmaxf over the
//      tile maxima of chunks 0..c (the value attention.cu's m_new has there: a max is exact in any grouping),
//      P = bf16(exp(s - m_c)) staged [key][head], ps = lane-16 sum of P; thread (lane, group) sums keys j = lane
//      mod 16 in increasing j for 8 heads x 4 columns (one 8-byte load of v per key, fp32 once), then lane16_fold.
//      The last block of (t, head group, column slice) to finish (__threadfence, then an atomic count in
//      done[t, z], zeroed by the scores kernel) merges its columns chunk by chunk in list order exactly as
//      attention.cu (alpha = exp(m - m_new), l = l alpha + ps, o = o alpha + pv), out = bf16(o / l); the merge
//      reads every chunk in list order, so its bits do not depend on which block finishes last.
//
// Every value is computed by the same operations in the same order as attention.cu (a zero's sign of a max aside,
// which changes no exp).  R % 8 == 0 (16-byte rows).  Scratch (fp32): s [T, H, W], cm [T, H, C * tpc],
// ps [T, RSL, H, C], pv [T, H, C, R], C = ceil(W / chunk), tpc = ceil(chunk / ATT_SKT), RSL = ceil(R / ATT_PRB);
// done [T, G * RSL] u32, G = ceil(H / ATT_PHG).
#include "common.cuh"
#include "exp_f32.cuh"
#include "attention_rows.cuh"

#define ATT_SHG 16        // heads per scores block
#define ATT_SKT 32        // keys per scores block (a warp's lanes in the tile max)
#define ATT_SRS 128       // latent columns per staged slice
#define ATT_SPAD 16       // floats after each staged row: the rows of a quarter warp's loads fall on other banks
#define ATT_SNH 4         // heads per scores thread
#define ATT_SNK 2         // keys per scores thread
#define ATT_PHG 8         // heads per pv block
#define ATT_PRB 64        // latent columns per pv block (4 a thread, 16 groups)
static_assert(ATT_PHG == 8 && ATT_PRB == 64, "attention_chunk_pv: a warp a head, 16 groups of 4 columns");
static_assert(ATT_SHG / ATT_SNH * ATT_SKT / ATT_SNK == 64 && ATT_SKT == 32, "scores: 64 quads, a warp of keys");

// 8 bf16 (one 16-byte word) -> 8 floats, exact.
static __device__ __forceinline__ void att_unpack8(uint4 v, float* d) {
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    d[2 * i] = __uint_as_float(w[i] << 16);
    d[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// A slice [r0, r0 + rp) of the group's queries and the tile's latent rows as fp32, zeros past R, nh and nk.
static __device__ void att_stage(float (*qs)[ATT_SRS + ATT_SPAD], float (*ks)[ATT_SRS + ATT_SPAD],
                                 const __nv_bfloat16* __restrict__ qa, const __nv_bfloat16* __restrict__ store,
                                 const int* kid, long long qrow, int nh, int nk, int R, int r0, int rn, int rp) {
  const int per = rp / 8;
  for (int i = threadIdx.x; i < (ATT_SHG + ATT_SKT) * per; i += blockDim.x) {
    const int row = i / per, e = (i % per) * 8;
    const bool q = row < ATT_SHG;
    const int kr = row - ATT_SHG;
    const bool on = e < rn && (q ? row < nh : kr < nk);
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (on) {
      const __nv_bfloat16* src = q ? qa + (qrow + row) * R + r0 + e : store + (long long)kid[kr] * R + r0 + e;
      v = *reinterpret_cast<const uint4*>(src);
    }
    att_unpack8(v, q ? &qs[row][e] : &ks[kr][e]);
  }
}

// grid (T, C * tpc, ceil(H / ATT_SHG)), block 256, static shared memory only.
extern "C" __global__ void __launch_bounds__(256) attention_chunk_scores(
    const __nv_bfloat16* __restrict__ qa,     // [T, H, R] bf16
    const __nv_bfloat16* __restrict__ store,  // [N, R] bf16
    const int* __restrict__ rows,             // [T, W] i32 store row ids or positions (pt > 0), -1 padded
    const int* __restrict__ table,            // [S, width] i32 each segment's page table (pt > 0, attention_rows.cuh)
    const int* __restrict__ seg,              // [T] i32 row t's segment, its row of table (pt > 0)
    const int* __restrict__ counts,           // [T] i32 ids used per row
    float* __restrict__ s,                    // [T, H, W] f32 scores (entries < counts[t] written)
    float* __restrict__ cm,                   // [T, H, C * tpc] f32 tile max (tiles of chunks inside counts[t])
    unsigned int* __restrict__ done,          // [T, nd] u32 finished pv blocks per (head group, slice): zeroed here
    int T, int H, int R, int W, int C, float scale, int chunk, int width, int pt, int nd) {
  __shared__ __align__(16) float qs[ATT_SHG][ATT_SRS + ATT_SPAD];   // the group's queries, one slice
  __shared__ __align__(16) float ks[ATT_SKT][ATT_SRS + ATT_SPAD];   // the tile's latent rows, one slice
  __shared__ float sp[ATT_SHG][ATT_SKT];                            // the tile's scores
  __shared__ int kid[ATT_SKT];                                      // store rows of the tile's keys
  const int t = blockIdx.x, h0 = blockIdx.z * ATT_SHG, tid = threadIdx.x;
  const int tpc = ceil_div(chunk, ATT_SKT), ct = C * tpc;
  const int c = blockIdx.y / tpc, k0 = c * chunk + (blockIdx.y % tpc) * ATT_SKT;
  if (blockIdx.y == 0 && blockIdx.z == 0)
    for (int i = tid; i < nd; i += blockDim.x) done[(long long)t * nd + i] = 0u;   // before the pv kernel runs
  const int count = counts[t];
  if (c * chunk >= count) return;                              // a chunk the pv kernel never reads
  const int nk = min(ATT_SKT, min(c * chunk + chunk, count) - k0);
  const int nh = min(ATT_SHG, H - h0);
  if (nk <= 0) {                                               // a tile past the count inside a read chunk
    if (tid < nh) cm[((long long)t * H + h0 + tid) * ct + blockIdx.y] = -INFINITY;
    return;
  }
  if (tid < nk) kid[tid] = att_store_row(rows, table, seg, T, t, W, k0 + tid, width, pt);
  const int qd = tid >> 2, b = tid & 3;
  const int hs = qd / (ATT_SKT / ATT_SNK) * ATT_SNH, js = qd % (ATT_SKT / ATT_SNK) * ATT_SNK;
  float acc[ATT_SNH][ATT_SNK][4];                              // lanes 4 b .. 4 b + 3 of each dot
#pragma unroll
  for (int h = 0; h < ATT_SNH; ++h)
#pragma unroll
    for (int j = 0; j < ATT_SNK; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[h][j][e] = 0.0f;
  for (int r0 = 0; r0 < R; r0 += ATT_SRS) {
    const int rn = min(ATT_SRS, R - r0), rp = (rn + 15) & ~15;  // whole lane groups, zeros past R
    __syncthreads();                                           // kid written; the previous slice no longer read
    att_stage(qs, ks, qa, store, kid, (long long)t * H + h0, nh, nk, R, r0, rn, rp);
    __syncthreads();
#pragma unroll 2
    for (int r = 4 * b; r < rp; r += 16) {
      float4 q[ATT_SNH], k[ATT_SNK];
#pragma unroll
      for (int h = 0; h < ATT_SNH; ++h) q[h] = *reinterpret_cast<const float4*>(&qs[hs + h][r]);
#pragma unroll
      for (int j = 0; j < ATT_SNK; ++j) k[j] = *reinterpret_cast<const float4*>(&ks[js + j][r]);
#pragma unroll
      for (int h = 0; h < ATT_SNH; ++h)
#pragma unroll
        for (int j = 0; j < ATT_SNK; ++j) {
          acc[h][j][0] = acc[h][j][0] + q[h].x * k[j].x;
          acc[h][j][1] = acc[h][j][1] + q[h].y * k[j].y;
          acc[h][j][2] = acc[h][j][2] + q[h].z * k[j].z;
          acc[h][j][3] = acc[h][j][3] + q[h].w * k[j].w;
        }
    }
  }
#pragma unroll
  for (int h = 0; h < ATT_SNH; ++h)
#pragma unroll
    for (int j = 0; j < ATT_SNK; ++j) {
      float* a = acc[h][j];
#pragma unroll
      for (int e = 0; e < 4; ++e) a[e] += __shfl_xor_sync(FULL_MASK, a[e], 2);   // lane i += lane i + 8
#pragma unroll
      for (int e = 0; e < 4; ++e) a[e] += __shfl_xor_sync(FULL_MASK, a[e], 1);   // lane i += lane i + 4
      a[0] = a[0] + a[2];
      a[1] = a[1] + a[3];
      if (b == 0) sp[hs + h][js + j] = (a[0] + a[1]) * scale;
    }
  __syncthreads();
  const int warp = tid >> 5, wl = tid & 31;
#pragma unroll
  for (int u = 0; u < ATT_SHG / 8; ++u) {                      // warp: heads warp, warp + 8: tile max, scores out
    const int hh = warp + 8 * u;
    const long long th = (long long)t * H + h0 + hh;
    const bool on = hh < nh && wl < nk;
    const float v = on ? sp[hh][wl] : -INFINITY;
    if (on) s[th * W + k0 + wl] = v;
    const float mx = warp_max(v);                              // every lane of every warp (convergent)
    if (hh < nh && wl == 0) cm[th * ct + blockIdx.y] = mx;
  }
}

// The running max of (t, head th) after chunk c by one warp: fmaxf from -inf over the tile maxima of chunks 0..c
// (lanes stride the tiles, then warp_max: a max is exact in any grouping).  Every lane of the warp calls it.
static __device__ __forceinline__ float att_run_max(const float* __restrict__ cm, long long th, int ct, int tpc,
                                                    int c, bool on) {
  float m = -INFINITY;
  if (on)
    for (int y = threadIdx.x & 31; y < (c + 1) * tpc; y += 32) m = fmaxf(m, cm[th * ct + y]);
  return warp_max(m);
}

// The chunks of (t, heads h0..h0+nh-1, columns r0..r0+ATT_PRB-1) merged in list order; ps and pv are read through
// volatile (other blocks wrote them in this launch: no stale cached copy).
static __device__ void att_merge(const float* __restrict__ cm, const float* ps, const float* pv,
                                 __nv_bfloat16* __restrict__ out, int count, int t, int h0, int nh, int r0, int rs,
                                 int rsl, int H, int R, int C, int chunk, int tpc) {
  const volatile float* vps = ps;
  const volatile float* vpv = pv;
  const int ct = C * tpc;
  for (int i = threadIdx.x; i < nh * ATT_PRB; i += blockDim.x) {
    const int hh = i / ATT_PRB, r = r0 + i % ATT_PRB;
    if (r >= R) continue;
    const long long th = (long long)t * H + h0 + hh;
    const long long pr = ((long long)t * rsl + rs) * H + h0 + hh;   // row of ps
    float m = -INFINITY, l = 0.0f, o = 0.0f;
    for (int c = 0; c * chunk < count; ++c) {
      float cmax = -INFINITY;
      for (int y = c * tpc; y < (c + 1) * tpc; ++y) cmax = fmaxf(cmax, cm[th * ct + y]);
      const float m_new = fmaxf(m, cmax);
      const float alpha = exp_f32(m - m_new);
      l = l * alpha + vps[pr * C + c];
      o = o * alpha + vpv[(th * C + c) * R + r];
      m = m_new;
    }
    out[th * R + r] = to_bf16(o / l);
  }
}

// grid (T, C, ceil(H / ATT_PHG) * RSL), block 256 (8 warps: one a head for the running max). Dynamic shared memory:
// chunk * ATT_PHG floats (P) + chunk pointers (the keys' latent rows).
extern "C" __global__ void __launch_bounds__(256) attention_chunk_pv(
    const __nv_bfloat16* __restrict__ store,  // [N, R] bf16
    const int* __restrict__ rows,             // [T, W] i32 (as the scores kernel's)
    const int* __restrict__ table,            // [S, width] i32 (as the scores kernel's)
    const int* __restrict__ seg,              // [T] i32
    const int* __restrict__ counts,           // [T] i32
    const float* __restrict__ s,              // [T, H, W] f32 scores
    const float* __restrict__ cm,             // [T, H, C * tpc] f32 tile max
    float* ps,                                // [T, RSL, H, C] f32 lane-16 sum of the chunk's P (read by the merge)
    float* pv,                                // [T, H, C, R] f32 the chunk's P.V (read by the merge)
    unsigned int* __restrict__ done,          // [T, G * RSL] u32 finished blocks per (t, z), zero on entry
    __nv_bfloat16* __restrict__ out,          // [T, H, R] bf16
    int T, int H, int R, int W, int C, int chunk, int width, int pt) {
  extern __shared__ __align__(16) float att_pv_sh[];
  float* p = att_pv_sh;                                        // [chunk, ATT_PHG] P (bf16 values), key-major
  const __nv_bfloat16** krow = (const __nv_bfloat16**)(att_pv_sh + ATT_PHG * chunk);   // [chunk] keys' rows
  __shared__ float mrun[ATT_PHG];                              // the running max after chunk c, per head
  __shared__ unsigned int last;                                // this block finished (t, z) last
  const int rsl = ceil_div(R, ATT_PRB), tpc = ceil_div(chunk, ATT_SKT);
  const int t = blockIdx.x, c = blockIdx.y, rs = blockIdx.z % rsl;
  const int h0 = blockIdx.z / rsl * ATT_PHG, r0 = rs * ATT_PRB;
  const int count = counts[t];
  const int c0 = c * chunk;
  const int nh = min(ATT_PHG, H - h0);
  if (c0 >= count) {
    if (c == 0) att_merge(cm, ps, pv, out, count, t, h0, nh, r0, rs, rsl, H, R, C, chunk, tpc);   // empty: o / l
    return;
  }
  const int n = min(chunk, count - c0);
  const int tid = threadIdx.x;
  for (int j = tid; j < n; j += blockDim.x)
    krow[j] = store + (long long)att_store_row(rows, table, seg, T, t, W, c0 + j, width, pt) * R;
  {                                                            // warp hh: head hh's running max (8 warps, 8 heads)
    const int hh = tid >> 5;
    const float m = att_run_max(cm, (long long)t * H + h0 + hh, C * tpc, tpc, c, hh < nh);
    if (hh < nh && (tid & 31) == 0) mrun[hh] = m;
  }
  __syncthreads();
  for (int i = tid; i < ATT_PHG * n; i += blockDim.x) {
    const int hh = i / n, j = i % n;
    p[j * ATT_PHG + hh] = hh < nh ? bf16_round(exp_f32(s[((long long)t * H + h0 + hh) * W + c0 + j] - mrun[hh])) : 0.0f;
  }
  __syncthreads();
  const int lane = tid & 15, grp = tid >> 4;
  {                                                            // group hh: the lane-16 sum of head hh's P
    float a = 0.0f;
    if (grp < nh)
      for (int j = lane; j < n; j += 16) a += p[j * ATT_PHG + grp];
    a = lane16_fold(a);                                        // every warp whole (full-mask shuffles)
    if (grp < nh && lane == 0) ps[(((long long)t * rsl + rs) * H + h0 + grp) * C + c] = a;
  }
  const int r = r0 + grp * 4;
  float a[ATT_PHG][4];                                         // lane `lane` of each (head, column)
#pragma unroll
  for (int hh = 0; hh < ATT_PHG; ++hh)
#pragma unroll
    for (int e = 0; e < 4; ++e) a[hh][e] = 0.0f;
  if (r < R) {
    const float* pj = p + lane * ATT_PHG;
#pragma unroll 2
    for (int j = lane; j < n; j += 16, pj += 16 * ATT_PHG) {   // the lane's keys in increasing order
      const uint2 w = __ldg(reinterpret_cast<const uint2*>(krow[j] + r));   // a global load (LDG)
      const float v[4] = {__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                          __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u)};
      const float4 p0 = *reinterpret_cast<const float4*>(pj);
      const float4 p1 = *reinterpret_cast<const float4*>(pj + 4);
      const float ph[ATT_PHG] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
      for (int hh = 0; hh < ATT_PHG; ++hh)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[hh][e] = a[hh][e] + ph[hh] * v[e];
    }
  }
#pragma unroll
  for (int hh = 0; hh < ATT_PHG; ++hh)
#pragma unroll
    for (int e = 0; e < 4; ++e) a[hh][e] = lane16_fold(a[hh][e]);   // every warp whole
  if (r < R && lane < nh) {                                    // lane hh writes head hh's four columns
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int hh = 0; hh < ATT_PHG; ++hh)
      if (hh == lane) o = make_float4(a[hh][0], a[hh][1], a[hh][2], a[hh][3]);
    *reinterpret_cast<float4*>(&pv[(((long long)t * H + h0 + lane) * C + c) * R + r]) = o;
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
  att_merge(cm, ps, pv, out, count, t, h0, nh, r0, rs, rsl, H, R, C, chunk, tpc);
}
