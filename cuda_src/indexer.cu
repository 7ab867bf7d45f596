// indexer.cu -- DSA indexer: pooled keys of complete pools (index_pool) and the score of every pool for every
// row (index_scores).  Reference: NumpyOps.index_pool / index_scores in cupyglm/backend/numpy_ops.py; the
// dots over the index head dimension and the sum over heads run in lane-16 order, the 4 pool members left to
// right.  Storage: index keys, gates, ape, pooled keys and index queries are bf16; head weights and scores fp32.
#include "common.cuh"
#include "exp_f32.cuh"

#define IDX_MAX_KPOOL 8  // index_pool: pool members <= 8 (the model has 4)

// Per pool p and channel d: l_j = ig[p, j, d] + ape[j, d]; e_j = exp(l_j - max l);
// s = ((e0 + e1) + e2) + e3; pk = bf16(sum_j bf16(bf16(e_j / s) * ik[p, j, d])), j left to right.
// One thread per (p, d).
extern "C" __global__ void index_pool(const __nv_bfloat16* __restrict__ ik,   // [P, KP, I] bf16
                                      const __nv_bfloat16* __restrict__ ig,   // [P, KP, I] bf16
                                      const __nv_bfloat16* __restrict__ ape,  // [KP, I] bf16
                                      __nv_bfloat16* __restrict__ pk,         // [P, I] bf16
                                      int P, int KP, int I) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)P * I) return;
  const long long p = i / I;
  const int d = (int)(i % I);
  float l[IDX_MAX_KPOOL];
  float m = 0.0f;
  for (int j = 0; j < KP; ++j) {
    l[j] = ld_bf16(ig, (p * KP + j) * I + d) + ld_bf16(ape, (long long)j * I + d);
    m = (j == 0 || l[j] > m) ? l[j] : m;
  }
  float s = 0.0f;
  for (int j = 0; j < KP; ++j) {
    l[j] = exp_f32(l[j] - m);
    s = (j == 0) ? l[j] : s + l[j];
  }
  float acc = 0.0f;
  for (int j = 0; j < KP; ++j) {
    const float tj = bf16_round(bf16_round(l[j] / s) * ld_bf16(ik, (p * KP + j) * I + d));
    acc = (j == 0) ? tj : acc + tj;
  }
  pk[i] = to_bf16(acc);
}

// scores[t, p] = sum_h hw[t, h] * relu(qscale * (qi[t, h] . pk[p])), heads summed in lane-16 order (head h
// in lane h % 16), each dot over I in lane-16 order (16 partials per thread, folded 8, 4, 2, 1).
// A group of 16 threads per pool: lane l computes the dots of heads l, l+16, ...; the group folds.
// grid (T * ceil(P / (blockDim.x / 16))): one flat grid.x (2^31 - 1) over (token, pool block), so neither the
// token count nor the pool count meets grid.y's 65,535 limit; blockDim.x a multiple of 32.
extern "C" __global__ void index_scores(const __nv_bfloat16* __restrict__ qi,  // [T, Hi, I] bf16
                                        const float* __restrict__ hw,          // [T, Hi] f32
                                        const __nv_bfloat16* __restrict__ pk,  // [P, I] bf16
                                        float* __restrict__ scores,            // [T, P] f32
                                        int T, int Hi, int I, int P, float qscale) {
  const int per_block = blockDim.x >> 4;
  const int pblocks = (P + per_block - 1) / per_block;
  const int t = (int)(blockIdx.x / pblocks);
  const int p = (int)(blockIdx.x % pblocks) * per_block + (threadIdx.x >> 4);
  const int lane = threadIdx.x & 15;
  float acc = 0.0f;
  if (p < P) {
    const __nv_bfloat16* kr = pk + (long long)p * I;
    for (int h = lane; h < Hi; h += 16) {
      const __nv_bfloat16* qr = qi + ((long long)t * Hi + h) * I;
      float a[16];
#pragma unroll
      for (int m = 0; m < 16; ++m) a[m] = 0.0f;
      for (int k0 = 0; k0 < I; k0 += 16) {
#pragma unroll
        for (int m = 0; m < 16; ++m)
          if (k0 + m < I) a[m] += ld_bf16(qr, k0 + m) * ld_bf16(kr, k0 + m);
      }
#pragma unroll
      for (int w = 8; w > 0; w >>= 1)
#pragma unroll
        for (int m = 0; m < w; ++m) a[m] = a[m] + a[m + w];
      float z = a[0] * qscale;
      z = (z < 0.0f) ? 0.0f : z;  // np.maximum(z, 0): NaN stays NaN
      acc += z * hw[(long long)t * Hi + h];
    }
  }
  acc = lane16_fold(acc);
  if (p < P && lane == 0) scores[(long long)t * P + p] = acc;
}
