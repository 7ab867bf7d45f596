// rank_sum.cu -- a collective's rank-order sum in one kernel (cupyglm/backend/lanes.py rank_sum, the reference).
//
// parts [R, n] are the ranks' partials as gathered (rank r at row r); out[i] = ((p0[i] + p1[i]) + p2[i]) + ...,
// added left to right in the parts' dtype: fp32 adds, or bf16 rounded after every add as ml_dtypes does (both
// values widened to fp32, added, rounded to nearest even). Each element is its own chain, so any grid gives the
// same bits whatever the grid; a grid-stride loop over the elements.
// Planted controls (the contract): RANK_SUM_PLANT_REVERSED adds the ranks from the last down;
// RANK_SUM_PLANT_DROP_LAST leaves out the last rank.
#include "common.cuh"

#if defined(RANK_SUM_PLANT_REVERSED)
#define RANK_AT(j) (ranks - 1 - (j))
#else
#define RANK_AT(j) (j)
#endif
#if defined(RANK_SUM_PLANT_DROP_LAST)
#define RANKS_ADDED (ranks - 1)
#else
#define RANKS_ADDED ranks
#endif

extern "C" __global__ void rank_sum_f32(const float* __restrict__ parts,   // [ranks, n] fp32
                                        float* __restrict__ out,           // [n] fp32
                                        int ranks, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float acc = parts[(long long)RANK_AT(0) * n + i];
    for (int j = 1; j < RANKS_ADDED; ++j) acc = acc + parts[(long long)RANK_AT(j) * n + i];
    out[i] = acc;
  }
}

extern "C" __global__ void rank_sum_bf16(const __nv_bfloat16* __restrict__ parts,   // [ranks, n] bf16
                                         __nv_bfloat16* __restrict__ out,           // [n] bf16
                                         int ranks, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float acc = ld_bf16(parts, (long long)RANK_AT(0) * n + i);
    for (int j = 1; j < RANKS_ADDED; ++j) acc = bf16_round(acc + ld_bf16(parts, (long long)RANK_AT(j) * n + i));
    out[i] = to_bf16(acc);
  }
}
