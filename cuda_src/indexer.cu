// indexer.cu -- DSA indexer: pooled keys of complete pools (index_pool) and the score of every pool for every
// row (index_scores).  Reference: NumpyOps.index_pool / index_scores in cupyglm/backend/numpy_ops.py; the
// dots over the index head dimension and the sum over heads run in lane-16 order, the 4 pool members left to
// right.  Storage: float arrays holding bf16 values.
#include "common.cuh"
#include "exp_f32.cuh"

#define IDX_MAX_KPOOL 8  // index_pool: pool members <= 8 (the model has 4)

// Per pool p and channel d: l_j = ig[p, j, d] + ape[j, d]; e_j = exp(l_j - max l);
// s = ((e0 + e1) + e2) + e3; pk = bf16(sum_j bf16(bf16(e_j / s) * ik[p, j, d])), j left to right.
// One thread per (p, d).
extern "C" __global__ void index_pool(const float* __restrict__ ik,   // [P, KP, I] f32 (bf16 values)
                                      const float* __restrict__ ig,   // [P, KP, I] f32 (bf16 values)
                                      const float* __restrict__ ape,  // [KP, I] f32 (bf16 values)
                                      float* __restrict__ pk,         // [P, I] f32 (bf16 values)
                                      int P, int KP, int I) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)P * I) return;
  const long long p = i / I;
  const int d = (int)(i % I);
  float l[IDX_MAX_KPOOL];
  float m = 0.0f;
  for (int j = 0; j < KP; ++j) {
    l[j] = ig[(p * KP + j) * I + d] + ape[(long long)j * I + d];
    m = (j == 0 || l[j] > m) ? l[j] : m;
  }
  float s = 0.0f;
  for (int j = 0; j < KP; ++j) {
    l[j] = exp_f32(l[j] - m);
    s = (j == 0) ? l[j] : s + l[j];
  }
  float acc = 0.0f;
  for (int j = 0; j < KP; ++j) {
    const float tj = bf16_round(bf16_round(l[j] / s) * ik[(p * KP + j) * I + d]);
    acc = (j == 0) ? tj : acc + tj;
  }
  pk[i] = bf16_round(acc);
}

// scores[t, p] = sum_h hw[t, h] * relu(qscale * (qi[t, h] . pk[p])), heads summed in lane-16 order (head h
// in lane h % 16), each dot over I in lane-16 order (16 partials per thread, folded 8, 4, 2, 1).
// A group of 16 threads per pool: lane l computes the dots of heads l, l+16, ...; the group folds.
// grid (ceil(P / (blockDim.x / 16)), T); blockDim.x a multiple of 32.
extern "C" __global__ void index_scores(const float* __restrict__ qi,  // [T, Hi, I] f32 (bf16 values)
                                        const float* __restrict__ hw,  // [T, Hi] f32
                                        const float* __restrict__ pk,  // [P, I] f32 (bf16 values)
                                        float* __restrict__ scores,    // [T, P] f32
                                        int T, int Hi, int I, int P, float qscale) {
  const int t = blockIdx.y;
  const int p = blockIdx.x * (blockDim.x >> 4) + (threadIdx.x >> 4);
  const int lane = threadIdx.x & 15;
  float acc = 0.0f;
  if (p < P) {
    const float* kr = pk + (long long)p * I;
    for (int h = lane; h < Hi; h += 16) {
      const float* qr = qi + ((long long)t * Hi + h) * I;
      float a[16];
#pragma unroll
      for (int m = 0; m < 16; ++m) a[m] = 0.0f;
      for (int k0 = 0; k0 < I; k0 += 16) {
#pragma unroll
        for (int m = 0; m < 16; ++m)
          if (k0 + m < I) a[m] += qr[k0 + m] * kr[k0 + m];
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
