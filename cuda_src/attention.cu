// attention.cu -- absorbed MLA attention over latent rows read through row ids (keys equal values).
// Reference: NumpyOps.attention in cupyglm/backend/numpy_ops.py (and attention_paged: the lists as positions
// mapped through each row's segment's page table, attention_rows.cuh).  Each (row, head) is computed alone by one
// block: online softmax over `chunk`-key chunks of the row's list, merged in list order; fp32 m, l, o; P
// rounded to bf16 before P.V and before the sum l; every sum (the q.k dot over R, the sum of P, P.V over the
// chunk's keys) in lane-16 order.  Only the first counts[t] ids of a row are ever read, and only those store
// rows: the rest of the store may hold anything (tests fill it with NaN).  Storage: qa, the store (latent rows)
// and out are bf16; m, l, o and the scores fp32.
#include "common.cuh"
#include "exp_f32.cuh"
#include "attention_rows.cuh"

#define ATT_MAX_RT 8  // R <= 8 * blockDim.x output columns per thread

// grid (T, H): tokens on grid.x (2^31 - 1), heads on y; blockDim.x a multiple of 32 with R <= ATT_MAX_RT * blockDim.x.
// Dynamic shared memory: chunk floats (scores, then P) + chunk ints (row ids) + 1 float (running max).
extern "C" __global__ void attention(const __nv_bfloat16* __restrict__ qa,     // [T, H, R] bf16
                                     const __nv_bfloat16* __restrict__ store,  // [N, R] bf16
                                     const int* __restrict__ rows,             // [T, W] i32 row ids or positions
                                     const int* __restrict__ table,            // [S, width] i32 page tables (pt > 0)
                                     const int* __restrict__ seg,              // [T] i32 row t's table row (pt > 0)
                                     const int* __restrict__ counts,           // [T] i32 ids used per row
                                     __nv_bfloat16* __restrict__ out,          // [T, H, R] bf16
                                     int T, int H, int R, int W, float scale, int chunk, int width, int pt) {
  extern __shared__ float att_sh[];
  float* sp = att_sh;                          // [chunk] scores, then P (bf16 values)
  int* ids = (int*)(att_sh + chunk);           // [chunk] row ids of the chunk
  float* m_sh = att_sh + 2 * chunk;            // [1] max of the chunk merged with the running max
  const int t = blockIdx.x;
  const int h = blockIdx.y;
  const int tid = threadIdx.x;
  const int lane = tid & 15;
  const int groups = blockDim.x >> 4;
  const __nv_bfloat16* q = qa + ((long long)t * H + h) * R;
  const int count = counts[t];

  float m = -INFINITY, l = 0.0f;
  float o[ATT_MAX_RT];
#pragma unroll
  for (int c = 0; c < ATT_MAX_RT; ++c) o[c] = 0.0f;

  for (int c0 = 0; c0 < count; c0 += chunk) {
    const int n = min(chunk, count - c0);
    for (int j = tid; j < n; j += blockDim.x) ids[j] = att_store_row(rows, table, seg, T, t, W, c0 + j, width, pt);
    __syncthreads();
    // Scores: a group of 16 threads per key; rounds are block-uniform so the shuffles stay convergent.
    for (int j0 = 0; j0 < n; j0 += groups) {
      const int j = j0 + (tid >> 4);
      float acc = 0.0f;
      if (j < n) {
        const __nv_bfloat16* kr = store + (long long)ids[j] * R;
        for (int r = lane; r < R; r += 16) acc += ld_bf16(q, r) * ld_bf16(kr, r);
      }
      acc = lane16_fold(acc);
      if (j < n && lane == 0) sp[j] = acc * scale;
    }
    __syncthreads();
    if (tid < 32) {  // warp 0: the chunk max merged with the running max (exact in any order)
      float mx = m;
      for (int j = tid; j < n; j += 32) mx = fmaxf(mx, sp[j]);
      mx = warp_max(mx);
      if (tid == 0) *m_sh = mx;
    }
    __syncthreads();
    const float m_new = *m_sh;
    for (int j = tid; j < n; j += blockDim.x) sp[j] = bf16_round(exp_f32(sp[j] - m_new));
    __syncthreads();
    const float alpha = exp_f32(m - m_new);
    // l = l * alpha + sum(P): every group computes the lane-16 sum (same bits everywhere, no barrier).
    float ps = 0.0f;
    for (int j = lane; j < n; j += 16) ps += sp[j];
    ps = lane16_fold(ps);
    l = l * alpha + ps;
    // o = o * alpha + P.V: one thread per output column, 16 partials (key j in partial j % 16), folded.
#pragma unroll
    for (int c = 0; c < ATT_MAX_RT; ++c) {
      const int r = tid + c * blockDim.x;
      if (r < R) {
        float a[16];
#pragma unroll
        for (int u = 0; u < 16; ++u) a[u] = 0.0f;
        for (int j0 = 0; j0 < n; j0 += 16) {
#pragma unroll
          for (int u = 0; u < 16; ++u)
            if (j0 + u < n) a[u] += sp[j0 + u] * ld_bf16(store, (long long)ids[j0 + u] * R + r);
        }
#pragma unroll
        for (int w = 8; w > 0; w >>= 1)
#pragma unroll
          for (int u = 0; u < w; ++u) a[u] = a[u] + a[u + w];
        o[c] = o[c] * alpha + a[0];
      }
    }
    m = m_new;
    __syncthreads();  // sp / ids are rewritten by the next chunk
  }
#pragma unroll
  for (int c = 0; c < ATT_MAX_RT; ++c) {
    const int r = tid + c * blockDim.x;
    if (r < R) out[((long long)t * H + h) * R + r] = to_bf16(o[c] / l);
  }
}
