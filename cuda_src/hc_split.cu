// hc_split.cu -- the decode form of hc_post_pre_norm (hc.cu): one sublayer's hc_post and the next hc_pre_norm in
// two launches whose blocks spread a row's mix dots over the GPU, the bits of hc.cu's one block a row.
//   hc_post_split  hc_post (grid (T, ceil(D / blockDim.x))), and block (t, 0) zeroes row t's ticket.
//   hc_mix_norm    grid (T, ceil((NM + 1) / HC_MIX_OUTS)), HC_MIX_THREADS threads: block (t, b) stages chunks of
//                  the streams X'[t] and of its fn rows through shared memory (16-byte loads, the next chunk's in
//                  flight while the current one is summed) and warp 0 sums dots o = b * HC_MIX_OUTS + (lane >> 4)
//                  in lane-16 order (lane k % 16 adds term k in increasing k from +0.0; output NM is the sum of
//                  squares), folded as lane16_fold; the stage holds floats lane-major, so a lane reads 4 terms
//                  a load.  The block that finishes row t last (a ticket, __threadfence before it, volatile reads
//                  after) reads the row's dots and runs hc.cu's tail: the gates (hc_gates), the collapse and the
//                  RMSNorm.  The dots do not depend on which block is last.
// Reference: NumpyOps.hc_post_pre_norm (cupyglm/backend/numpy_ops.py).  Planted control CONTROL_HC_FIRST_DONE:
// the row's first block runs the tail (before the others' dots are written).
#include "hc_row.cuh"

#define HC_MIX_OUTS 2          // dots a block: 16 lanes each, one warp
#define HC_MIX_THREADS 256
#define HC_MIX_CHUNK 4096      // k of one staged chunk
#define HC_MIX_STEPS (HC_MIX_CHUNK / 16)                               // a lane's terms a chunk
#define HC_MIX_PITCH (HC_MIX_STEPS + 4)                                // floats a staged lane (16-byte rows)
#define HC_MIX_ROWS (HC_MIX_OUTS + 1)                                  // staged rows: the fn rows, then X'
#define HC_MIX_VECS (HC_MIX_ROWS * HC_MIX_CHUNK / 8 / HC_MIX_THREADS)   // 16-byte vectors a thread stages

extern "C" __global__ void hc_post_split(const __nv_bfloat16* __restrict__ X,   // [T, S, D] bf16
                                         const float* __restrict__ branch,      // [ranks, T, D] f32 (summed)
                                         const float* __restrict__ post,        // [T, S] f32
                                         const float* __restrict__ comb,        // [T, S, S] f32
                                         __nv_bfloat16* __restrict__ out,       // [T, S, D] bf16: X'
                                         unsigned int* __restrict__ tickets,    // [T] zeroed here
                                         int T, int S, int D, int ranks) {
  const int d = blockIdx.y * blockDim.x + threadIdx.x;
  if (blockIdx.y == 0 && threadIdx.x == 0) tickets[blockIdx.x] = 0u;
  if (d < D) hc_post_at(X, branch, post, comb, out, blockIdx.x, T, S, D, d, ranks);
}

// Staged row r's vector v of chunk k0 (8 bf16 from k0 + 8v; zeros past K): rows 0 .. HC_MIX_OUTS - 1 the block's
// fn rows (zeros past NM), the last X'[t].
static __device__ __forceinline__ uint4 hc_mix_load(const __nv_bfloat16* __restrict__ fn,
                                                    const __nv_bfloat16* xr, int o0, int NM, int K, int k0,
                                                    int r, int v) {
  const int k = k0 + 8 * v;
  const bool x = r == HC_MIX_OUTS;
  if (k >= K || (!x && o0 + r >= NM)) return make_uint4(0u, 0u, 0u, 0u);
  const __nv_bfloat16* p = x ? xr + k : fn + (long long)(o0 + r) * K + k;
  return *reinterpret_cast<const uint4*>(p);
}

static __device__ __forceinline__ void hc_mix_fetch(uint4 (&v)[HC_MIX_VECS], const __nv_bfloat16* __restrict__ fn,
                                                    const __nv_bfloat16* xr, int o0, int NM, int K, int k0) {
#pragma unroll
  for (int m = 0; m < HC_MIX_VECS; ++m) {
    const int i = threadIdx.x + m * HC_MIX_THREADS;
    v[m] = hc_mix_load(fn, xr, o0, NM, K, k0, i / (HC_MIX_CHUNK / 8), i % (HC_MIX_CHUNK / 8));
  }
}

// The fetched vectors into the stage as floats, lane-major: term k0 + 16i + j at stage[row][j][i].
static __device__ __forceinline__ void hc_mix_store(float* stage, const uint4 (&v)[HC_MIX_VECS]) {
#pragma unroll
  for (int m = 0; m < HC_MIX_VECS; ++m) {
    const int i = threadIdx.x + m * HC_MIX_THREADS;
    const int r = i / (HC_MIX_CHUNK / 8), e = 8 * (i % (HC_MIX_CHUNK / 8));
    float* row = stage + (r * 16 + (e & 15)) * HC_MIX_PITCH + (e >> 4);
    const unsigned w[4] = {v[m].x, v[m].y, v[m].z, v[m].w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      row[(2 * q) * HC_MIX_PITCH] = __uint_as_float(w[q] << 16);
      row[(2 * q + 1) * HC_MIX_PITCH] = __uint_as_float(w[q] & 0xffff0000u);
    }
  }
}

// A lane's running sum over its staged terms (n, a multiple of 4), continued in increasing k; the staged zeros past
// K add +0.0 to a sum that started at +0.0, which changes no bit.
static __device__ __forceinline__ float hc_mix_lane(const float* ws, const float* xs, int n, float acc) {
  for (int i = 0; i < n; i += 4) {
    const float4 xv = *reinterpret_cast<const float4*>(xs + i);
    const float4 wv = *reinterpret_cast<const float4*>(ws + i);
    acc += xv.x * wv.x;
    acc += xv.y * wv.y;
    acc += xv.z * wv.z;
    acc += xv.w * wv.w;
  }
  return acc;
}

// X' [T, S, D] bf16 as hc_post_split wrote it (K = S * D, K % 8 == 0, fn 16-byte aligned: the launcher).  Dynamic
// shared memory: the stage (HC_MIX_ROWS x 16 x HC_MIX_PITCH floats), then the collapsed row (D floats).
extern "C" __global__ void __launch_bounds__(HC_MIX_THREADS)
hc_mix_norm(const __nv_bfloat16* X,                      // [T, S, D] bf16: X'
            const __nv_bfloat16* __restrict__ fn,        // [NM, S*D] bf16
            const float* __restrict__ base,              // [NM] fp32 (stored F32)
            const float* __restrict__ scale,             // [3] fp32 (stored F32)
            const __nv_bfloat16* __restrict__ norm_w,    // [D] bf16
            float* dots,                                 // [T, NM + 1] f32 scratch: the row's dots
            unsigned int* __restrict__ tickets,          // [T] zero at launch (hc_post_split)
            __nv_bfloat16* __restrict__ x_out,           // [T, D] bf16
            __nv_bfloat16* __restrict__ h_out,           // [T, D] bf16
            float* __restrict__ post_out,                // [T, S] f32
            float* __restrict__ comb_out,                // [T, S, S] f32
            int T, int S, int D, float norm_eps, float hc_eps, int iters) {
  extern __shared__ __align__(16) float hc_smem[];
  float* stage = hc_smem;                                                      // [rows][16 lanes][pitch]
  float* xs = hc_smem + HC_MIX_ROWS * 16 * HC_MIX_PITCH;                       // [D] the collapsed row
  __shared__ float hc_sh[HC_MAX_S * (HC_MAX_S + 2) + 1 + HC_MAX_S];           // dots, sum of squares, pre
  __shared__ int last;
  const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 15;
  const int NM = S * (S + 2), K = S * D;
  const int o0 = blockIdx.y * HC_MIX_OUTS;
  const int o = o0 + (tid >> 4);
  const __nv_bfloat16* xr = X + (long long)t * K;
  const float* ws = stage + ((o == NM ? HC_MIX_OUTS : (tid >> 4) % HC_MIX_OUTS) * 16 + lane) * HC_MIX_PITCH;
  const float* xl = stage + (HC_MIX_OUTS * 16 + lane) * HC_MIX_PITCH;
  uint4 v[HC_MIX_VECS];
  hc_mix_fetch(v, fn, xr, o0, NM, K, 0);
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += HC_MIX_CHUNK) {
    __syncthreads();                                  // the last chunk's sums are done with the stage
    hc_mix_store(stage, v);
    __syncthreads();
    if (k0 + HC_MIX_CHUNK < K) hc_mix_fetch(v, fn, xr, o0, NM, K, k0 + HC_MIX_CHUNK);
    const int n = min(HC_MIX_STEPS, ((K - k0 + 15) / 16 + 3) & ~3);
    if (tid < 32 && o <= NM) acc = hc_mix_lane(ws, xl, n, acc);
  }
  if (tid < 32) {
    acc = lane16_fold(acc);
    if (lane == 0 && o <= NM) dots[(long long)t * (NM + 1) + o] = acc;
  }
  __threadfence();                                    // this block's dots are visible before its ticket
  __syncthreads();
#ifdef CONTROL_HC_FIRST_DONE
  if (tid == 0) last = atomicAdd(&tickets[t], 1u) == 0u;
#else
  if (tid == 0) last = atomicAdd(&tickets[t], 1u) == gridDim.y - 1;
#endif
  __syncthreads();
  if (!last) return;                                  // block-uniform
  __threadfence();
  const volatile float* dv = dots + (long long)t * (NM + 1);
  for (int i = tid; i <= NM; i += blockDim.x) hc_sh[i] = dv[i];
  __syncthreads();
  hc_gates(hc_sh, base, scale, post_out, comb_out, t, S, K, norm_eps, hc_eps, iters);
  __syncthreads();
  hc_collapse(xr, hc_sh + NM + 1, x_out, xs, t, S, D);
  __syncthreads();
  const HcRowShared rd{xs};
  rmsnorm_row(rd, norm_w, h_out + (long long)t * D, D, norm_eps);
}
